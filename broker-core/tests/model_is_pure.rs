//! The model (`src/model/`) stays pure: its modules import no runtime crate
//! (tokio, futures, metrics, tracing), no I/O (`std::fs`, `std::net`,
//! `std::io`, `std::process`), nothing of the crate outside the model, and
//! no model module imports another in a loop.
//!
//! The check reads the source files, so it sees what the compiler would
//! accept. `BROKER_MODEL_DIR` points it at another folder of modules (one
//! file or folder per module; `crate::x` naming a module of that folder
//! counts as a model import, as `super::x` and `crate::model::x` do).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Paths a model module must not name: runtime crates and I/O.
const FORBIDDEN: &[&str] = &[
    "tokio",
    "futures",
    "async_trait",
    "metrics",
    "tracing",
    "toml",
    "serde_norway",
    "serde_path_to_error",
    "std::fs",
    "std::net",
    "std::io",
    "std::process",
    "std::env",
    "std::thread",
];

/// One module's source, as the check reads it.
struct Module {
    name: String,
    code: String,
}

/// What is wrong with a set of modules: forbidden imports, then a cycle.
fn problems(modules: &[Module]) -> Vec<String> {
    let names: BTreeSet<&str> = modules.iter().map(|m| m.name.as_str()).collect();
    let mut out = Vec::new();
    let mut edges: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for m in modules {
        for path in paths(&m.code) {
            if let Some(bad) = FORBIDDEN
                .iter()
                .find(|f| path == **f || path.starts_with(&format!("{f}::")))
            {
                out.push(format!("{}: imports {bad} ({path})", m.name));
                continue;
            }
            let mut parts = path.split("::");
            let target = match (parts.next(), parts.next(), parts.next()) {
                (Some("crate"), Some("model"), Some(x)) => x,
                (Some("crate"), Some(x), _) if names.contains(x) => x,
                (Some("crate"), Some(x), _) => {
                    out.push(format!("{}: imports crate::{x}, outside the model", m.name));
                    continue;
                }
                (Some("super"), Some(x), _) => x,
                _ => continue,
            };
            if names.contains(target) && target != m.name {
                edges.entry(&m.name).or_default().insert(target.to_owned());
            }
        }
    }
    out.dedup();
    out.extend(cycle(&edges).map(|c| format!("cycle: {}", c.join(" -> "))));
    out
}

/// The paths named in `code`: each run of `word::word::...` that starts
/// with `crate`, `super`, `std` or a forbidden crate, through `use` lists
/// (`use super::{a, b::c}` names `super::a` and `super::b::c`).
fn paths(code: &str) -> Vec<String> {
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && (ident(bytes[i]) || code[i..].starts_with("::")) {
            i += if bytes[i] == b':' { 2 } else { 1 };
        }
        let path = &code[start..i];
        let root = path.split("::").next().unwrap_or("");
        let rooted = ["crate", "super", "std"].contains(&root)
            || FORBIDDEN.iter().any(|f| f.split("::").next() == Some(root));
        if !rooted || !path.contains("::") {
            continue;
        }
        if path.ends_with("::") && code[i..].starts_with('{') {
            let end = closing_brace(code, i);
            for item in split_top(&code[i + 1..end]) {
                expand(path.trim_end_matches("::"), item, &mut out);
            }
            i = end;
        } else {
            out.push(path.trim_end_matches("::").to_owned());
        }
    }
    out
}

/// The paths one item of a `use` list under `prefix` names.
fn expand(prefix: &str, item: &str, out: &mut Vec<String>) {
    let item = item.trim();
    if let Some(open) = item.find('{') {
        let head: String = item[..open].split_whitespace().collect();
        let prefix = format!("{prefix}::{}", head.trim_end_matches("::"));
        let end = closing_brace(item, open);
        for sub in split_top(&item[open + 1..end]) {
            expand(&prefix, sub, out);
        }
        return;
    }
    match item.split_whitespace().next() {
        Some("self") => out.push(prefix.to_owned()),
        Some(name) => out.push(format!("{prefix}::{name}")),
        None => {}
    }
}

/// The index of the `}` closing the `{` at `open`.
fn closing_brace(code: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// The comma-separated items of a `use` list, nested lists kept whole.
fn split_top(list: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in list.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&list[start..]);
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

/// A cycle in `edges`, as the modules along it, the first one repeated.
fn cycle(edges: &BTreeMap<&str, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<&str, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut c = stack[at..].to_vec();
            c.push(node.to_owned());
            return Some(c);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, edges, done, stack) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut done, &mut Vec::new()))
}

/// The library code of a source file: comments and the `#[cfg(test)]`
/// module at its end left out.
fn library_code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or(text);
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules of `dir`: one per `.rs` file but `mod.rs`, one per folder
/// (all its files read as one module, but `tests.rs`, its test module).
fn modules_in(dir: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let code = files_under(&path)
                .iter()
                .filter(|f| f.file_name().is_none_or(|n| n != "tests.rs"))
                .map(|f| {
                    // `super::` in a file below the folder's `mod.rs` names
                    // the folder's own module.
                    let code = library_code(&std::fs::read_to_string(f).unwrap());
                    match f.file_name().is_some_and(|n| n == "mod.rs") {
                        true => code,
                        false => code.replace("super::", "crate::model::__self__::"),
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            out.push(Module { name, code });
        } else if path.extension().is_some_and(|e| e == "rs") && name != "mod" {
            let code = library_code(&std::fs::read_to_string(&path).unwrap());
            out.push(Module { name, code });
        }
    }
    out
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

#[test]
fn the_model_imports_no_runtime_no_io_and_no_module_in_a_loop() {
    let dir = std::env::var_os("BROKER_MODEL_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("src/model"),
        PathBuf::from,
    );
    let modules = modules_in(&dir);
    assert!(modules.len() >= 8, "{}: too few modules", dir.display());
    let problems = problems(&modules);
    assert!(
        problems.is_empty(),
        "{}:\n{}",
        dir.display(),
        problems.join("\n")
    );
}

fn module(name: &str, code: &str) -> Module {
    Module {
        name: name.to_owned(),
        code: library_code(code),
    }
}

#[test]
fn the_check_finds_a_cycle() {
    let modules = [
        module("bucket", "use super::state::{Decision, DenyReason};"),
        module(
            "state",
            "use super::{bucket::{self, BucketParams}, limits::Cost};",
        ),
        module("limits", "use crate::model::time::micros;"),
        module("time", "pub type Micros = u64;"),
    ];
    assert_eq!(problems(&modules), ["cycle: bucket -> state -> bucket"]);
}

#[test]
fn the_check_finds_a_cycle_through_crate_paths_and_full_paths() {
    let modules = [
        module(
            "limits",
            "#[serde(try_from = \"x\")] fn f() { crate::observed::g() }",
        ),
        module("observed", "fn g() -> crate::limits::Unit { todo!() }"),
    ];
    assert_eq!(problems(&modules), ["cycle: limits -> observed -> limits"]);
}

#[test]
fn the_check_finds_runtime_io_and_outside_imports() {
    let modules = [
        module(
            "retry",
            "use tokio::time::sleep;\nuse std::{fs, time::Duration};",
        ),
        module("headers", "fn f() { tracing::debug!(\"x\"); }"),
        module(
            "limits",
            "use crate::config::LimitsConfig;\nuse crate::error::E;",
        ),
        module(
            "error",
            "// tokio::spawn in a comment is fine\npub struct E;",
        ),
    ];
    assert_eq!(
        problems(&modules),
        [
            "retry: imports tokio (tokio::time::sleep)",
            "retry: imports std::fs (std::fs)",
            "headers: imports tracing (tracing::debug)",
            "limits: imports crate::config, outside the model",
        ]
    );
}

#[test]
fn test_modules_and_comments_are_not_read() {
    let modules = [module(
        "bucket",
        "/// Uses [`crate::broker`].\nfn f() {}\n#[cfg(test)]\nmod tests { use tokio::test; }",
    )];
    assert!(problems(&modules).is_empty());
}
