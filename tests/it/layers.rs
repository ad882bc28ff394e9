//! The architecture, checked: every module's dependencies point one way, down the layers that
//! ARCHITECTURE.md draws, and no file depends on another that depends back on it.
//!
//! The check reads `src/` as text. Each file is a node named by its module path; an edge is any
//! `crate::…`, `super::…` or `self::…` path, or a bare path starting with one of the file's own
//! child modules (`use batch::Batch;` in `sqlite/mod.rs`), in a `use` or inline, that resolves
//! to another file's module. Declaring a child (`mod x;`) and re-exporting it (`pub use x::Y;`)
//! are not edges: a facade that names its children is how a folder keeps them private, not a
//! dependency on them. So a `mod.rs` that only declares and re-exports depends on nothing, and a
//! working type in a `mod.rs` that its children import shows up as the cycle it is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the top-level modules it may use. Anything missing from a list is
/// forbidden; a new module must be placed here before it can be used.
const LAYERS: &[(&str, &[&str])] = &[
    ("domain", &[]),
    ("error", &["domain"]),
    ("support", &["error"]),
    // `config` parses where the ledger is (`config/location.rs`), and hides a URL's password
    // with `support::redact`, the one redactor.
    ("config", &["error", "support"]),
    // `retry` waits out its backoff on `support::Shutdown`, so a stop cuts a wait short.
    ("retry", &["config", "error", "support"]),
    ("broker", &["domain", "config", "error", "retry", "support"]),
    ("ledger", &["domain", "config", "error", "retry", "support"]),
    // `observe` sits above `ops`: `/metrics` and `/healthz` serve `ops::status`'s snapshot.
    (
        "observe",
        &[
            "domain", "config", "error", "support", "broker", "ledger", "ops",
        ],
    ),
    (
        "worker",
        &[
            "domain", "config", "error", "retry", "support", "broker", "ledger", "observe",
        ],
    ),
    (
        "relay",
        &[
            "domain", "config", "error", "retry", "support", "broker", "ledger",
        ],
    ),
    (
        "ops",
        &[
            "domain", "config", "error", "retry", "support", "broker", "ledger",
        ],
    ),
    (
        "demo",
        &[
            "domain", "config", "error", "retry", "support", "broker", "ledger", "observe", "ops",
            "relay", "worker",
        ],
    ),
    (
        "cli",
        &[
            "domain", "config", "error", "retry", "support", "broker", "ledger", "observe", "ops",
            "relay", "worker", "demo",
        ],
    ),
];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every library source file under `src/` (not `main.rs`), by module path (`["ledger",
/// "sqlite", "batch"]`; `lib.rs` is `[]`, a `mod.rs` names its folder).
fn modules() -> BTreeMap<Vec<String>, String> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<Vec<String>, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                let mut p = prefix.to_vec();
                p.push(name);
                walk(&path, &p, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let mut module = prefix.to_vec();
                match name.as_str() {
                    "mod" => {}
                    "lib" if prefix.is_empty() => {}
                    "main" if prefix.is_empty() => continue,
                    _ => module.push(name),
                }
                out.insert(module, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&src_dir(), &[], &mut out);
    out
}

/// Source without comments, `#[cfg(test)]` modules (tests may reach anywhere they like in
/// their own file), string literals, or re-export and `mod` lines.
fn code_of(source: &str) -> String {
    let source = match source.find("#[cfg(test)]\nmod tests") {
        Some(i) => &source[..i],
        None => source,
    };
    let mut out = String::new();
    for line in source.lines() {
        let line = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let t = line.trim_start();
        let reexport = ["pub use ", "pub(crate) use ", "pub(super) use "];
        if reexport.iter().any(|r| t.starts_with(r))
            || t.starts_with("mod ")
            || t.starts_with("pub mod ")
        {
            continue;
        }
        // Strings may mention `crate::` (log targets, messages); blank them, keeping quotes.
        let mut in_str = false;
        let mut prev = ' ';
        for ch in line.chars() {
            if ch == '"' && prev != '\\' {
                in_str = !in_str;
                out.push('"');
            } else if !in_str {
                out.push(ch);
            }
            prev = ch;
        }
        out.push('\n');
    }
    out
}

/// Expands one `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').expect("balanced braces")];
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, ch) in inner.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| format!("{prefix}{p}"))
        .collect()
}

/// Every `crate::`/`super::`/`self::` path a file's code names, and every bare path that
/// starts with one of its own `children` (`use batch::Batch;`, `batch::record(…)` in a
/// `mod.rs`), as module-path segments from the root.
fn paths_named(
    module: &[String],
    is_mod_rs: bool,
    children: &[String],
    code: &str,
) -> Vec<Vec<String>> {
    let mut raw = Vec::new();
    // `use` statements, which may group paths in braces over several lines.
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().last();
        rest = &rest[i + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest.find(';').unwrap_or(rest.len());
        let tree: String = rest[..end].split_whitespace().collect();
        raw.extend(expand(&tree));
        rest = &rest[end..];
    }
    // Inline paths such as `crate::domain::clock::now_rfc3339()`, or `batch::record(…)` in the
    // parent of `batch`.
    let bare: Vec<String> = children.iter().map(|c| format!("{c}::")).collect();
    let starts = ["crate::", "super::", "self::"]
        .into_iter()
        .map(str::to_string)
        .chain(bare);
    for start in starts {
        let start = start.as_str();
        let mut at = 0;
        while let Some(i) = code[at..].find(start) {
            let i = at + i;
            let before = code[..i].chars().last();
            let end = code[i..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| i + e);
            // A `…::{` is a `use` tree, which the `use` parse above expands.
            let tree = code[end..].starts_with('{');
            if !tree && !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                raw.push(code[i..end].to_string());
            }
            at = end;
        }
    }
    // `super` is the parent of the file's module; in a `mod.rs` the module is the folder.
    let parent: Vec<String> = if is_mod_rs || module.is_empty() {
        module[..module.len().saturating_sub(1)].to_vec()
    } else {
        module[..module.len() - 1].to_vec()
    };
    raw.into_iter()
        .filter_map(|p| {
            let segs: Vec<String> = p
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            match segs.first().map(String::as_str) {
                Some("crate") => Some(segs[1..].to_vec()),
                Some("super") => {
                    let mut base = parent.clone();
                    base.extend(segs[1..].iter().filter(|s| *s != "super").cloned());
                    Some(base)
                }
                Some("self") => Some([module, &segs[1..]].concat()),
                Some(first) if children.iter().any(|c| c == first) => {
                    Some([module, &segs[..]].concat())
                }
                _ => None,
            }
        })
        .collect()
}

/// The dependency graph between files: module path → module paths it uses.
fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let modules = modules();
    let root = src_dir();
    let mut edges = BTreeMap::new();
    for (module, source) in &modules {
        let is_mod_rs = !module.is_empty() && root.join(module.join("/")).join("mod.rs").exists();
        let children: Vec<String> = modules
            .keys()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .map(|m| m[module.len()].clone())
            .collect();
        let mut uses = BTreeSet::new();
        for path in paths_named(module, is_mod_rs, &children, &code_of(source)) {
            // The longest prefix that is a file of ours is the module depended on.
            let target = (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| modules.contains_key(p));
            if let Some(t) = target.filter(|t| t != module && !t.is_empty()) {
                uses.insert(t);
            }
        }
        edges.insert(module.clone(), uses);
    }
    edges
}

/// A cycle in `edges`, if there is one, as the modules along it.
fn find_cycle<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Option<Vec<N>> {
    fn visit<N: Ord + Clone>(
        n: &N,
        edges: &BTreeMap<N, BTreeSet<N>>,
        state: &mut BTreeMap<N, bool>,
        stack: &mut Vec<N>,
    ) -> Option<Vec<N>> {
        match state.get(n) {
            Some(true) => return None,
            Some(false) => {
                let from = stack.iter().position(|m| m == n).unwrap();
                let mut cycle = stack[from..].to_vec();
                cycle.push(n.clone());
                return Some(cycle);
            }
            None => {}
        }
        state.insert(n.clone(), false);
        stack.push(n.clone());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(n.clone(), true);
        None
    }
    let mut state = BTreeMap::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut state, &mut Vec::new()))
}

#[test]
fn no_file_depends_on_a_file_that_depends_back_on_it() {
    let cycle = find_cycle(&graph());
    assert!(
        cycle.is_none(),
        "import cycle: {}",
        cycle
            .unwrap()
            .iter()
            .map(|m| m.join("::"))
            .collect::<Vec<_>>()
            .join(" -> ")
    );
}

#[test]
fn every_top_level_module_uses_only_the_layers_below_it() {
    let allowed: BTreeMap<&str, &[&str]> = LAYERS.iter().copied().collect();
    let mut violations = Vec::new();
    for (module, uses) in graph() {
        let Some(top) = module.first() else { continue };
        let Some(may) = allowed.get(top.as_str()) else {
            violations.push(format!("src/{top} is not placed in LAYERS"));
            continue;
        };
        for used in uses {
            let other = &used[0];
            if other != top && !may.contains(&other.as_str()) {
                violations.push(format!("{} uses {}", module.join("::"), used.join("::")));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "layer violations:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_checker_sees_uses_and_catches_a_cycle() {
    // The parser: grouped, nested and `super` paths all resolve.
    let module = vec![
        "ledger".to_string(),
        "sqlite".to_string(),
        "batch".to_string(),
    ];
    let code = "use crate::{domain::{key, audit::Kind}, error::Result};\nuse super::multirow;\nfn f() { crate::domain::clock::now_rfc3339(); }\n";
    let named = paths_named(&module, false, &[], code);
    let has = |p: &str| named.contains(&p.split("::").map(str::to_string).collect());
    assert!(has("domain::key") && has("domain::audit::Kind") && has("error::Result"));
    assert!(has("ledger::sqlite::multirow") && has("domain::clock::now_rfc3339"));
    // A parent's bare paths into its own children resolve; other bare paths (crates) do not.
    let parent = vec!["ledger".to_string(), "sqlite".to_string()];
    let code =
        "use batch::{Batch, Context};\nuse rusqlite::Connection;\nfn g() { raw::Id::of(); }\n";
    let named = paths_named(&parent, true, &["batch".into(), "raw".into()], code);
    let has = |p: &str| named.contains(&p.split("::").map(str::to_string).collect());
    assert!(has("ledger::sqlite::batch::Batch") && has("ledger::sqlite::raw::Id::of"));
    assert!(!named.iter().any(|p| p.contains(&"rusqlite".to_string())));
    // The cycle finder: a -> b -> a is found, a -> b -> c is not.
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    edges.insert("a", ["b"].into());
    edges.insert("b", ["c"].into());
    edges.insert("c", BTreeSet::new());
    assert_eq!(find_cycle(&edges), None);
    edges.insert("c", ["a"].into());
    assert_eq!(find_cycle(&edges), Some(vec!["a", "b", "c", "a"]));
    // And the graph of the real tree is not empty: the checks above look at something.
    let g = graph();
    assert!(g.len() > 20 && g.values().map(BTreeSet::len).sum::<usize>() > 50);
    assert!(g[&vec!["worker".to_string(), "run".to_string()]]
        .iter()
        .any(|m| m.first().is_some_and(|t| t == "ledger")));
}

/// True when `code` names crate `krate` as a path root (`krate::…`, `use krate`), not as the
/// tail of a longer path (`crate::ledger::postgres::…`) or of a longer name.
fn names_crate(code: &str, krate: &str) -> bool {
    code.match_indices(krate).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = &code[i + krate.len()..];
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            && (after.starts_with("::") || after.starts_with(';') || after.starts_with(" as"))
    })
}

#[test]
fn each_ledger_backends_crate_is_named_only_in_its_own_folder() {
    // ARCHITECTURE.md, `src/ledger/`: nothing outside `ledger/sqlite/` (and the open step)
    // names SQLite, nothing outside `ledger/postgres/` (and the open step) names PostgreSQL,
    // and `error` names neither: a backend's errors reach it as `Error::Ledger`. The one
    // exception is `support/localpostgres.rs`, which runs the tests' private cluster.
    let homes: [(&str, &[&str]); 3] = [
        ("rusqlite", &["ledger::sqlite", "ledger::open"]),
        ("r2d2_sqlite", &["ledger::sqlite", "ledger::open"]),
        (
            "postgres",
            &["ledger::postgres", "ledger::open", "support::localpostgres"],
        ),
    ];
    let mut strays = Vec::new();
    for (module, source) in modules() {
        let path = module.join("::");
        let code = code_of(&source);
        for (krate, allowed) in homes {
            let at_home = allowed.iter().any(|home| path.starts_with(home));
            if !at_home && names_crate(&code, krate) {
                strays.push(format!("{path} names {krate}"));
            }
        }
    }
    assert!(strays.is_empty(), "{}", strays.join("\n"));
    assert!(names_crate("use rusqlite::Connection;", "rusqlite"));
    assert!(!names_crate(
        "crate::ledger::postgres::PgLedger",
        "postgres"
    ));
    assert!(!names_crate("tokio_postgres::Client", "postgres"));
}
