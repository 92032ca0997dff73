//! `cargo xtask tidy`: every rule about how the code reads and is laid out, each refusing with
//! the list of what breaks it. The rules with a module of their own: `doc_paths.rs` (paths in
//! comments exist), `layers.rs` and `cycles.rs` (modules import downward, no circles),
//! `untyped_json.rs` (JSON through types), `fn_length.rs` (function, file and component
//! lengths), `python_rules.rs` (the Python package's); the small ones are here: every Rust file
//! opens with a `//!` line, no item has two doc comments split by its attributes, `shared`
//! does no I/O, and serve's layers below the API name no HTTP.

use crate::source::{rust_files, strip_comments};
use crate::{cycles, doc_paths, fn_length, layers, python_rules, untyped_json};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// What does I/O (files, sockets, processes, threads), which `shared` never does.
const SHARED_IO: [&str; 6] = ["std::fs", "std::net", "std::process", "std::thread", "File::open", "File::create"];

/// What answers HTTP, which serve's layers below `error` never name.
const HTTP: [&str; 3] = ["axum", "StatusCode", "hyper"];

/// Documents a reader can finish, and their most lines (issue 70): measured tables beyond one
/// per claim, and the history of attempts, live in `git log`.
const DOC_LINES: [(&str, usize); 3] = [("README.md", 300), ("docs/benchmarks.md", 400), ("docs/internals.md", 600)];

/// Runs every rule on the repository (the current folder).
pub fn tidy() -> Result<()> {
    let root = Path::new(".");
    doc_comments(root)?;
    let stale = doc_paths::stale_paths(root)?;
    if !stale.is_empty() {
        let list: Vec<String> = stale.iter().map(ToString::to_string).collect();
        bail!("these comments name paths that do not exist:\n{}", list.join("\n"));
    }
    module_layers(root)?;
    let untyped = untyped_json::untyped(root)?;
    if !untyped.is_empty() {
        bail!(
            "these lines read or write JSON by field name (ARCHITECTURE.md: every shape that crosses a process is a protocol type):\n{}",
            untyped.join("\n")
        );
    }
    lengths()?;
    let long_docs = too_long_docs(root, &DOC_LINES)?;
    if !long_docs.is_empty() {
        bail!("these documents are over their length (ARCHITECTURE.md: one current table per claim):\n{}", long_docs.join("\n"));
    }
    let io = forbidden_code(&[Path::new("shared/src")], &SHARED_IO)?;
    if !io.is_empty() {
        bail!("shared does I/O here (ARCHITECTURE.md: importers take bytes or a reader, exporters a writer):\n{}", io.join("\n"));
    }
    let below_api = serve_layers_below("error");
    let http = forbidden_code(&below_api.iter().map(PathBuf::as_path).collect::<Vec<_>>(), &HTTP)?;
    if !http.is_empty() {
        bail!(
            "these serve layers below the API name HTTP (ARCHITECTURE.md: only the API layer answers with status codes):\n{}",
            http.join("\n")
        );
    }
    python()
}

/// Every Rust file of every crate opens with a `//!` line, and no item has two doc comments
/// split by its attributes.
fn doc_comments(root: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut split = Vec::new();
    let mut files = std::collections::BTreeSet::new();
    for dir in crate_dirs(root)? {
        // A crate's build outputs (`fuzz/target/`) are not its sources.
        files.extend(
            rust_files(&dir)?.into_iter().filter(|f| !f.strip_prefix(&dir).unwrap_or(f).components().any(|c| c.as_os_str() == "target")),
        );
    }
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        if !text.trim_start().starts_with("//!") {
            missing.push(file.display().to_string());
        }
        split.extend(split_doc_comments(&text).into_iter().map(|line| format!("{}:{line}", file.display())));
    }
    if !missing.is_empty() {
        bail!("these files do not open with a //! line: {}", missing.join(", "));
    }
    if !split.is_empty() {
        bail!(
            "these doc comments follow attributes that follow another doc comment, so one item has two \
             (one of them probably belongs to the item above; doc comments go before attributes): {}",
            split.join(", ")
        );
    }
    Ok(())
}

/// Every crate's folder: the repository's folders with a `Cargo.toml`, and those one level
/// inside them (a crate outside the workspace, such as `fuzz/`, included).
fn crate_dirs(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for top in subfolders(root)? {
        if top.join("Cargo.toml").is_file() {
            out.extend(subfolders(&top)?.into_iter().filter(|d| d.join("Cargo.toml").is_file()));
            out.push(top);
        }
    }
    out.sort();
    Ok(out)
}

/// The folders in `dir`, but hidden ones and build outputs (`target/`).
fn subfolders(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if path.is_dir() && !name.starts_with('.') && name != "target" {
            out.push(path);
        }
    }
    Ok(out)
}

/// Each module tree's layers (`layers.rs`) and each crate's module cycles (`cycles.rs`).
fn module_layers(root: &Path) -> Result<()> {
    let mut layered = Vec::new();
    for tree in &layers::LAYERED {
        layered.extend(layers::upward_uses(root, tree)?);
    }
    // A crate's cycles take in its every module, folders' parts included.
    for tree in layers::LAYERED.iter().filter(|t| t.is_crate()) {
        for cycle in cycles::module_cycles(&root.join(tree.src))? {
            layered.push(format!("{}: these modules use each other in a circle: {}", tree.src, cycle.join(", ")));
        }
    }
    if !layered.is_empty() {
        bail!(
            "these modules use a layer above them (ARCHITECTURE.md: each crate's modules, and serve's, import only downward, in xtask/src/layers.rs's order):\n{}",
            layered.join("\n")
        );
    }
    Ok(())
}

/// Components per file, function lengths and file lengths (`fn_length.rs`).
fn lengths() -> Result<()> {
    let crowded = fn_length::several_components(Path::new("viewer/src"))?;
    if !crowded.is_empty() {
        bail!("these files hold several components (ARCHITECTURE.md: one per file):\n{}", crowded.join("\n"));
    }
    let mut long = fn_length::too_long(Path::new("viewer/src/components"), fn_length::COMPONENT_LINES)?;
    for src in fn_length::SOURCES {
        long.extend(fn_length::too_long(Path::new(src), fn_length::FUNCTION_LINES)?);
    }
    if !long.is_empty() {
        bail!("these functions are over the limit (ARCHITECTURE.md: lines in the file, comments included):\n{}", long.join("\n"));
    }
    let mut big = Vec::new();
    for src in fn_length::SOURCES {
        big.extend(fn_length::too_long_files(Path::new(src), fn_length::FILE_LINES)?);
    }
    if !big.is_empty() {
        bail!("these files are over the limit (ARCHITECTURE.md: cut a file along its jobs):\n{}", big.join("\n"));
    }
    Ok(())
}

/// Each of `docs` (path, most lines) that is longer, with its length.
fn too_long_docs(root: &Path, docs: &[(&str, usize)]) -> Result<Vec<String>> {
    let mut long = Vec::new();
    for &(path, most) in docs {
        let text = std::fs::read_to_string(root.join(path)).with_context(|| format!("cannot read {path}"))?;
        let lines = text.lines().count();
        if lines > most {
            long.push(format!("{path}: {lines} lines (at most {most})"));
        }
    }
    Ok(long)
}

/// The Python package's rules (`python_rules.rs`).
fn python() -> Result<()> {
    let mut long = Vec::new();
    let mut big = Vec::new();
    for src in python_rules::SOURCES {
        long.extend(python_rules::too_long_functions(Path::new(src), python_rules::FUNCTION_LINES)?);
        big.extend(python_rules::too_long_files(Path::new(src), python_rules::FILE_LINES)?);
    }
    if !long.is_empty() {
        bail!("these Python functions are over the limit (ARCHITECTURE.md: as Rust's, lines in the file):\n{}", long.join("\n"));
    }
    if !big.is_empty() {
        bail!("these Python files are over the limit (ARCHITECTURE.md: cut a file along its jobs):\n{}", big.join("\n"));
    }
    let mut upward = Vec::new();
    for package in python_rules::PACKAGES {
        upward.extend(python_rules::imports_from_init(Path::new(package))?);
    }
    if !upward.is_empty() {
        bail!(
            "these Python modules import from their package's __init__.py (ARCHITECTURE.md: what modules share lives in a module of its own):\n{}",
            upward.join("\n")
        );
    }
    Ok(())
}

/// The files of serve's layers below `layer` (a layer is a file or, when it has parts, a
/// folder).
fn serve_layers_below(layer: &str) -> Vec<PathBuf> {
    let order = layers::SERVE.order;
    order[..order.iter().position(|l| *l == layer).unwrap_or(0)]
        .iter()
        .map(|l| {
            let folder = Path::new(layers::SERVE.src).join(l);
            if folder.is_dir() {
                folder
            } else {
                folder.with_extension("rs")
            }
        })
        .collect()
}

/// `file:line: code` of every line outside tests (and comments) in `paths` (folders or files)
/// that contains one of `patterns`.
fn forbidden_code(paths: &[&Path], patterns: &[&str]) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for path in paths {
        let files = if path.is_file() { vec![path.to_path_buf()] } else { rust_files(path)? };
        for file in files {
            let text = std::fs::read_to_string(&file)?;
            let code = strip_comments(text.split("#[cfg(test)]").next().unwrap_or(""));
            for (n, line) in code.lines().enumerate() {
                if patterns.iter().any(|p| line.contains(p)) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    Ok(found)
}

/// Lines where a `///` block starts right after attributes that follow another `///` block:
/// the mark of a doc comment pasted above the wrong item (as happened in the viewer's charts,
/// where a function's doc and `#[allow]` ended up above a type alias).
fn split_doc_comments(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().map(str::trim_start).collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let attributes = lines[..i].iter().rev().take_while(|l| l.starts_with("#[")).count();
        if line.starts_with("///") && attributes > 0 && i > attributes && lines[i - attributes - 1].starts_with("///") {
            out.push(i + 1);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_past_its_length_is_refused() {
        let root = crate::source::temp_tree("tidy-docs", &[("README.md", &"line\n".repeat(3)), ("docs/b.md", "one\ntwo\n")]);
        let long = too_long_docs(&root, &[("README.md", 2), ("docs/b.md", 2)]).unwrap();
        assert_eq!(long, ["README.md: 3 lines (at most 2)"]);
        assert!(too_long_docs(&root, &[("docs/missing.md", 2)]).is_err(), "a document that is gone is an error");
        std::fs::remove_dir_all(root).unwrap();
    }

    /// The hole the rule had: it walked five of the ten crates.
    #[test]
    fn a_file_of_any_crate_without_its_opening_line_is_refused() {
        let root = crate::source::temp_tree(
            "tidy-openings",
            &[
                ("a/Cargo.toml", ""),
                ("a/src/lib.rs", "//! a\n"),
                ("b/Cargo.toml", ""),
                ("b/src/main.rs", "fn main() {}\n"),
                ("b/nested/Cargo.toml", ""),
                ("b/nested/src/lib.rs", "\n//! nested\n"),
                ("b/target/debug/build/out.rs", "generated\n"),
                ("notes/x.rs", "not a crate\n"),
            ],
        );
        let dirs = crate_dirs(&root).unwrap();
        let err = doc_comments(&root).unwrap_err().to_string();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(dirs, [root.join("a"), root.join("b"), root.join("b/nested")]);
        assert!(err.starts_with("these files do not open with a //! line: "), "{err}");
        assert!(err.ends_with("b/src/main.rs"), "{err}");
    }

    #[test]
    fn a_doc_comment_split_from_its_first_by_attributes_is_found() {
        let text = "/// one\n#[derive(Debug)]\n/// two\nstruct A;\n\n/// fine\n#[derive(Debug)]\nstruct B;\n#[allow(x)]\n/// fine too\nfn c() {}\n";
        assert_eq!(split_doc_comments(text), [3]);
    }

    /// SHARED_IO in shared and HTTP below serve's API: outside tests and comments only.
    #[test]
    fn forbidden_code_is_found_outside_tests_and_comments() {
        let root = crate::source::temp_tree(
            "tidy-forbidden",
            &[
                ("src/a.rs", "//! a\nuse std::fs; // std::net\nfn f() {}\n#[cfg(test)]\nmod tests { use std::net; }\n"),
                ("src/b/c.rs", "//! c\nfn g() -> axum::Router { todo!() }\n"),
            ],
        );
        let found = forbidden_code(&[&root.join("src/a.rs"), &root.join("src/b")], &["std::fs", "std::net", "axum"]).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].ends_with("src/a.rs:2: use std::fs;"), "{found:?}");
        assert!(found[1].ends_with("src/b/c.rs:2: fn g() -> axum::Router { todo!() }"), "{found:?}");
        let below = serve_layers_below("error");
        assert_eq!(below.len(), 5, "{below:?}");
        assert!(below.iter().all(|p| p.starts_with("collector/src/serve")), "{below:?}");
    }
}
