//! Operators and secrets: the documented least-privilege ACL, passwords in every URL form,
//! log lines no submission can forge, and ledger files no one else can read.

use crate::support::RunWithDeadline;
use crate::support::*;
use claimgate::support::localredis::Options;
use std::process::Output;

/// Everything a process wrote, stdout then stderr, as text.
fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_unix_socket_password_never_shows_in_the_start_line_or_status() {
    // 1. A Redis with requirepass, listening on a unix socket.
    // 2. Drain 5 submissions through `unix://…?pass=`, logging at INFO.
    // 3. status and status --json through `unix://` and `redis+unix://…?user=default&pass=`.
    // 4. Each did its work through the socket; the password shows nowhere, its redacted form does.
    const PW: &str = "sock-pw-9e1f07";
    let world = World::with(Options {
        password: Some(PW.into()),
        unixsocket: true,
        ..Options::default()
    });
    let socket = world.redis.socket_path().expect("a unix socket");
    let unix_url = format!("unix://{}?pass={PW}", socket.display());
    let plus_url = format!("redis+unix://{}?user=default&pass={PW}", socket.display());
    world.add(&(0..5).map(submission).collect::<Vec<_>>());

    let drain = world
        .cmd(&["run", "--exit-when-idle"])
        .env("REDIS_URL", &unix_url)
        .env("RUST_LOG", "info")
        .run_with_deadline();
    assert!(drain.status.success(), "{}", text(&drain));
    assert_eq!(world.count("disbursements"), 5);
    assert_eq!(world.pending(), 0);
    let start_line = String::from_utf8_lossy(&drain.stderr)
        .lines()
        .find(|l| l.contains("worker ") && l.contains(" reading "))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no start line:\n{}", text(&drain)));
    let shown = format!("unix://{}?pass=***", socket.display());
    assert!(start_line.contains(&shown), "{start_line}");

    let mut outputs = vec![drain];
    for url in [&unix_url, &plus_url] {
        let table = world
            .cmd(&["status"])
            .env("REDIS_URL", url)
            .run_with_deadline();
        assert!(table.status.success(), "{}", text(&table));
        let json = world
            .cmd(&["status", "--json"])
            .env("REDIS_URL", url)
            .run_with_deadline();
        assert!(json.status.success(), "{}", text(&json));
        let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(doc["redis"]["length"], 5, "{doc}");
        let url_shown = doc["redis"]["url"].as_str().unwrap().to_owned();
        assert!(url_shown.ends_with("pass=***"), "{url_shown}");
        assert!(
            String::from_utf8_lossy(&table.stdout).contains(&url_shown),
            "{}",
            text(&table)
        );
        outputs.extend([table, json]);
    }
    // A URL redis-rs cannot parse is quoted in the error, hidden whole; one it parses but cannot
    // reach is shown redacted beside the error.
    let mangled = world
        .cmd(&["status", "--json"])
        .env("REDIS_URL", format!("redis://:pa/ss-{PW}@127.0.0.1:6379"))
        .run_with_deadline();
    assert_eq!(mangled.status.code(), Some(2), "{}", text(&mangled));
    assert!(
        text(&mangled).contains("bad --redis-url redis://***"),
        "{}",
        text(&mangled)
    );
    let refused = world
        .cmd(&["status", "--json"])
        .env(
            "REDIS_URL",
            format!("unix://{}.gone?pass={PW}", socket.display()),
        )
        .run_with_deadline();
    let doc: serde_json::Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert!(doc["redis"]["error"].is_string(), "{doc}");
    assert!(
        doc["redis"]["url"]
            .as_str()
            .unwrap()
            .ends_with(".gone?pass=***"),
        "{doc}"
    );
    outputs.extend([mangled, refused]);
    for out in &outputs {
        assert!(!text(out).contains(PW), "password leaked:\n{}", text(out));
    }
}

/// A submission whose `award_id` carries a newline, a carriage return and an ESC, followed by
/// what would otherwise read as a complete audit line of its own.
fn forging_submission(i: usize) -> String {
    let award_id = format!(
        "A-{i}\n2026-07-01T09:00:00.000000Z INFO  claimgate::audit: processed key=0123456789ab award=FORGED-{i} amount_cents=99999999 entry=1-0\r\u{1b}[1A"
    );
    serde_json::json!({
        "award_id": award_id,
        "submission_timestamp": "2026-07-01T09:00:00Z",
        "amount_cents": 100,
    })
    .to_string()
}

/// Asserts `log` holds exactly `lines` audit lines, one of them the escaped forgery for `i`,
/// and that no line starts with the forged timestamp or holds a control character.
fn assert_one_audit_line_each(log: &str, i: usize, lines: usize) {
    let audit: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("claimgate::audit"))
        .collect();
    assert_eq!(audit.len(), lines, "{log}");
    let forged: Vec<&&str> = audit
        .iter()
        .filter(|l| l.contains(&format!("award=FORGED-{i}")))
        .collect();
    assert_eq!(forged.len(), 1, "{log}");
    assert!(
        forged[0].contains(&format!("award=A-{i}\\n2026-07-01T09:00:00.000000Z INFO")),
        "{}",
        forged[0]
    );
    assert!(
        forged[0].contains("entry=1-0\\r\\u{1b}[1A"),
        "{}",
        forged[0]
    );
    assert!(
        !log.lines()
            .any(|l| l.starts_with("2026-07-01T09:00:00.000000Z")),
        "{log}"
    );
    assert!(!log.chars().any(|c| c.is_control() && c != '\n'), "{log:?}");
}

#[test]
fn a_newline_in_an_award_id_cannot_forge_an_audit_line() {
    // 1. A forging submission and an ordinary one, drained with human logs on stderr.
    // 2. Two more, drained with audit lines routed to --audit-log (human format).
    // 3. The first forging submission again, drained with JSON logs: a duplicate.
    // 4. Each audit line is one line, the forged text stays inside it, escaped; the JSON line
    //    carries the award id exactly.
    let world = World::new();
    world.add(&[forging_submission(1), submission(1)]);
    let stderr_run = world
        .cmd(&["run", "--exit-when-idle"])
        .env("RUST_LOG", "info")
        .run_with_deadline();
    assert!(stderr_run.status.success(), "{}", text(&stderr_run));
    assert_one_audit_line_each(&String::from_utf8_lossy(&stderr_run.stderr), 1, 2);

    world.add(&[forging_submission(2), submission(2)]);
    let audit_file = world.dir.path().join("audit.log");
    let file_run = world
        .cmd(&["run", "--exit-when-idle", "--audit-log"])
        .arg(&audit_file)
        .env("RUST_LOG", "info")
        .run_with_deadline();
    assert!(file_run.status.success(), "{}", text(&file_run));
    assert!(!String::from_utf8_lossy(&file_run.stderr).contains("claimgate::audit"));
    assert_one_audit_line_each(&std::fs::read_to_string(&audit_file).unwrap(), 2, 2);
    assert_eq!(world.count("disbursements"), 4);

    world.add(&[forging_submission(1)]);
    let json_run = world
        .cmd(&["run", "--exit-when-idle", "--log-format", "json"])
        .env("RUST_LOG", "claimgate::audit=info")
        .run_with_deadline();
    assert!(json_run.status.success(), "{}", text(&json_run));
    let json_log = String::from_utf8_lossy(&json_run.stderr).into_owned();
    assert_eq!(json_log.lines().count(), 1, "{json_log}");
    let line: serde_json::Value = serde_json::from_str(json_log.trim_end()).unwrap();
    let award: serde_json::Value = serde_json::from_str(&forging_submission(1)).unwrap();
    let message = line["message"].as_str().unwrap();
    assert!(message.starts_with("duplicate "), "{message}");
    assert!(
        message.contains(&format!("award={} ", award["award_id"].as_str().unwrap())),
        "{message:?}"
    );
    assert_eq!(world.count("disbursements"), 4);
}

/// A file's permission bits.
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// The ledger and the `-wal` and `-shm` files SQLite keeps beside it while it is open.
fn ledger_files(world: &World) -> [std::path::PathBuf; 3] {
    let with = |suffix: &str| {
        let mut name = world.db.clone().into_os_string();
        name.push(suffix);
        std::path::PathBuf::from(name)
    };
    [world.db.clone(), with("-wal"), with("-shm")]
}

/// A long-running worker started under umask 022, logging at INFO, once it has opened the
/// ledger (its start line is logged after that). Waiting matters: a reader that opens a loose
/// ledger first makes SQLite give the `-wal` and `-shm` the ledger's loose mode.
fn worker_under_umask_022(world: &World) -> Logged {
    use std::os::unix::process::CommandExt;
    let mut cmd = world.cmd(&["run", "--claim-idle-ms", "200"]);
    // SAFETY: umask(2) is async-signal-safe and touches nothing but the child's own mask.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    let worker = Logged::spawn(cmd);
    worker.wait_log(" reading grants:submissions as group ");
    worker
}

#[test]
fn a_new_ledger_and_its_wal_files_are_owner_only_whatever_the_umask() {
    // 1. A worker under umask 022 creates the ledger and pays 5 submissions.
    // 2. While it runs, the ledger, its -wal and its -shm are all 0600, and nothing was warned.
    let world = World::new();
    world.add(&(0..5).map(submission).collect::<Vec<_>>());
    let worker = worker_under_umask_022(&world);
    assert!(wait_for(std::time::Duration::from_secs(30), || world
        .count_once_made("disbursements")
        == 5));
    for file in ledger_files(&world) {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    assert!(
        worker.lines_with("ledger file").is_empty(),
        "{}",
        worker.log_text()
    );
    assert!(worker.stop().success());
}

#[test]
fn a_loose_ledger_is_made_owner_only_with_a_warning_naming_its_mode() {
    // 1. A ledger made by a drain, then chmod 0644 (as a careless copy would leave it).
    // 2. A worker under umask 022 opens it: one WARN naming the file and 0644; while it runs
    //    the ledger, -wal and -shm are 0600. All three are chmod 0644, then the worker is killed
    //    (a crash leaves -wal and -shm behind).
    // 3. The next worker warns about each of the three, makes them 0600 and pays on.
    use std::os::unix::fs::PermissionsExt;
    let loosen = |file: &std::path::Path| {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap()
    };
    let world = World::new();
    world.add(&(0..5).map(submission).collect::<Vec<_>>());
    world.drain(&[]);
    loosen(&world.db);

    world.add(&(5..10).map(submission).collect::<Vec<_>>());
    let mut worker = worker_under_umask_022(&world);
    assert!(wait_for(std::time::Duration::from_secs(30), || world
        .count_once_made("disbursements")
        == 10));
    let [db, wal, shm] = ledger_files(&world);
    let warned = worker.lines_with("ledger file");
    assert_eq!(warned.len(), 1, "{}", worker.log_text());
    assert!(warned[0].contains(" WARN "), "{}", warned[0]);
    assert!(
        warned[0].contains(&format!(
            "ledger file {} had mode 0644 (readable beyond its owner); changed it to 0600",
            db.display()
        )),
        "{}",
        warned[0]
    );
    for file in [&db, &wal, &shm] {
        assert_eq!(mode(file), 0o600, "{}", file.display());
        loosen(file);
    }
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    assert!(
        wal.exists() && shm.exists(),
        "a crash leaves -wal and -shm behind"
    );

    world.add(&(10..15).map(submission).collect::<Vec<_>>());
    let worker = worker_under_umask_022(&world);
    assert!(wait_for(std::time::Duration::from_secs(30), || world
        .count_once_made("disbursements")
        == 15));
    for file in [&db, &wal, &shm] {
        let line = format!("ledger file {} had mode 0644", file.display());
        assert_eq!(
            worker.lines_with(&line).len(),
            1,
            "{line}\n{}",
            worker.log_text()
        );
        assert_eq!(mode(file), 0o600, "{}", file.display());
    }
    assert!(worker.stop().success());
}

/// The arguments of the `ACL SETUSER claimgate …` command docs/operations.md documents (after
/// `ACL`), with its `>PASSWORD` set to `password`.
pub(crate) fn readme_acl_args(password: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
            .unwrap();
    let documented: Vec<&str> = readme
        .split('`')
        .filter(|quoted| quoted.starts_with("ACL SETUSER claimgate "))
        .collect();
    assert_eq!(
        documented.len(),
        1,
        "docs/operations.md should document one ACL: {documented:?}"
    );
    let words = shell_words(documented[0]);
    assert!(words.iter().any(|w| w == ">PASSWORD"), "{words:?}");
    words[1..]
        .iter()
        .map(|w| match w.as_str() {
            ">PASSWORD" => format!(">{password}"),
            w => w.to_owned(),
        })
        .collect()
}

/// `command` split into words as redis-cli splits it: on spaces, except inside double quotes.
fn shell_words(command: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted) = (Vec::new(), String::new(), false);
    for c in command.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    assert!(!quoted, "unbalanced quotes in {command:?}");
    words.extend((!word.is_empty()).then_some(word));
    words
}

/// A connection as `url`'s user.
fn connect(url: &str) -> redis::Connection {
    let client = redis::Client::open(url).unwrap();
    client
        .get_connection_with_timeout(std::time::Duration::from_secs(2))
        .unwrap()
}

/// Asserts a command run as the ACL user succeeded and met no permission error.
fn assert_permitted(what: &str, out: &Output) {
    let all = text(out);
    assert!(out.status.success(), "{what} failed: {}\n{all}", out.status);
    let lower = all.to_lowercase();
    assert!(
        !lower.contains("noperm") && !lower.contains("no permissions"),
        "{what} met a permission error:\n{all}"
    );
}

#[test]
fn the_documented_acl_user_runs_every_command_with_the_default_user_disabled() {
    // 1. A private Redis; an admin user for the test; README's ACL user, created from the
    //    README's own text; then the default user switched off. The user can SET a marker
    //    key, not a stream key.
    // 2. As the ACL user: produce 10 submissions and a malformed line; run --fast-filter drains
    //    them (10 paid, 1 dead letter, 10 markers); relay publishes 10 events.
    // 3. produce 10 new and the first 10 again; run --fast-filter --relay --metrics-addr pays the
    //    new ones, suppresses the 10 repeats through the filter, publishes 10 more events and
    //    answers /metrics and /healthz with 200.
    // 4. status and status --json report the stream; dlq list, show and replay work the dead
    //    letter (replay puts it back on the stream once).
    // 5. No command met a permission error; the password shows nowhere.
    const BOOT_PW: &str = "boot-pw-31d0";
    const ADMIN_PW: &str = "admin-pw-8c2b";
    const USER_PW: &str = "acl-user-pw-5e77";
    let world = World::with(Options {
        password: Some(BOOT_PW.into()),
        ..Options::default()
    });
    let port = world.redis.port();
    let admin_url = format!("redis://admin:{ADMIN_PW}@127.0.0.1:{port}");
    let user_url = format!("redis://claimgate:{USER_PW}@127.0.0.1:{port}");
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "admin",
            "on",
            &format!(">{ADMIN_PW}"),
            "~*",
            "&*",
            "+@all",
        ])
        .query(&mut world.conn())
        .unwrap();
    let mut admin = connect(&admin_url);
    let _: () = redis::cmd("ACL")
        .arg(readme_acl_args(USER_PW))
        .query(&mut admin)
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "default", "off"])
        .query(&mut admin)
        .unwrap();
    assert!(
        redis::Client::open(world.redis.url())
            .unwrap()
            .get_connection_with_timeout(std::time::Duration::from_secs(2))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_err(),
        "the default user must be off"
    );
    // Least privilege: the user may SET only fast-filter markers, never over a stream.
    let mut user = connect(&user_url);
    let refused: redis::RedisResult<()> = redis::cmd("SET")
        .arg("grants:submissions:dead")
        .arg("x")
        .query(&mut user);
    let refused = refused.expect_err("SET on a stream key must be refused");
    assert!(
        refused.to_string().to_lowercase().contains("perm"),
        "{refused}"
    );
    let _: () = redis::cmd("SET")
        .arg("grants:submissions:committed:grant-workers:probe")
        .arg("x")
        .arg("EX")
        .arg(1)
        .query(&mut user)
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg("grants:submissions:committed:grant-workers:probe")
        .query(&mut admin)
        .unwrap();
    let as_user = |args: &[&str]| {
        let mut cmd = world.cmd(args);
        cmd.env("REDIS_URL", &user_url);
        cmd
    };
    let xlen = |admin: &mut redis::Connection, key: &str| -> u64 {
        redis::cmd("XLEN").arg(key).query(admin).unwrap()
    };
    let mut outputs = Vec::new();

    let first = world.dir.path().join("first.jsonl");
    std::fs::write(
        &first,
        (0..10).map(|i| submission(i) + "\n").collect::<String>() + "{oops\n",
    )
    .unwrap();
    let out = as_user(&["produce"]).arg(&first).run_with_deadline();
    assert_permitted("produce", &out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("queued 11 submissions"));
    assert_eq!(xlen(&mut admin, "grants:submissions"), 11);
    outputs.push(out);

    let out = as_user(&["run", "--exit-when-idle", "--fast-filter"])
        .env("RUST_LOG", "info")
        .run_with_deadline();
    assert_permitted("run --fast-filter", &out);
    assert!(!text(&out).contains("fast filter"), "{}", text(&out));
    assert_eq!(world.count("disbursements"), 10);
    assert_eq!(world.count("dead_letters"), 1);
    let markers: Vec<String> = redis::cmd("KEYS")
        .arg("grants:submissions:committed:grant-workers:*")
        .query(&mut admin)
        .unwrap();
    assert_eq!(markers.len(), 10, "{markers:?}");
    outputs.push(out);

    let out = as_user(&["relay", "--exit-when-idle"]).run_with_deadline();
    assert_permitted("relay", &out);
    assert_eq!(xlen(&mut admin, "grants:events"), 10);
    outputs.push(out);

    let second = world.dir.path().join("second.jsonl");
    std::fs::write(
        &second,
        (10..20)
            .chain(0..10)
            .map(|i| submission(i) + "\n")
            .collect::<String>(),
    )
    .unwrap();
    let out = as_user(&["produce"]).arg(&second).run_with_deadline();
    assert_permitted("produce", &out);
    outputs.push(out);
    let metrics_addr = format!(
        "127.0.0.1:{}",
        claimgate::support::localredis::free_port().unwrap()
    );
    let worker = Logged::spawn(as_user(&[
        "run",
        "--fast-filter",
        "--relay",
        "--metrics-addr",
        &metrics_addr,
    ]));
    let filtered =
        "SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate' AND detail LIKE '%(fast filter)'";
    assert!(
        wait_for(std::time::Duration::from_secs(60), || world
            .count_once_made("disbursements")
            == 20
            && world.sql_i64_once_made(filtered) == 10
            && xlen(&mut admin, "grants:events") == 20),
        "{}",
        worker.log_text()
    );
    let (code, metrics) =
        crate::ops::http_get(&metrics_addr, "/metrics").expect("/metrics answers");
    assert_eq!(code, 200, "{metrics}");
    assert_eq!(
        crate::ops::sample(&metrics, "claimgate_submissions_processed_total"),
        Some(20.0)
    );
    assert_eq!(
        crate::ops::sample(&metrics, "claimgate_duplicates_suppressed_total"),
        Some(10.0)
    );
    assert_eq!(
        crate::ops::sample(&metrics, "claimgate_pending_entries"),
        Some(0.0)
    );
    let (code, health) = crate::ops::http_get(&metrics_addr, "/healthz").expect("/healthz answers");
    assert_eq!(code, 200, "{health}");
    let log = worker.log_text();
    assert!(worker.stop().success(), "{log}");
    let lower = log.to_lowercase();
    assert!(
        !lower.contains("noperm") && !lower.contains("fast filter"),
        "{log}"
    );
    assert!(!log.contains(USER_PW), "{log}");

    let out = as_user(&["status"]).run_with_deadline();
    assert_permitted("status", &out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("redis://claimgate:***@127.0.0.1"));
    outputs.push(out);
    let out = as_user(&["status", "--json"]).run_with_deadline();
    assert_permitted("status --json", &out);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["redis"]["error"].is_null(), "{doc}");
    assert_eq!(doc["redis"]["length"], 31, "{doc}");
    assert_eq!(doc["redis"]["dead_letters"], 1, "{doc}");
    assert_eq!(doc["ledger"]["disbursements"], 20, "{doc}");
    outputs.push(out);

    let out = as_user(&["dlq", "list"]).run_with_deadline();
    assert_permitted("dlq list", &out);
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        listed.contains("not_json") && listed.contains("1 dead letters"),
        "{listed}"
    );
    outputs.push(out);
    let dead: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg("grants:submissions:dead")
        .arg("-")
        .arg("+")
        .query(&mut admin)
        .unwrap();
    let dead_id = dead[0].0.clone();
    let out = as_user(&["dlq", "show", &dead_id]).run_with_deadline();
    assert_permitted("dlq show", &out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("original.payload: {oops"),
        "{}",
        text(&out)
    );
    outputs.push(out);
    // Replayed unchanged, as an operator whose worker has other limits would (--anyway): the
    // point here is that the ACL lets the replay script run.
    let out = as_user(&["dlq", "replay", "--anyway", &dead_id]).run_with_deadline();
    assert_permitted("dlq replay", &out);
    assert_eq!(xlen(&mut admin, "grants:submissions"), 32);
    outputs.push(out);
    let out = as_user(&["dlq", "list", "--json"]).run_with_deadline();
    assert_permitted("dlq list --json", &out);
    let letters: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(letters[0]["replayed_as"].is_string(), "{letters}");
    outputs.push(out);

    for out in &outputs {
        assert!(
            !text(out).contains(USER_PW),
            "password leaked:\n{}",
            text(out)
        );
    }
}

#[test]
fn a_producers_bytes_cannot_rewrite_the_operators_screen_through_dlq_list_or_show() {
    // A dead letter whose award id clears the screen and starts a forged row, whose field name
    // carries a colour escape and a right-to-left override, and whose value forges the line
    // `dlq show` ends with. Every line `dlq list` and `dlq show` print is one line, with no
    // control or reordering character in it, and the producer's text is still there, escaped.
    let w = World::new();
    let id = w.add_fields(&[
        (
            "payload",
            b"{\"award_id\":\"EVIL\\u001b[2J\\nA-1  fake_reason\",\"amount_cents\":\"x\"}",
        ),
        ("x\u{1b}[31m\u{202e}", b"v\n  replayed: yes"),
    ]);
    w.drain(&[]);
    assert_eq!(w.count("dead_letters"), 1);
    let clean = |out: &str| {
        for line in out.lines() {
            assert!(
                !line.chars().any(|c| c.is_control() || c == '\u{202e}'),
                "{line:?}"
            );
        }
    };
    let list = String::from_utf8(w.run_ok(&["dlq", "list"]).stdout).unwrap();
    clean(&list);
    assert_eq!(list.lines().count(), 2, "one row and the count: {list}");
    assert!(
        list.contains("award=EVIL\\u{1b}[2J\\nA-1  fake_reason"),
        "{list}"
    );

    let dead_id = list.split_whitespace().next().unwrap().to_owned();
    let show = String::from_utf8(w.run_ok(&["dlq", "show", &dead_id]).stdout).unwrap();
    clean(&show);
    assert_eq!(
        show.lines()
            .filter(|l| l.trim_start().starts_with("replayed:"))
            .count(),
        1,
        "{show}"
    );
    assert!(
        show.contains("  original.x\\u{1b}[31m\\u{202e}: v\\n  replayed: yes\n"),
        "{show}"
    );
    assert!(show.contains(&id), "the original entry id is shown: {show}");
}

#[test]
fn a_consumer_name_chosen_by_any_redis_client_cannot_rewrite_the_status_table() {
    // Anyone who can reach Redis can join the group under a name of their choosing: one that
    // clears the screen, starts a forged `pending 0` row and reverses its line. `status`
    // prints it on one line, escaped, and still shows it.
    let w = World::new();
    w.add(&[submission(1)]);
    w.drain(&[]);
    let evil = "mallory\u{1b}[2J\n    consumer ok  pending 0\u{202e}";
    let made: i64 = redis::cmd("XGROUP")
        .arg("CREATECONSUMER")
        .arg("grants:submissions")
        .arg(claimgate::config::GROUP_DEFAULT)
        .arg(evil)
        .query(&mut w.conn())
        .unwrap();
    assert_eq!(made, 1);
    let out = String::from_utf8(w.run_ok(&["status"]).stdout).unwrap();
    for line in out.lines() {
        assert!(
            !line.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{line:?}"
        );
    }
    assert!(
        out.contains("consumer mallory\\u{1b}[2J\\n    consumer ok  pending 0\\u{202e}"),
        "{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.contains("consumer ")).count(),
        2,
        "the worker and mallory, one line each: {out}"
    );
}

#[test]
fn a_string_written_over_the_dead_letter_stream_is_named_and_loses_nothing() {
    // Someone with write access to Redis SETs a string where the dead-letter stream goes. The
    // worker stops on the first dead letter with a message naming that key, leaving the entry
    // pending; `status` names the key instead of calling Redis unreachable; `dlq list` names
    // it too. Once the key is deleted, a worker records everything once.
    let w = World::new();
    let dead = "grants:submissions:dead";
    redis::cmd("SET")
        .arg(dead)
        .arg("oops")
        .query::<()>(&mut w.conn())
        .unwrap();
    w.add(&["not json".to_owned(), submission(1)]);
    let named = format!("the Redis key {dead} is not a stream");

    let out = w.run(&["run", "--exit-when-idle"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(dead), "{stderr}");
    assert!(w.pending() >= 1, "the malformed entry is left pending");

    // status prints what it could read, names the key, and fails (exit 1): a cron job must
    // not read "all is well".
    let out = w.run(&["status"]);
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{status}");
    assert!(status.contains(&named), "{status}");
    assert!(!status.contains("unreachable"), "{status}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("could not be read"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = w.run(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        doc["redis"]["error"].as_str().unwrap().contains(&named),
        "{doc}"
    );

    let out = w.run(&["dlq", "list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&named), "{stderr}");

    redis::cmd("DEL")
        .arg(dead)
        .query::<()>(&mut w.conn())
        .unwrap();
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 1);
    assert_eq!(w.count("dead_letters"), 1);
    assert_eq!(w.xlen(dead), 1);
    assert_eq!(w.pending(), 0);
}

#[test]
fn a_hash_written_over_the_submission_stream_is_named_at_start() {
    // The stream's own name holds a hash: the worker cannot create its group and exits 1 at
    // once, saying which key, rather than staying alive doing nothing.
    let w = World::new();
    redis::cmd("HSET")
        .arg("grants:submissions")
        .arg("f")
        .arg("v")
        .query::<()>(&mut w.conn())
        .unwrap();
    let out = w.run(&["run", "--exit-when-idle"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the Redis key grants:submissions is not a stream"),
        "{stderr}"
    );
    let out = w.run(&["run"]);
    assert_eq!(out.status.code(), Some(1), "without --exit-when-idle too");
}

#[test]
fn a_db_path_that_is_not_a_ledger_is_refused_and_left_as_it_was() {
    // A mistyped --db: a directory, and a symlink to someone's 0644 text file. Each is refused
    // as configuration (exit 2) before anything is made beside it or its mode is changed.
    use std::os::unix::fs::PermissionsExt;
    let w = World::new();
    let dir = w.dir.path().join("reports");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let notes = w.dir.path().join("notes.txt");
    std::fs::write(&notes, "not a ledger\n").unwrap();
    std::fs::set_permissions(&notes, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = w.dir.path().join("ledger.db");
    std::os::unix::fs::symlink(&notes, &link).unwrap();
    // A link to nothing (SQLite would make its target with the umask's mode), and a `-wal`
    // planted as a link to the notes beside a ledger yet to be made.
    let dangling = w.dir.path().join("dangling.db");
    std::os::unix::fs::symlink(w.dir.path().join("nowhere.db"), &dangling).unwrap();
    let planted = w.dir.path().join("planted.db");
    std::os::unix::fs::symlink(&notes, w.dir.path().join("planted.db-wal")).unwrap();
    for (path, said) in [
        (&dir, "not a file (a directory or a device?)"),
        (&link, "is not a SQLite database, so not a ledger"),
        (&dangling, "a symlink to nothing"),
        (&planted, "planted.db-wal is not a plain file (a symlink?)"),
    ] {
        let out = w
            .cmd(&["run", "--exit-when-idle"])
            .env("CLAIMGATE_DB", path)
            .run_with_deadline();
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains(said), "{}", text(&out));
        let mut lock = path.as_os_str().to_owned();
        lock.push(".lock");
        assert!(
            !std::path::Path::new(&lock).exists(),
            "a lock file was made"
        );
    }
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&dir), mode(&notes)), (0o755, 0o644));
    assert!(!w.dir.path().join("nowhere.db").exists() && !planted.exists());
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "not a ledger\n");
}

#[test]
fn a_postgres_address_not_written_as_a_url_is_refused_without_being_repeated() {
    // A libpq key=value string, the scheme in capitals, a space before it, a mistyped or
    // foreign scheme (postgre://, pg://, postgres:/, mysql://): each would have been a local
    // SQLite file named after it, password and all, and named in "no ledger at …". Each is
    // refused (exit 2), its password in no output, and no file is made.
    let w = World::new();
    let secret = "S3cr3tPW";
    for db in [
        format!("host=127.0.0.1 user=postgres password={secret} dbname=ledger"),
        format!("POSTGRES://postgres:{secret}@127.0.0.1/ledger"),
        format!(" postgres://postgres:{secret}@127.0.0.1/ledger"),
        format!("postgre://postgres:{secret}@127.0.0.1/ledger"),
        format!("pg://postgres:{secret}@127.0.0.1/ledger"),
        format!("postgres:/postgres:{secret}@127.0.0.1/ledger"),
        format!("mysql://postgres:{secret}@127.0.0.1/ledger"),
    ] {
        for args in [&["status"][..], &["run", "--exit-when-idle"], &["verify"]] {
            let out = w
                .cmd(args)
                .env("CLAIMGATE_DB", &db)
                .current_dir(w.dir.path())
                .run_with_deadline();
            assert_eq!(
                out.status.code(),
                Some(2),
                "{args:?} {db:?}: {}",
                text(&out)
            );
            assert!(!text(&out).contains(secret), "{}", text(&out));
            assert!(
                text(&out).contains("--db looks like a PostgreSQL address")
                    || text(&out).contains("--db is a URL of a kind claimgate does not take"),
                "{}",
                text(&out)
            );
        }
    }
    let made: Vec<String> = std::fs::read_dir(w.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(secret))
        .collect();
    assert!(made.is_empty(), "files named with the password: {made:?}");
}

#[test]
fn a_metrics_urls_password_shows_in_no_watch_note_and_no_help() {
    let w = World::new();
    w.add(&[submission(1)]);
    w.drain(&[]);
    let secret = "S3cr3tPW";
    // Nothing listens on port 9, and https is not spoken: each note says why there is no
    // commit p99, naming the address or the URL without the password.
    for (url, note) in [
        (
            format!("http://admin:{secret}@127.0.0.1:9/metrics"),
            "\"commit_p99_note\":\"127.0.0.1:9: ",
        ),
        (
            format!("https://admin:{secret}@127.0.0.1:9/metrics"),
            "\"commit_p99_note\":\"https://admin:***@127.0.0.1:9/metrics: only http://",
        ),
    ] {
        let watch = w.spawn(&["status", "--watch", "0.2", "--json", "--metrics-url", &url]);
        assert!(wait_for(std::time::Duration::from_secs(30), || watch
            .log_text()
            .contains("commit_p99_note")));
        let log = watch.log_text();
        assert!(!log.contains(secret), "{log}");
        assert!(log.contains(note), "{log}");
    }
    let help = w
        .cmd(&["status", "--help"])
        .env(
            "CLAIMGATE_METRICS_URL",
            format!("http://admin:{secret}@127.0.0.1:9/metrics"),
        )
        .run_with_deadline();
    assert!(help.status.success());
    assert!(!text(&help).contains(secret), "{}", text(&help));
}

#[test]
fn an_anchors_file_or_audit_log_is_appended_only_to_a_plain_file_of_its_own_kind() {
    // A mistyped --out or --audit-log naming the signing key, its public half, the ledger, a
    // symlink or a FIFO: refused, each left byte for byte as it was, and nothing hangs. The
    // anchors file itself, loosened to 0644, is appended to and made owner-only again.
    use std::os::unix::fs::PermissionsExt;
    let w = World::new();
    w.add(&[submission(1)]);
    w.drain(&[]);
    let path = |name: &str| w.dir.path().join(name);
    let s = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    w.run_ok(&["audit", "keygen", "--out", &s(&path("k"))]);
    let anchors = path("anchors.jsonl");
    w.run_ok(&["audit", "anchor", "--out", &s(&anchors)]);
    std::os::unix::fs::symlink(&anchors, path("link.jsonl")).unwrap();
    let fifo = path("fifo");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);

    let db = s(&w.db);
    for (args, target) in [
        (vec!["audit", "anchor", "--out", &s(&path("k"))], path("k")),
        (vec!["audit", "anchor", "--out", &db], w.db.clone()),
        (
            vec!["audit", "anchor", "--out", &s(&path("link.jsonl"))],
            anchors.clone(),
        ),
        (vec!["audit", "anchor", "--out", &s(&fifo)], fifo.clone()),
        (
            vec!["run", "--exit-when-idle", "--audit-log", &s(&path("k.pub"))],
            path("k.pub"),
        ),
    ] {
        let before = std::fs::symlink_metadata(&target)
            .unwrap()
            .is_file()
            .then(|| std::fs::read(&target).unwrap());
        let out = w.run(&args);
        assert!(!out.status.success(), "{args:?}: {}", text(&out));
        if let Some(before) = before {
            assert_eq!(
                std::fs::read(&target).unwrap(),
                before,
                "{args:?} wrote to it"
            );
        }
    }
    w.run_ok(&["verify"]);

    std::fs::set_permissions(&anchors, std::fs::Permissions::from_mode(0o644)).unwrap();
    w.run_ok(&["audit", "anchor", "--out", &s(&anchors)]);
    assert_eq!(
        std::fs::read_to_string(&anchors).unwrap().lines().count(),
        2
    );
    let mode = std::fs::metadata(&anchors).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    w.run_ok(&["audit", "verify", "--anchors", &s(&anchors)]);
}
