//! The layers of each module tree (ARCHITECTURE.md, "Invariants"): every crate's top-level
//! modules, and the modules of `collector serve` ([`SERVE`]), lowest layer first. A module may
//! name, through `crate::` or `super::`, only layers declared below its own, and never an item
//! that the tree's root (`lib.rs` or `main.rs`, or the folder's `mod.rs`) defines, so every
//! module graph runs one way and has no cycle. `cargo xtask tidy` runs [`upward_uses`] on every
//! tree in [`LAYERED`]; a module that is not declared is refused too, so a new one takes its
//! place in the order when it is added. A part of a module may take a layer of its own
//! (`ranks::merge`, above the analyses that the rest of `ranks` sits below): the part and what
//! is in it are that layer, the rest of the module its own.

use crate::source::{rust_files, strip_comments};
use anyhow::{Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module tree's folder (a crate's `src/`, or a module's folder inside it) and its modules,
/// lowest layer first.
pub struct Layers {
    pub src: &'static str,
    /// Top-level modules, and parts of them with a layer of their own (`ranks::merge`).
    pub order: &'static [&'static str],
}

impl Layers {
    /// The tree's module path from its crate's root (`serve` for `collector/src/serve`); none
    /// for a crate's `src/`.
    fn module(&self) -> Vec<String> {
        self.src.split_once("/src/").map(|(_, m)| m.split('/').map(str::to_owned).collect()).unwrap_or_default()
    }

    /// Whether the tree is a whole crate (its root is `lib.rs` or `main.rs`, not `mod.rs`).
    pub fn is_crate(&self) -> bool {
        self.module().is_empty()
    }
}

/// `collector serve`'s modules: each may use only those before it, and `mod.rs`, the app,
/// uses them all. The layers before `error` name no HTTP (`tidy.rs`).
pub const SERVE: Layers =
    Layers { src: "collector/src/serve", order: &["store", "fault", "isolate", "jobs", "state", "error", "api", "docs"] };

/// The trees whose layers are checked: every crate with modules, and `collector serve`.
pub const LAYERED: [Layers; 9] = [
    Layers {
        src: "shared/src",
        order: &[
            "hash",
            "units",
            "model",
            "allocator",
            "whatif",
            "ranks",
            "analysis",
            "report",
            "export",
            "import",
            "ranks::merge",
            "explore",
        ],
    },
    Layers { src: "protocol/src", order: &["frames", "summary", "trace", "jobs", "worker", "run", "api"] },
    Layers { src: "record/src", order: &["layout", "sys", "live", "assemble"] },
    Layers { src: "traceio/src", order: &["read_ahead", "files", "parquet", "advice_text", "text", "plots", "folders"] },
    Layers { src: "capture/src", order: &["session", "models", "run", "sweep", "tracer", "cli"] },
    Layers {
        src: "collector/src",
        order: &["objects", "capture_binary", "viewer_assets", "verify", "pyrun", "mcp", "serve", "commands", "cli"],
    },
    Layers {
        src: "viewer/src",
        order: &["dom", "ring", "messages", "widgets", "perf", "http", "charts", "tables", "state", "bridge", "server", "components"],
    },
    Layers {
        src: "xtask/src",
        order: &[
            "source",
            "cmd",
            "jobs",
            "cache",
            "torches",
            "install",
            "viewer",
            "wheel",
            "bench",
            "fuzz",
            "gpu",
            "main_job",
            "doc_paths",
            "untyped_json",
            "fn_length",
            "layers",
            "cycles",
            "python_rules",
            "tidy",
            "check",
            "testing",
        ],
    },
    SERVE,
];

/// `file:line: a uses crate::b` (or `super::b`) for every use of a higher layer or of an item
/// the tree's root defines, and a line for every module missing from the order (or named
/// there and missing).
pub fn upward_uses(root: &Path, layers: &Layers) -> Result<Vec<String>> {
    let src = root.join(layers.src);
    let mut found = Vec::new();
    let modules = top_level_modules(&src)?;
    for m in &modules {
        if !layers.order.contains(&m.as_str()) {
            found.push(format!("{}: module `{m}` is not in xtask/src/layers.rs's order for this tree", layers.src));
        }
    }
    for m in layers.order {
        let here = match m.split_once("::") {
            // A part with a layer of its own: a file or folder of a module in the order.
            Some((parent, _)) => layers.order.contains(&parent) && module_path_exists(&src, m),
            None => modules.iter().any(|x| x == m),
        };
        if !here {
            found.push(format!("{}: xtask/src/layers.rs names `{m}`, which is not a module here", layers.src));
        }
    }
    let base = layers.module();
    let root_items = root_items(&src)?;
    let root_name = if layers.is_crate() { "the crate root" } else { "mod.rs" };
    let rank_of = |m: &str| layers.order.iter().position(|l| *l == m);
    for file in rust_files(&src)? {
        let rel = file.strip_prefix(&src).unwrap_or(&file).to_string_lossy().replace('\\', "/");
        let Some(own) = module_of(&rel) else { continue }; // lib.rs, main.rs, mod.rs, bin/: the root
        let own_path: Vec<String> = own.split("::").map(str::to_owned).collect();
        let Some(top) = layer_of(layers.order, &own_path) else { continue };
        let Some(rank) = rank_of(top) else { continue };
        let module: Vec<String> = base.iter().cloned().chain(own_path).collect();
        let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let code = strip_comments(&text);
        let mut named_paths = paths_named(&module.join("::"), &code);
        named_paths.sort_by_key(|n| n.at);
        for named in named_paths {
            let Some(name) = named.path.get(base.len()).filter(|_| named.path.starts_with(&base)) else { continue };
            let line = || code[..named.at].matches('\n').count() + 1;
            // A name that is no module is the root's: a re-export stands for its module; an
            // item the root defines sits above every layer (the root declares them all).
            let target = match layer_of(layers.order, &named.path[base.len()..]) {
                Some(layer) => Some(layer.to_owned()),
                None => root_items.module_of(name, &src),
            };
            match target {
                Some(m) if rank_of(&m).is_some_and(|r| r > rank) => {
                    found.push(format!(
                        "{}:{}: {top} uses {}, a layer above it",
                        file.display(),
                        line(),
                        named.written(&module, base.len() + m.split("::").count() - 1)
                    ));
                }
                None if root_items.defined.contains(name) => found.push(format!(
                    "{}:{}: {top} uses {}, which {root_name} defines (the root is above every layer: move it into a module)",
                    file.display(),
                    line(),
                    named.written(&module, base.len())
                )),
                _ => {}
            }
        }
    }
    Ok(found)
}

/// The layer of `path` (a module or an item, from the tree's folder): the longest entry of
/// `order` that it is or is inside.
fn layer_of<'a>(order: &[&'a str], path: &[String]) -> Option<&'a str> {
    order
        .iter()
        .filter(|l| {
            let segments: Vec<&str> = l.split("::").collect();
            segments.len() <= path.len() && segments.iter().zip(path).all(|(a, b)| a == b)
        })
        .max_by_key(|l| l.len())
        .copied()
}

/// Whether the module `path` (`ranks::merge`) has its file or folder in `src`.
fn module_path_exists(src: &Path, path: &str) -> bool {
    let rel = path.replace("::", "/");
    src.join(format!("{rel}.rs")).is_file() || src.join(&rel).join("mod.rs").is_file()
}

/// What a tree's root (`lib.rs`, else `main.rs`, else `mod.rs`) gives its modules: the names it
/// re-exports, each with the module it comes from (`pub use model::Trace;`), the modules it
/// re-exports whole (`pub use state::*;`), and the items it defines.
#[derive(Default)]
struct RootItems {
    reexports: BTreeMap<String, String>,
    globs: Vec<String>,
    defined: BTreeSet<String>,
}

impl RootItems {
    /// The module `name` comes from, where the root re-exports it by name or whole.
    fn module_of(&self, name: &str, src: &Path) -> Option<String> {
        if let Some(m) = self.reexports.get(name) {
            return Some(m.clone());
        }
        self.globs.iter().find(|g| top_level_items(&src.join(g)).contains(name)).cloned()
    }
}

fn root_items(src: &Path) -> Result<RootItems> {
    let mut out = RootItems::default();
    let Some(file) = ["lib.rs", "main.rs", "mod.rs"].iter().map(|f| src.join(f)).find(|p| p.is_file()) else { return Ok(out) };
    let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let code = strip_comments(text.split("#[cfg(test)]").next().unwrap_or(""));
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    for line in code.lines() {
        // Items nested in the root (a `thread_local!`'s statics, an impl's functions) count too.
        let rest = without_visibility(line.trim());
        if let Some(path) = rest.strip_prefix("use ") {
            let path = path.trim_end_matches(';').trim_start_matches("crate::").trim_start_matches("self::");
            let module = ident(path);
            let tail = &path[module.len()..];
            if tail == "::*" {
                out.globs.push(module);
                continue;
            }
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
        out.defined.extend(item_name(rest));
    }
    Ok(out)
}

/// The items a module (its file, or its folder's `mod.rs`) defines at its top level, tests
/// left out.
fn top_level_items(module: &Path) -> BTreeSet<String> {
    let file = if module.is_dir() { module.join("mod.rs") } else { module.with_extension("rs") };
    let text = std::fs::read_to_string(file).unwrap_or_default();
    item_names(&strip_comments(text.split("#[cfg(test)]").next().unwrap_or("")))
}

/// `line` without its visibility (`pub`, `pub(crate)`, `pub(in path)`).
fn without_visibility(line: &str) -> &str {
    match line.strip_prefix("pub(") {
        Some(rest) => rest.split_once(')').map_or("", |(_, r)| r).trim_start(),
        None => line.strip_prefix("pub ").unwrap_or(line).trim_start(),
    }
}

/// The name of the item `line` (visibility taken off) defines, if it opens one.
fn item_name(line: &str) -> Option<String> {
    let t = ["const ", "unsafe ", "async ", "extern \"C\" "].iter().fold(line, |t, q| {
        if t.starts_with("fn") {
            t
        } else {
            t.strip_prefix(q).unwrap_or(t)
        }
    });
    ["fn ", "struct ", "enum ", "const ", "type ", "static ", "trait ", "mod ", "union ", "macro_rules! "].iter().find_map(|kw| {
        let rest = t.strip_prefix(kw)?;
        let name: String = rest.trim_start_matches("mut ").chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        (!name.is_empty() && name != "_").then_some(name)
    })
}

/// The names of the items `code` (comments stripped) defines at its top level (unindented).
pub fn item_names(code: &str) -> BTreeSet<String> {
    code.lines().filter(|l| !l.starts_with(char::is_whitespace)).filter_map(|l| item_name(without_visibility(l))).collect()
}

/// The name a `use` path's last segment brings in (`a::B as C` brings `C`).
fn last_name(segment: &str) -> String {
    let s = segment.rsplit("::").next().unwrap_or(segment);
    s.split(" as ").last().unwrap_or(s).trim().to_owned()
}

/// Top-level module names of a tree's folder: its `.rs` files (but the roots) and its folders
/// (but a crate's `bin/`).
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
            if !matches!(stem, "lib" | "main" | "mod") {
                out.push(stem.to_owned());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A file's module path (`x::y` for the file y.rs in folder x, or for mod.rs in x/y); the crate
/// roots, a folder's own `mod.rs` and `bin/` are none.
pub fn module_of(rel: &str) -> Option<String> {
    if rel.starts_with("bin/") || matches!(rel, "lib.rs" | "main.rs" | "mod.rs") {
        return None;
    }
    let rel = rel.strip_suffix(".rs")?;
    let rel = rel.strip_suffix("/mod").unwrap_or(rel);
    Some(rel.replace('/', "::"))
}

/// A path a module's code names, made absolute from the crate root.
pub struct Named {
    /// Where it is written in the code.
    at: usize,
    /// How many `super::` it starts with; `None` for `crate::`.
    up: Option<usize>,
    pub path: Vec<String>,
}

impl Named {
    /// The path as written, up to segment `last` of the absolute path (`crate::a`,
    /// `super::super::a`).
    fn written(&self, module: &[String], last: usize) -> String {
        let (prefix, from) = match self.up {
            None => ("crate::".to_owned(), 0),
            Some(up) => ("super::".repeat(up), module.len().saturating_sub(up)),
        };
        prefix + &self.path.get(from..=last).map(|p| p.join("::")).unwrap_or_default()
    }
}

/// The paths `module`'s code names from the crate root: `crate::x::y`, the items of
/// `crate::{x, y::z}` lists, and `super::…` made absolute.
pub fn paths_named(module: &str, code: &str) -> Vec<Named> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let segments = |s: &str| -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = s;
        loop {
            let id = ident(rest);
            if id.is_empty() {
                break;
            }
            rest = &rest[id.len()..];
            out.push(id);
            match rest.strip_prefix("::") {
                Some(r) => rest = r,
                None => break,
            }
        }
        out
    };
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // `$crate::`, `foo_crate::`
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            let inner = &list[..list.find('}').unwrap_or(list.len())];
            found.extend(inner.split(',').map(|s| segments(s.trim())).filter(|s| !s.is_empty()).map(|path| Named { at, up: None, path }));
        } else {
            found.push(Named { at, up: None, path: segments(rest) });
        }
    }
    let parent: Vec<&str> = module.split("::").collect();
    for (at, _) in code.match_indices("super::") {
        if code[..at].ends_with("super::") || code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // counted from the first `super::` of a chain
        }
        let mut rest = &code[at..];
        let mut up = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            rest = r;
            up += 1;
        }
        let Some(base) = parent.len().checked_sub(up) else { continue };
        let path: Vec<String> = parent[..base].iter().map(|s| (*s).to_owned()).collect();
        match rest.strip_prefix('{') {
            Some(list) => {
                let inner = &list[..list.find('}').unwrap_or(list.len())];
                for item in inner.split(',').map(|s| segments(s.trim())).filter(|s| !s.is_empty()) {
                    found.push(Named { at, up: Some(up), path: path.iter().cloned().chain(item).collect() });
                }
            }
            None => found.push(Named { at, up: Some(up), path: path.into_iter().chain(segments(rest)).collect() }),
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uses_are_found_in_paths_and_lists_and_not_in_comments() {
        let code = strip_comments(
            "use crate::model::Trace; // crate::merge\nuse crate::{analysis, export::x};\nlet _ = crate::ranks::f();\nuse super::super::{a, b::c};\nfoo_crate::no",
        );
        let paths: Vec<String> = paths_named("x::y::z", &code).into_iter().map(|n| n.path.join("::")).collect();
        assert_eq!(paths, ["model::Trace", "analysis", "export::x", "ranks::f", "x::a", "x::b::c"]);
    }

    /// [`upward_uses`] of a crate made of `files` (path under `src/`, text), layers `low`
    /// then `high`.
    fn planted(name: &str, files: &[(&str, &str)]) -> Vec<String> {
        planted_in(name, "src", &["low", "high"], files)
    }

    /// [`upward_uses`] of the tree `src` (with `order`) made of `files` (path under it, text).
    fn planted_in(name: &str, src: &'static str, order: &'static [&'static str], files: &[(&str, &str)]) -> Vec<String> {
        let root = std::env::temp_dir().join(format!("xtask-layers-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let path = root.join(src).join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let found = upward_uses(&root, &Layers { src, order }).unwrap();
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

    /// A part of a module with a layer of its own (as `shared`'s `ranks::merge`): it may use a
    /// layer that the rest of its module may not, and neither the rest of its module nor a layer
    /// below it may use it; a part named in the order must exist.
    #[test]
    fn a_part_of_a_module_takes_a_layer_of_its_own() {
        let found = planted_in(
            "part",
            "src",
            &["low", "mid", "low::high", "low::gone"],
            &[
                ("lib.rs", "//! root\npub mod low;\npub mod mid;\n"),
                ("low/mod.rs", "//! low\npub mod high;\nmod part;\n"),
                ("low/part.rs", "//! low's part\nuse super::high::X;\n"),
                ("low/high.rs", "//! low's part above mid\nuse crate::mid::Y;\nuse super::part::Z;\n"),
                ("mid.rs", "//! mid\nuse crate::low::part::Z;\nuse crate::low::high::X;\n"),
            ],
        );
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].ends_with("xtask/src/layers.rs names `low::gone`, which is not a module here"), "{found:?}");
        assert!(found[1].ends_with("low/part.rs:2: low uses super::high, a layer above it"), "{found:?}");
        assert!(found[2].ends_with("mid.rs:3: mid uses crate::low::high, a layer above it"), "{found:?}");
    }

    /// A module's own layers, as `collector serve`'s are checked (the checker that was
    /// `upward_imports` over `SERVE_LAYERS`): `super::` from a layer file, `super::super::` from
    /// a layer folder's parts, `super::{a, b}` lists, `crate::` paths through the module, an
    /// item of its `mod.rs` (the app), and a name its `mod.rs` re-exports whole (`pub use
    /// state::*;`), which is that layer's.
    #[test]
    fn a_modules_layers_are_checked_through_super_and_its_mod_rs() {
        let found = planted_in(
            "serve",
            "c/src/serve",
            &["store", "state", "api"],
            &[
                ("mod.rs", "//! app\npub mod api;\npub mod state;\npub mod store;\npub use state::*;\npub(crate) fn app() {}\n"),
                (
                    "store.rs",
                    "//! store\nuse super::{state, api::X};\nfn f() { super::app(); }\nuse super::AppState;\nuse crate::serve::api::Y;\n",
                ),
                ("state.rs", "//! state\nuse super::store::Store;\npub struct AppState;\n"),
                ("api/mod.rs", "//! api\nmod jobs;\nuse super::AppState;\nuse super::store;\n"),
                ("api/jobs.rs", "//! api's part\nuse super::super::state::AppState;\nuse super::field;\n"),
            ],
        );
        let tails: Vec<&str> = found.iter().map(|f| f.rsplit_once("serve/").map_or(f.as_str(), |(_, t)| t)).collect();
        assert_eq!(
            tails,
            [
                "store.rs:2: store uses super::state, a layer above it",
                "store.rs:2: store uses super::api, a layer above it",
                "store.rs:3: store uses super::app, which mod.rs defines (the root is above every layer: move it into a module)",
                "store.rs:4: store uses super::AppState, a layer above it",
                "store.rs:5: store uses crate::serve::api, a layer above it",
            ],
            "{found:?}"
        );
    }
}
