//! The module graph of a crate, file by file, and its cycles: module `a` depends on module `b`
//! when `a`'s code (tests left out) names `crate::b…` or reaches `b` through `super::`. A
//! module and its own ancestors or descendants are not edges (a parent declares its children,
//! and children may use what their parent defines); a child that takes its parent's names
//! (`use super::*;`) where the parent globs its children depends on each sibling whose items it
//! names ([`glob_edges`]); every other cycle is refused.

use anyhow::{Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each cycle of the crate whose sources are in `src`, as its modules in order.
pub fn module_cycles(src: &Path) -> Result<Vec<Vec<String>>> {
    let mut code = BTreeMap::new();
    for file in crate::rust_files(src)? {
        let rel = file.strip_prefix(src).unwrap_or(&file).to_string_lossy().replace('\\', "/");
        let Some(module) = module_of(&rel) else { continue };
        let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let text = crate::layers::strip_comments(text.split("#[cfg(test)]").next().unwrap_or(""));
        code.insert(module, text);
    }
    let modules: BTreeSet<String> = code.keys().cloned().collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, text) in &code {
        let targets = edges.entry(module.clone()).or_default();
        for path in paths_named(module, text) {
            if let Some(mut target) = resolve(&path, &modules) {
                // A name the module reaches through a parent that glob-imports it is its child's.
                if let Some(child) = path.get(target.split("::").count()).and_then(|name| globbed_child(&code, &target, name)) {
                    target = child;
                }
                if !nested(module, &target) {
                    targets.insert(target);
                }
            }
        }
    }
    for (from, to) in glob_edges(&code) {
        edges.entry(from).or_default().insert(to);
    }
    Ok(strongly_connected(&edges).into_iter().filter(|c| c.len() > 1).collect())
}

/// Edges that glob imports hide: a module whose parent glob-imports its children (`use
/// child::*;`, `pub use child::*;`) and which takes its parent's names (`use super::*;`) names a
/// sibling's item without a path. Such a module depends on every sibling the parent globs whose
/// items (functions, types, constants, statics, traits, modules) it names as a word and does not
/// define itself.
fn glob_edges(code: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (module, text) in code {
        if !text.contains("use super::*;") {
            continue;
        }
        let Some((parent, _)) = module.rsplit_once("::") else { continue };
        let Some(parent_code) = code.get(parent) else { continue };
        let own = item_names(text);
        let words: BTreeSet<&str> = text.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect();
        for (sibling, sibling_code) in code.range(format!("{parent}::")..) {
            let Some(name) = sibling.strip_prefix(&format!("{parent}::")) else { break };
            if name.contains("::") || sibling == module || !parent_code.contains(&format!("use {name}::*;")) {
                continue;
            }
            if item_names(sibling_code).iter().any(|n| !own.contains(n) && words.contains(n.as_str())) {
                out.push((module.clone(), sibling.clone()));
            }
        }
    }
    out
}

/// The child of `parent` that defines `name` and that `parent` glob-imports (`use child::*;`).
fn globbed_child(code: &BTreeMap<String, String>, parent: &str, name: &str) -> Option<String> {
    let parent_code = code.get(parent)?;
    code.range(format!("{parent}::")..).take_while(|(m, _)| m.starts_with(&format!("{parent}::"))).find_map(|(child, text)| {
        let short = &child[parent.len() + 2..];
        let globbed = !short.contains("::") && parent_code.contains(&format!("use {short}::*;"));
        (globbed && item_names(text).contains(name)).then(|| child.clone())
    })
}

/// The names of the items a file defines at its top level.
fn item_names(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in code.lines().filter(|l| !l.starts_with(char::is_whitespace)) {
        let mut t = line;
        if let Some(rest) = t.strip_prefix("pub(") {
            t = rest.split_once(')').map_or("", |(_, r)| r);
        }
        let t = t.trim_start().strip_prefix("pub ").unwrap_or(t.trim_start());
        let t = ["const ", "unsafe ", "async "].iter().fold(t, |t, q| if t.starts_with("fn") { t } else { t.strip_prefix(q).unwrap_or(t) });
        for kw in ["fn ", "struct ", "enum ", "const ", "type ", "static ", "trait ", "mod ", "union "] {
            if let Some(rest) = t.strip_prefix(kw) {
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() && name != "_" {
                    names.insert(name);
                }
            }
        }
    }
    names
}

/// A file's module path (`x::y` for the file y.rs in folder x, or for mod.rs in x/y); the crate roots and `bin` are none.
fn module_of(rel: &str) -> Option<String> {
    if rel.starts_with("bin/") || rel == "lib.rs" || rel == "main.rs" {
        return None;
    }
    let rel = rel.strip_suffix(".rs")?;
    let rel = rel.strip_suffix("/mod").unwrap_or(rel);
    Some(rel.replace('/', "::"))
}

/// Whether one module contains the other.
fn nested(a: &str, b: &str) -> bool {
    let within = |inner: &str, outer: &str| inner == outer || inner.starts_with(&format!("{outer}::"));
    within(a, b) || within(b, a)
}

/// The paths `module`'s code names from the crate root: `crate::x::y`, the items of
/// `crate::{x, y::z}` lists, and `super::…` made absolute.
fn paths_named(module: &str, code: &str) -> Vec<Vec<String>> {
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
            found.extend(inner.split(',').map(|s| segments(s.trim())).filter(|s| !s.is_empty()));
        } else {
            found.push(segments(rest));
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
        let mut path: Vec<String> = parent[..base].iter().map(|s| (*s).to_owned()).collect();
        match rest.strip_prefix('{') {
            Some(list) => {
                let inner = &list[..list.find('}').unwrap_or(list.len())];
                for item in inner.split(',').map(|s| segments(s.trim())).filter(|s| !s.is_empty()) {
                    found.push(path.iter().cloned().chain(item).collect());
                }
            }
            None => {
                path.extend(segments(rest));
                found.push(path);
            }
        }
    }
    found
}

/// The longest prefix of `path` that is a module.
fn resolve(path: &[String], modules: &BTreeSet<String>) -> Option<String> {
    (1..=path.len()).rev().map(|n| path[..n].join("::")).find(|m| modules.contains(m))
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                component.sort();
                self.out.push(component);
            }
        }
    }
    let mut walk =
        Walk { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on_stack: BTreeSet::new(), out: Vec::new() };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_with(files: &[(&str, &str)]) -> std::path::PathBuf {
        // One folder per call: tests run on several threads of one process.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("xtask-cycles-{}-{call}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        root
    }

    #[test]
    fn a_cycle_between_siblings_is_found_and_nesting_is_not_one() {
        let root = crate_with(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
            ("a/mod.rs", "pub mod inner; use self::inner::X; use crate::b::Y;"),
            ("a/inner.rs", "use super::Z; // crate::c\n"),
            ("b.rs", "use crate::{c::W, a::inner};"),
            ("c.rs", "fn f() { super::b::g(); }\n#[cfg(test)]\nmod tests { use crate::a; }"),
        ]);
        let cycles = module_cycles(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        // a → b → a::inner is nesting-free only through b; b → c → b is the cycle.
        assert_eq!(cycles, vec![vec!["b".to_owned(), "c".to_owned()]]);
    }

    /// Siblings that reach each other through their parent's glob imports (`use super::*;` in
    /// each, `use a::*; use b::*;` in the parent) are a circle; one way only is none.
    #[test]
    fn a_cycle_through_glob_imports_is_found() {
        let files = |b_uses_a: bool| {
            let b = if b_uses_a { "use super::*;\npub(super) fn g() { f(); }\n" } else { "use super::*;\npub(super) fn g() {}\n" };
            crate_with(&[
                ("lib.rs", "pub mod x;"),
                ("x/mod.rs", "mod a;\nmod b;\nuse a::*;\nuse b::*;\n"),
                ("x/a.rs", "use super::*;\npub(super) fn f() { g(); }\n"),
                ("x/b.rs", b),
            ])
        };
        let root = files(true);
        let cycles = module_cycles(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(cycles, vec![vec!["x::a".to_owned(), "x::b".to_owned()]]);
        let root = files(false);
        let cycles = module_cycles(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert!(cycles.is_empty(), "{cycles:?}");
        // Named through the parent (`super::{g, h}`) rather than taken with a glob: the same.
        let root = crate_with(&[
            ("lib.rs", "pub mod x;"),
            ("x/mod.rs", "mod a;\nmod b;\nuse a::*;\nuse b::*;\n"),
            ("x/a.rs", "use super::{h, g};\npub(super) fn f() { g(); }\n"),
            ("x/b.rs", "pub(super) fn h() {}\npub(super) fn g() { super::f(); }\n"),
        ]);
        let cycles = module_cycles(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(cycles, vec![vec!["x::a".to_owned(), "x::b".to_owned()]]);
    }

    #[test]
    fn an_acyclic_crate_has_none() {
        let root = crate_with(&[("lib.rs", ""), ("low.rs", ""), ("high.rs", "use crate::low;"), ("x/mod.rs", "use super::high;")]);
        let cycles = module_cycles(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert!(cycles.is_empty(), "{cycles:?}");
    }
}
