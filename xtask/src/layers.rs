//! The layers of each crate's top-level modules (ARCHITECTURE.md, "Invariants"): a module may
//! name, through `crate::`, only modules declared below it, so every crate's module graph runs
//! one way and has no cycle. `cargo xtask tidy` runs [`upward_uses`] on every crate listed in
//! [`CRATES`]; a top-level module that is not declared is refused too, so a new one takes its
//! place in the order when it is added.

use anyhow::{Context, Result};
use std::path::Path;

/// A crate's source folder and its top-level modules, lowest layer first.
pub struct Layers {
    pub src: &'static str,
    pub order: &'static [&'static str],
}

/// The crates whose layers are checked: every crate with modules (xtask's own are flat).
pub const CRATES: [Layers; 7] = [
    Layers {
        src: "shared/src",
        order: &[
            "hash",
            "units",
            "model",
            "allocator",
            "whatif",
            "ranks",
            "rank_files",
            "analysis",
            "report",
            "export",
            "import",
            "merge",
            "explore",
        ],
    },
    Layers { src: "protocol/src", order: &["frames", "summary", "trace", "jobs", "worker", "run", "api"] },
    Layers { src: "record/src", order: &["layout", "sys", "live", "assemble"] },
    Layers { src: "traceio/src", order: &["read_ahead", "files", "parquet", "text", "plots", "folders"] },
    Layers { src: "capture/src", order: &["session", "models", "run", "sweep", "tracer", "cli"] },
    Layers { src: "collector/src", order: &["objects", "capture_binary", "report", "verify", "pyrun", "mcp", "serve", "commands", "cli"] },
    Layers {
        src: "viewer/src",
        order: &["dom", "ring", "messages", "widgets", "perf", "http", "charts", "tables", "state", "bridge", "server", "components"],
    },
];

/// `file:line: a uses crate::b` for every use of a higher layer, and a line for every
/// top-level module missing from the order (or named there and missing).
pub fn upward_uses(root: &Path, layers: &Layers) -> Result<Vec<String>> {
    let src = root.join(layers.src);
    let mut found = Vec::new();
    let modules = top_level_modules(&src)?;
    for m in &modules {
        if !layers.order.contains(&m.as_str()) {
            found.push(format!("{}: module `{m}` is not in xtask/src/layers.rs's order for this crate", layers.src));
        }
    }
    for m in layers.order {
        if !modules.iter().any(|x| x == m) {
            found.push(format!("{}: xtask/src/layers.rs names `{m}`, which is not a module here", layers.src));
        }
    }
    let root = root_items(&src)?;
    for file in crate::rust_files(&src)? {
        let rel = file.strip_prefix(&src).unwrap_or(&file);
        let mut parts = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned());
        let first = parts.next().unwrap_or_default();
        let top = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
        let Some(rank) = layers.order.iter().position(|l| *l == top) else { continue }; // lib.rs, main.rs, bin/: the root
        let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let code = strip_comments(&text);
        for (at, name) in crate_uses(&code) {
            let line = || code[..at].matches('\n').count() + 1;
            // A name that is no module is the root's: a re-export stands for its module; an
            // item the root defines sits above every layer (the root declares them all).
            let module = if layers.order.contains(&name.as_str()) { Some(name.clone()) } else { root.reexports.get(&name).cloned() };
            match module {
                Some(m) if layers.order.iter().position(|l| *l == m).is_some_and(|r| r > rank) => {
                    found.push(format!("{}:{}: {top} uses crate::{name}, a layer above it", file.display(), line()));
                }
                None if root.defined.contains(&name) => found.push(format!(
                    "{}:{}: {top} uses crate::{name}, which the crate root defines (the root is above every layer: move it into a module)",
                    file.display(),
                    line()
                )),
                _ => {}
            }
        }
    }
    Ok(found)
}

/// What a crate root (`lib.rs`, else `main.rs`) gives its modules: the names it re-exports,
/// each with the module it comes from (`pub use model::Trace;`), and the items it defines.
#[derive(Default)]
struct RootItems {
    reexports: std::collections::BTreeMap<String, String>,
    defined: std::collections::BTreeSet<String>,
}

fn root_items(src: &Path) -> Result<RootItems> {
    let mut out = RootItems::default();
    let Some(file) = ["lib.rs", "main.rs"].iter().map(|f| src.join(f)).find(|p| p.is_file()) else { return Ok(out) };
    let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let code = strip_comments(text.split("#[cfg(test)]").next().unwrap_or(""));
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    for line in code.lines() {
        let line = line.trim();
        // Items at the root's top level only: nested ones start indented.
        let unindented = !line.is_empty();
        let rest = line.strip_prefix("pub(crate) ").or_else(|| line.strip_prefix("pub ")).unwrap_or(line);
        if let Some(path) = rest.strip_prefix("use ") {
            let path = path.trim_end_matches(';').trim_start_matches("crate::").trim_start_matches("self::");
            let module = ident(path);
            let tail = &path[module.len()..];
            let names: Vec<String> = match (tail.find('{'), tail.rfind("::")) {
                (Some(open), _) => tail[open + 1..].trim_end_matches('}').split(',').map(|n| last_name(n.trim())).collect(),
                (None, Some(sep)) => vec![last_name(&tail[sep + 2..])],
                (None, None) => vec![],
            };
            for n in names.into_iter().filter(|n| !n.is_empty() && n != "self") {
                out.reexports.insert(n, module.clone());
            }
            continue;
        }
        for kw in ["fn ", "struct ", "enum ", "const ", "static ", "type ", "trait ", "union ", "async fn ", "unsafe fn ", "macro_rules! "]
        {
            if let Some(after) = rest.strip_prefix(kw) {
                let name = ident(after.trim_start_matches("mut "));
                if unindented && !name.is_empty() {
                    out.defined.insert(name);
                }
            }
        }
        // `thread_local! { static X: ... }` at the root: its statics are root items.
        if let Some(after) = rest.strip_prefix("static ").or_else(|| line.strip_prefix("static ")) {
            out.defined.insert(ident(after.trim_start_matches("mut ")));
        }
    }
    Ok(out)
}

/// The name a `use` path's last segment brings in (`a::B as C` brings `C`).
fn last_name(segment: &str) -> String {
    let s = segment.rsplit("::").next().unwrap_or(segment);
    s.split(" as ").last().unwrap_or(s).trim().to_owned()
}

/// Top-level module names of a crate's source folder: its `.rs` files (but the crate roots)
/// and its folders.
fn top_level_modules(src: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(src).with_context(|| format!("cannot list {}", src.display()))? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if path.is_dir() {
            if name != "bin" {
                out.push(name);
            }
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" && stem != "main" {
                out.push(stem.to_owned());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The text with every comment (`//` to the line's end, `/* */` nested) blanked, and `//`
/// inside string literals (`"s3://"`, raw strings) left alone; lines are kept, so offsets
/// still give line numbers.
pub fn strip_comments(text: &str) -> String {
    lex(text, false)
}

/// [`strip_comments`], with the contents of string literals left out as well (their quotes
/// and line breaks kept): code alone, for rules about what code names.
pub fn strip_comments_and_strings(text: &str) -> String {
    lex(text, true)
}

fn lex(text: &str, blank_strings: bool) -> String {
    #[derive(Clone, Copy, PartialEq)]
    enum In {
        Code,
        Str,
        Raw(usize),
        Line,
        Block(usize),
    }
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut state = In::Code;
    let mut i = 0;
    while i < b.len() {
        let was = state;
        let c = b[i];
        let next = b.get(i + 1).copied();
        match state {
            In::Code => {
                if c == b'/' && next == Some(b'/') {
                    state = In::Line;
                    i += 2;
                    continue;
                }
                if c == b'/' && next == Some(b'*') {
                    state = In::Block(1);
                    i += 2;
                    continue;
                }
                if c == b'"' {
                    state = In::Str;
                } else if c == b'r' && (next == Some(b'"') || next == Some(b'#')) && (i == 0 || !is_ident(b[i - 1])) {
                    let hashes = b[i + 1..].iter().take_while(|&&x| x == b'#').count();
                    if b.get(i + 1 + hashes) == Some(&b'"') {
                        out.push_str(&text[i..i + 2 + hashes]);
                        i += 2 + hashes;
                        state = In::Raw(hashes);
                        continue;
                    }
                } else if c == b'\'' {
                    // A char literal ('"', '\''), not a lifetime: copied whole.
                    let len = if next == Some(b'\\') {
                        b[i + 2..].iter().position(|&x| x == b'\'').map(|p| p + 3)
                    } else {
                        (b.get(i + 2) == Some(&b'\'')).then_some(3)
                    };
                    if let Some(len) = len {
                        out.push_str(&text[i..i + len]);
                        i += len;
                        continue;
                    }
                }
            }
            In::Str => {
                if c == b'\\' {
                    let escape = &text[i..(i + 2).min(b.len())];
                    out.push_str(if blank_strings {
                        if escape.ends_with('\n') {
                            "\n"
                        } else {
                            ""
                        }
                    } else {
                        escape
                    });
                    i += 2;
                    continue;
                }
                if c == b'"' {
                    state = In::Code;
                }
            }
            In::Raw(hashes) => {
                if c == b'"' && b[i + 1..].iter().take(hashes).filter(|&&x| x == b'#').count() == hashes {
                    out.push_str(&text[i..i + 1 + hashes]);
                    i += 1 + hashes;
                    state = In::Code;
                    continue;
                }
            }
            In::Line => {
                if c == b'\n' {
                    state = In::Code;
                    out.push('\n');
                }
                i += 1;
                continue;
            }
            In::Block(depth) => {
                if c == b'*' && next == Some(b'/') {
                    state = if depth == 1 { In::Code } else { In::Block(depth - 1) };
                    i += 2;
                    continue;
                }
                if c == b'/' && next == Some(b'*') {
                    state = In::Block(depth + 1);
                    i += 2;
                    continue;
                }
                if c == b'\n' {
                    out.push('\n');
                }
                i += 1;
                continue;
            }
        }
        // Copy one whole character (the text is UTF-8; only ASCII bytes steer the states), but
        // a string's contents where they are blanked.
        let len = text[i..].chars().next().map_or(1, char::len_utf8);
        let inside = |s: In| matches!(s, In::Str | In::Raw(_));
        if !(blank_strings && inside(was) && inside(state) && c != b'\n') {
            out.push_str(&text[i..i + len]);
        }
        i += len;
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// (offset, module) of every module named after `crate::`, `crate::{a, b::c}` lists included.
fn crate_uses(code: &str) -> Vec<(usize, String)> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            let inner = &list[..list.find('}').unwrap_or(list.len())];
            out.extend(inner.split(',').map(|s| (at, ident(s.trim()))).filter(|(_, n)| !n.is_empty()));
        } else {
            out.push((at, ident(rest)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_go_and_strings_stay() {
        let code = "let a = \"s3://x\"; // gone\nlet b = r#\"//\"#; /* gone\n /* nested */ still */ let c = '\"';\nlet d = '\\''; // x";
        assert_eq!(strip_comments(code), "let a = \"s3://x\"; \nlet b = r#\"//\"#; \n let c = '\"';\nlet d = '\\''; ");
        assert_eq!(strip_comments_and_strings(code), "let a = \"\"; \nlet b = r#\"\"#; \n let c = '\"';\nlet d = '\\''; ");
    }

    #[test]
    fn uses_are_found_in_paths_and_lists_and_not_in_comments() {
        let code =
            strip_comments("use crate::model::Trace; // crate::merge\nuse crate::{analysis, export::x};\nlet _ = crate::ranks::f();");
        let names: Vec<String> = crate_uses(&code).into_iter().map(|(_, n)| n).collect();
        assert_eq!(names, ["model", "analysis", "export", "ranks"]);
    }

    /// [`upward_uses`] of a crate made of `files` (path under `src/`, text), layers `low`
    /// then `high`.
    fn planted(name: &str, files: &[(&str, &str)]) -> Vec<String> {
        let root = std::env::temp_dir().join(format!("xtask-layers-{name}-{}", std::process::id()));
        for (path, text) in files {
            let path = root.join("src").join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let found = upward_uses(&root, &Layers { src: "src", order: &["low", "high"] }).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        found
    }

    #[test]
    fn a_use_of_a_higher_layer_and_an_undeclared_module_are_refused() {
        let found = planted(
            "plain",
            &[
                ("lib.rs", "//! root\npub mod low;\n"),
                ("low.rs", "//! low\nuse crate::high::X; // crate::low\n"),
                ("high/mod.rs", "//! high\nuse crate::low;\n"),
                ("stray.rs", "//! stray\n"),
            ],
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("module `stray` is not in"), "{found:?}");
        assert!(found[1].ends_with("low.rs:2: low uses crate::high, a layer above it"), "{found:?}");
    }

    /// The hole the viewer had: `perf.rs` called `crate::warmup_drawn`, a function of the crate
    /// root that called back into `bridge`. A root's own items are above every layer; what it
    /// re-exports stands for the module it comes from.
    #[test]
    fn an_item_of_the_crate_root_is_above_every_layer_and_a_reexport_is_its_module() {
        let found = planted(
            "root",
            &[
                (
                    "lib.rs",
                    "//! root\npub mod low;\npub mod high;\npub use high::Shown;\npub use low::{Base, Other as Renamed};\n\npub fn warmup_drawn() {}\nthread_local! {\n    static STATE: u8 = 0;\n}\n",
                ),
                ("low.rs", "//! low\nfn f() { crate::warmup_drawn(); }\nuse crate::Shown;\nuse crate::{Base, Renamed};\n"),
                ("high.rs", "//! high\nuse crate::Base;\nuse crate::warmup_drawn;\n"),
            ],
        );
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].ends_with("high.rs:3: high uses crate::warmup_drawn, which the crate root defines (the root is above every layer: move it into a module)"), "{found:?}");
        assert!(found[1].ends_with("low.rs:2: low uses crate::warmup_drawn, which the crate root defines (the root is above every layer: move it into a module)"), "{found:?}");
        assert!(found[2].ends_with("low.rs:3: low uses crate::Shown, a layer above it"), "{found:?}");
    }
}
