//! The module graph of a crate, file by file, and its cycles: module `a` depends on module `b`
//! when `a`'s code (tests left out) names `crate::b…` or reaches `b` through `super::`. A
//! module and its own ancestors or descendants are not edges (a parent declares its children,
//! and children may use what their parent defines); a child that takes its parent's names
//! (`use super::*;`) where the parent globs its children depends on each sibling whose items it
//! names ([`glob_edges`]); every other cycle is refused.

use crate::layers::{item_names, module_of, paths_named};
use crate::source::{rust_files, strip_comments};
use anyhow::{Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each cycle of the crate whose sources are in `src`, as its modules in order.
pub fn module_cycles(src: &Path) -> Result<Vec<Vec<String>>> {
    let mut code = BTreeMap::new();
    for file in rust_files(src)? {
        let rel = file.strip_prefix(src).unwrap_or(&file).to_string_lossy().replace('\\', "/");
        let Some(module) = module_of(&rel) else { continue };
        let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let text = strip_comments(text.split("#[cfg(test)]").next().unwrap_or(""));
        code.insert(module, text);
    }
    let modules: BTreeSet<String> = code.keys().cloned().collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, text) in &code {
        let targets = edges.entry(module.clone()).or_default();
        for path in paths_named(module, text).into_iter().map(|n| n.path) {
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

/// Whether one module contains the other.
fn nested(a: &str, b: &str) -> bool {
    let within = |inner: &str, outer: &str| inner == outer || inner.starts_with(&format!("{outer}::"));
    within(a, b) || within(b, a)
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

    #[test]
    fn a_cycle_between_siblings_is_found_and_nesting_is_not_one() {
        let root = crate::source::temp_tree(
            "cycles",
            &[
                ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
                ("a/mod.rs", "pub mod inner; use self::inner::X; use crate::b::Y;"),
                ("a/inner.rs", "use super::Z; // crate::c\n"),
                ("b.rs", "use crate::{c::W, a::inner};"),
                ("c.rs", "fn f() { super::b::g(); }\n#[cfg(test)]\nmod tests { use crate::a; }"),
            ],
        );
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
            crate::source::temp_tree(
                "cycles",
                &[
                    ("lib.rs", "pub mod x;"),
                    ("x/mod.rs", "mod a;\nmod b;\nuse a::*;\nuse b::*;\n"),
                    ("x/a.rs", "use super::*;\npub(super) fn f() { g(); }\n"),
                    ("x/b.rs", b),
                ],
            )
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
        let root = crate::source::temp_tree(
            "cycles",
            &[
                ("lib.rs", "pub mod x;"),
                ("x/mod.rs", "mod a;\nmod b;\nuse a::*;\nuse b::*;\n"),
                ("x/a.rs", "use super::{h, g};\npub(super) fn f() { g(); }\n"),
                ("x/b.rs", "pub(super) fn h() {}\npub(super) fn g() { super::f(); }\n"),
            ],
        );
        let cycles = module_cycles(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(cycles, vec![vec!["x::a".to_owned(), "x::b".to_owned()]]);
    }

    #[test]
    fn an_acyclic_crate_has_none() {
        let root = crate::source::temp_tree(
            "cycles",
            &[("lib.rs", ""), ("low.rs", ""), ("high.rs", "use crate::low;"), ("x/mod.rs", "use super::high;")],
        );
        let cycles = module_cycles(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert!(cycles.is_empty(), "{cycles:?}");
    }
}
