//! The ops box: the Debian package (`cargo deb`), inspected with `dpkg-deb`; its unit checked
//! by `systemd-analyze verify`; the man pages rendered by `man`; the bash completion loaded by
//! bash; the env file and the generated files checked against the clap definitions.
//!
//! The tools are real and required: a missing one fails with the command that installs it
//! (`.ci/run` installs them on a fresh machine).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const BIN: &str = env!("CARGO_BIN_EXE_claimgate");

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a tool, failing the test with `install` when it is not there.
fn tool(cmd: &mut Command, install: &str) -> Output {
    cmd.output().unwrap_or_else(|e| {
        panic!(
            "{:?} could not run ({e}); install it: {install}",
            cmd.get_program()
        )
    })
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The package, built once per test run from the release binary this suite tests
/// (`cargo deb --no-build`), and unpacked: (the .deb, its files, its control files).
fn package() -> &'static (PathBuf, PathBuf, PathBuf) {
    static PACKAGE: OnceLock<(PathBuf, PathBuf, PathBuf)> = OnceLock::new();
    PACKAGE.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let version = Command::new(&cargo).args(["deb", "--version"]).output();
        assert!(
            version.as_ref().is_ok_and(|o| o.status.success()),
            "cargo-deb is missing; install it: cargo install cargo-deb --locked"
        );
        // The binary must be the one this suite tests: CARGO_BIN_EXE_claimgate is
        // <target>/release/claimgate, which is where `cargo deb --no-build` looks.
        let release = Path::new(BIN).parent().unwrap();
        let target = release.parent().unwrap();
        // Beside the binary, not in /tmp: every test here reads it until the process ends (a
        // static is never dropped), and the next run starts it afresh.
        let dir = release.join("package-test");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        std::fs::create_dir(&dir).unwrap();
        let deb = dir.join("claimgate.deb");
        ok(
            Command::new(&cargo)
                // --fast: lighter compression, the same files (a third of the time).
                .args(["deb", "--no-build", "--locked", "--fast", "--output"])
                .arg(&deb)
                .current_dir(repo())
                .env("CARGO_TARGET_DIR", target)
                .output()
                .expect("cargo deb"),
            "cargo deb --no-build",
        );
        let (root, control) = (dir.join("root"), dir.join("control"));
        for (flag, into) in [("-x", &root), ("-e", &control)] {
            ok(
                tool(
                    Command::new("dpkg-deb").arg(flag).arg(&deb).arg(into),
                    "apt-get install dpkg",
                ),
                "dpkg-deb",
            );
        }
        (deb, root, control)
    })
}

/// `dpkg-deb -c`: each packaged path (without the leading `.`) and its mode and owner.
fn contents(deb: &Path) -> BTreeMap<String, (String, String)> {
    let text = ok(
        tool(
            Command::new("dpkg-deb").arg("-c").arg(deb),
            "apt-get install dpkg",
        ),
        "dpkg-deb -c",
    );
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = f.get(5)?.strip_prefix('.')?.trim_end_matches('/');
            Some((path.to_owned(), (f[0].to_owned(), f[1].to_owned())))
        })
        .collect()
}

/// Where the unit is in the package (cargo-deb puts it under /lib or /usr/lib by version).
fn unit_path(files: &BTreeMap<String, (String, String)>) -> String {
    files
        .keys()
        .find(|p| p.ends_with("/systemd/system/claimgate.service"))
        .cloned()
        .unwrap_or_else(|| panic!("no claimgate.service in {:#?}", files.keys()))
}

#[test]
fn the_package_installs_binary_unit_conffile_man_pages_and_completions_with_their_modes() {
    let (deb, root, control) = package();
    let files = contents(deb);
    let expect = |path: &str, mode: &str| {
        let (m, owner) = files
            .get(path)
            .unwrap_or_else(|| panic!("{path} is not in the package: {:#?}", files.keys()));
        assert_eq!(m, mode, "{path}");
        assert!(
            owner == "root/root" || owner == "0/0",
            "{path} owned by {owner}"
        );
    };
    expect("/usr/bin/claimgate", "-rwxr-xr-x");
    expect("/etc/claimgate/claimgate.env", "-rw-r-----");
    expect("/etc/logrotate.d/claimgate", "-rw-r--r--");
    expect(&unit_path(&files), "-rw-r--r--");
    expect("/usr/share/man/man1/claimgate.1.gz", "-rw-r--r--");
    expect("/usr/share/man/man1/claimgate-run.1.gz", "-rw-r--r--");
    expect("/usr/share/man/man1/claimgate-status.1.gz", "-rw-r--r--");
    expect(
        "/usr/share/bash-completion/completions/claimgate",
        "-rw-r--r--",
    );
    expect("/usr/share/zsh/vendor-completions/_claimgate", "-rw-r--r--");
    expect(
        "/usr/share/fish/vendor_completions.d/claimgate.fish",
        "-rw-r--r--",
    );
    expect(
        "/usr/share/doc/claimgate/examples/prometheus/claimgate.rules.yml",
        "-rw-r--r--",
    );
    expect(
        "/usr/share/doc/claimgate/examples/grafana/claimgate.json",
        "-rw-r--r--",
    );
    // The independent verifier and the auditor's guide to it; the verifier runs as shipped.
    expect("/usr/share/claimgate/verify-evidence.py", "-rwxr-xr-x");
    for doc in [
        "README.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
        "docs/guide.md",
        "docs/operations.md",
        "docs/postgres.md",
        "docs/failure-handling.md",
        "docs/auditor.md",
        "docs/report.png",
    ] {
        expect(&format!("/usr/share/doc/claimgate/{doc}"), "-rw-r--r--");
    }
    // Every link README.md makes to a file opens one the package installed beside it.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    for link in readme
        .split("](")
        .skip(1)
        .filter_map(|l| l.split(')').next())
    {
        if link.starts_with("http") {
            continue;
        }
        let installed = format!("/usr/share/doc/claimgate/{link}");
        assert!(
            files.contains_key(&installed),
            "README links {link}, which the package does not install"
        );
    }
    let help = ok(
        Command::new("python3")
            .arg(root.join("usr/share/claimgate/verify-evidence.py"))
            .arg("--help")
            .output()
            .unwrap(),
        "python3 verify-evidence.py --help",
    );
    assert!(
        help.contains("--anchors") && help.contains("--public-key"),
        "{help}"
    );
    // The packaged binary is the stripped release build and runs.
    let version = ok(
        Command::new(root.join("usr/bin/claimgate"))
            .arg("--version")
            .output()
            .unwrap(),
        "claimgate --version",
    );
    assert_eq!(
        version.trim(),
        format!("claimgate {}", env!("CARGO_PKG_VERSION"))
    );
    // One man page per visible command, none for anything else.
    let pages = files
        .keys()
        .filter(|p| p.starts_with("/usr/share/man/man1/claimgate"))
        .count();
    let generated = std::fs::read_dir(repo().join("packaging/generated/man"))
        .unwrap()
        .count();
    assert_eq!(pages, generated);
    // Nothing under /var: the state directory is systemd's (StateDirectory=), and the ledger
    // is never something a package ships or replaces.
    assert!(
        !files.keys().any(|p| p.starts_with("/var")),
        "{:#?}",
        files.keys()
    );

    let conffiles = std::fs::read_to_string(control.join("conffiles")).expect("conffiles");
    let mut conffiles: Vec<&str> = conffiles.lines().collect();
    conffiles.sort_unstable();
    assert_eq!(
        conffiles,
        ["/etc/claimgate/claimgate.env", "/etc/logrotate.d/claimgate"]
    );
    // The logrotate configuration reloads the service, whose reload is SIGHUP (the audit log
    // reopened: habits.rs runs this file with the real logrotate on a live worker).
    let rotate = std::fs::read_to_string(root.join("etc/logrotate.d/claimgate")).unwrap();
    assert!(
        rotate.contains("systemctl reload claimgate.service"),
        "{rotate}"
    );
    assert!(rotate.contains("delaycompress"), "{rotate}");
    let unit =
        std::fs::read_to_string(root.join(unit_path(&files).trim_start_matches('/'))).unwrap();
    assert!(
        unit.lines()
            .any(|l| l == "ExecReload=/bin/kill -HUP $MAINPID"),
        "{unit}"
    );
    let fields = std::fs::read_to_string(control.join("control")).unwrap();
    let field = |name: &str| {
        fields
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in\n{fields}"))
            .to_owned()
    };
    assert!(field("Depends").contains("adduser"), "{fields}");
    assert!(field("Depends").contains("libc6"), "{fields}");
    assert!(field("Recommends").contains("redis-server"), "{fields}");
}

#[test]
fn the_maintainer_scripts_create_the_user_and_leave_the_service_to_the_operator() {
    let (_, _, control) = package();
    let script = |name: &str| {
        let path = control.join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o755, "{name} mode");
        assert!(text.starts_with("#!/bin/sh"), "{name}:\n{text}");
        assert!(
            !text.contains("#DEBHELPER#"),
            "{name} still has the token:\n{text}"
        );
        // Each must at least parse as a shell script.
        ok(
            Command::new("sh").arg("-n").arg(&path).output().unwrap(),
            &format!("sh -n {name}"),
        );
        text
    };
    let postinst = script("postinst");
    assert!(
        postinst.contains("adduser --quiet --system --group"),
        "{postinst}"
    );
    assert!(postinst.contains("getent passwd claimgate"), "{postinst}");
    assert!(
        postinst.contains(
            "dpkg-statoverride --update --add root claimgate 0640 /etc/claimgate/claimgate.env"
        ),
        "{postinst}"
    );
    // Installed disabled and stopped: the unit is enabled again only if it was enabled before
    // (an upgrade), and only restarted on an upgrade ("$2" is the old version), never started.
    assert!(
        postinst.contains("deb-systemd-helper update-state claimgate.service"),
        "{postinst}"
    );
    assert!(
        postinst.contains("if deb-systemd-helper --quiet was-enabled claimgate.service"),
        "{postinst}"
    );
    assert!(!postinst.contains("deb-systemd-invoke start"), "{postinst}");
    assert!(!postinst.contains("_dh_action=start"), "{postinst}");
    assert!(postinst.contains("if [ -n \"$2\" ]; then"), "{postinst}");
    let postrm = script("postrm");
    // Purge keeps the ledger: it is retained evidence of every payment.
    assert!(!postrm.contains("rm -rf /var/lib/claimgate"), "{postrm}");
    assert!(!postrm.contains("rm -r /var/lib/claimgate"), "{postrm}");
    assert!(!postrm.contains("deluser"), "{postrm}");
    script("prerm");
}

#[test]
fn the_unit_is_hardened_and_passes_systemd_analyze_verify() {
    let (deb, root, _) = package();
    let unit = unit_path(&contents(deb));
    let text = std::fs::read_to_string(root.join(unit.trim_start_matches('/'))).unwrap();
    for line in [
        "User=claimgate",
        "ExecStart=/usr/bin/claimgate run",
        "EnvironmentFile=/etc/claimgate/claimgate.env",
        "Environment=CLAIMGATE_DB=/var/lib/claimgate/claimgate.db",
        "Environment=CLAIMGATE_RELAY=true",
        "StateDirectory=claimgate",
        "StateDirectoryMode=0700",
        "UMask=0077",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "Restart=on-failure",
        "CapabilityBoundingSet=",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "unit lacks {line:?}:\n{text}"
        );
    }
    // Verified under a root holding the packaged unit, binary and env file (so ExecStart's
    // binary is the packaged one) plus this host's targets the unit's default dependencies
    // name; --man=no because the pages named in Documentation= are not installed here.
    let verify_root = tempfile::tempdir().unwrap();
    for rel in [
        unit.trim_start_matches('/'),
        "usr/bin/claimgate",
        "etc/claimgate/claimgate.env",
    ] {
        let to = verify_root.path().join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(root.join(rel), &to).unwrap();
    }
    // ExecReload= names /bin/kill (procps), which the unit's checks want to find executable:
    // this host's, as on any box the package installs on.
    let kill = verify_root.path().join("bin/kill");
    std::fs::create_dir_all(kill.parent().unwrap()).unwrap();
    std::fs::copy("/bin/kill", &kill).expect("/bin/kill: apt-get install procps");
    let unit_dir = verify_root
        .path()
        .join(Path::new(unit.trim_start_matches('/')).parent().unwrap());
    for entry in std::fs::read_dir("/usr/lib/systemd/system").expect("systemd's unit directory") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "target") {
            std::fs::copy(&path, unit_dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    let analyze = |args: &[&str]| {
        tool(
            Command::new("systemd-analyze")
                .args(args)
                .arg(format!("--root={}", verify_root.path().display()))
                .arg("claimgate.service")
                .env("SYSTEMD_LOG_LEVEL", "notice"),
            "apt-get install systemd",
        )
    };
    let out = analyze(&["verify", "--man=no"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{stderr}"
    );
    // Unknown keys and unparsable values are only remarks (exit 0), each naming the unit file.
    assert!(
        !stderr.contains("claimgate.service:"),
        "systemd-analyze has remarks on the unit:\n{stderr}"
    );
    // systemd's own exposure score, 0 (locked down) to 10 (unprotected); 1.2 when written.
    let out = analyze(&["security", "--offline=true"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let exposure: f64 = text
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for claimgate.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
    assert!(exposure <= 2.0, "exposure {exposure}:\n{text}");
}

#[test]
fn the_generated_man_pages_and_completions_are_what_the_command_line_says() {
    let dir = repo().join("packaging/generated");
    let mut committed = BTreeMap::new();
    for sub in ["man", "completions"] {
        for entry in std::fs::read_dir(dir.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(&dir).unwrap().to_owned();
            committed.insert(rel, std::fs::read(&path).unwrap());
        }
    }
    let rendered: BTreeMap<PathBuf, Vec<u8>> = claimgate::cli::docs().into_iter().collect();
    let stale: Vec<_> = rendered
        .iter()
        .filter(|(p, c)| committed.get(*p) != Some(*c))
        .map(|(p, _)| p)
        .chain(committed.keys().filter(|p| !rendered.contains_key(*p)))
        .collect();
    assert!(
        stale.is_empty(),
        "packaging/generated/ is stale ({stale:?}); run \
         `cargo run --release --example generate_docs` and commit it"
    );
    assert!(rendered.contains_key(Path::new("man/claimgate-audit-export.1")));
}

#[test]
fn every_man_page_renders() {
    let dir = repo().join("packaging/generated/man");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let page = entry.unwrap().path();
        let out = tool(
            Command::new("man")
                .arg("-l")
                .arg(&page)
                .env("MANPAGER", "cat")
                .env("MANWIDTH", "100")
                .env("LC_ALL", "C.UTF-8"),
            "apt-get install man-db",
        );
        let text = ok(out, &format!("man -l {}", page.display()));
        let name = page.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            text.contains("NAME") && text.contains("SYNOPSIS"),
            "{name}:\n{text}"
        );
        assert!(
            text.contains(&name),
            "{name} not named in its page:\n{text}"
        );
    }
    // The worker's page carries its flags and the environment variable of each.
    let run = ok(
        Command::new("man")
            .arg("-l")
            .arg(dir.join("claimgate-run.1"))
            .env("MANPAGER", "cat")
            .env("LC_ALL", "C.UTF-8")
            .output()
            .unwrap(),
        "man -l claimgate-run.1",
    );
    assert!(
        run.contains("--metrics-addr") && run.contains("CLAIMGATE_METRICS_ADDR"),
        "{run}"
    );
}

#[test]
fn the_bash_completion_loads_and_completes_subcommands_and_flags() {
    let file = repo().join("packaging/generated/completions/claimgate.bash");
    let complete = |words: &str| {
        let script = format!(
            "source '{}' && complete -p claimgate && \
             COMP_WORDS=({words}) && COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)) && \
             COMP_LINE=\"${{COMP_WORDS[*]}}\" && COMP_POINT=${{#COMP_LINE}} && \
             _claimgate claimgate \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\" && \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file.display()
        );
        ok(
            tool(
                Command::new("bash").arg("-c").arg(script),
                "apt-get install bash",
            ),
            "bash completion",
        )
    };
    let subcommands = complete("claimgate st");
    assert!(
        subcommands
            .lines()
            .next()
            .unwrap()
            .contains(" -F _claimgate claimgate"),
        "{subcommands}"
    );
    assert!(subcommands.lines().any(|l| l == "status"), "{subcommands}");
    let flags = complete("claimgate status --wa");
    assert!(flags.lines().any(|l| l == "--watch"), "{flags}");
}

#[test]
fn the_env_file_names_every_setting_of_the_service_commented_at_its_default() {
    use clap::CommandFactory;
    let env_file = std::fs::read_to_string(repo().join("packaging/claimgate.env")).unwrap();
    let unit = std::fs::read_to_string(repo().join("packaging/debian/claimgate.service")).unwrap();
    // Nothing but the ledger is set by the file itself (operator commands read it to find the
    // service's ledger): every value is the unit's or the flag's default.
    let live: Vec<&str> = env_file
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        live,
        ["CLAIMGATE_DB=/var/lib/claimgate/claimgate.db"],
        "uncommented settings"
    );
    let parsed = claimgate::cli::envfile::parse(&env_file).expect("systemd's syntax");
    assert_eq!(parsed.len(), 1, "{parsed:?}");
    let shown = |name: &str| {
        env_file.lines().find_map(|l| {
            l.strip_prefix(&format!("#{name}="))
                .or_else(|| l.strip_prefix(&format!("{name}=")))
                .map(str::to_owned)
        })
    };
    let set_by_unit = |name: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("Environment={name}=")))
            .map(str::to_owned)
    };
    let cli = claimgate::cli::Cli::command();
    let run = cli.find_subcommand("run").expect("run");
    let mut checked = 0;
    for arg in cli.get_arguments().chain(run.get_arguments()) {
        let Some(env) = arg.get_env() else { continue };
        let name = env.to_string_lossy().into_owned();
        if name == "CLAIMGATE_ENV_FILE" {
            continue; // the file naming itself
        }
        let value = shown(&name).unwrap_or_else(|| panic!("{name} is not in the env file"));
        let default = arg
            .get_default_values()
            .first()
            .map(|v| v.to_string_lossy().into_owned());
        match (set_by_unit(&name), default) {
            (Some(unit_value), _) if name != "CLAIMGATE_CONSUMER" => {
                assert_eq!(
                    value, unit_value,
                    "{name}: the env file shows another value than the unit sets"
                )
            }
            (None, Some(default)) => assert_eq!(value, default, "{name}: not the flag's default"),
            _ => {}
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} settings checked");
}

#[test]
fn the_packaged_cli_finds_the_services_ledger_through_the_packaged_settings_file() {
    // The binary and the settings file as the package installs them (unpacked): `status` with
    // no --db and no CLAIMGATE_DB looks for the service's ledger, /var/lib/claimgate/claimgate.db,
    // says which file told it so, and exits 2 naming that path (nothing is made there); a
    // variable in the environment still wins over the file, and --env-file '' reads none.
    let (_, root, _) = package();
    let bin = root.join("usr/bin/claimgate");
    let settings = root.join("etc/claimgate/claimgate.env");
    let run = |extra_env: &[(&str, &str)], args: &[&str]| {
        let mut cmd = Command::new(&bin);
        cmd.args(["status"])
            .args(args)
            .env_remove("CLAIMGATE_DB")
            .env_remove("CLAIMGATE_ENV_FILE")
            .env("REDIS_URL", "redis://127.0.0.1:1")
            .env("CLAIMGATE_ENV_FILE", &settings)
            .current_dir(root);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[], &[]);
    assert!(
        err.contains(&format!(
            "settings from {}: CLAIMGATE_DB",
            settings.display()
        )),
        "{err}"
    );
    if Path::new("/var/lib/claimgate/claimgate.db").exists() {
        // A box where the package is installed and its service has run (a fresh-box check
        // does that): status reads that ledger and goes on to Redis, unreachable here.
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("Redis at redis://127.0.0.1:1 could not be reached"),
            "{err}"
        );
    } else {
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("no ledger at /var/lib/claimgate/claimgate.db"),
            "{err}"
        );
    }
    let (code, err) = run(&[("CLAIMGATE_DB", "/nonexistent/here.db")], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no ledger at /nonexistent/here.db"), "{err}");
    let (code, err) = run(&[], &["--env-file", ""]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("no ledger at ./claimgate.db") && !err.contains("settings from"),
        "{err}"
    );
}
