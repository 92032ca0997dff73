//! Tidy rule: every repository path that a comment names (`//`, `//!`, `///` in Rust and C++
//! files, and the text of README.md and ARCHITECTURE.md) exists, so that comments and the
//! codemap do not point at files that moved or went away; and an item named after a path
//! (`xtask/src/doc_paths.rs::stale_paths`) is defined in that file.
//!
//! What counts as a path: a word of a comment, backticked or in prose, with a `/` inside it
//! and only path characters in it, that
//! - starts with a top-level directory of the repository (`shared/src/units.rs`, `tests/data/`),
//! - or ends in `.rs`, or in another known extension under a directory that one of the bases
//!   has (`python/memory_tracer/_shim.py` in the collector),
//! - or is backticked and starts with such a directory (`capture/` in the collector's `src/`).
//!
//! It must exist under one of the bases: the repository root, the file's own directory, and
//! its crate's directory and `src/` (`src/main.rs` here); for README.md and ARCHITECTURE.md,
//! every crate's. `{a,b}` lists are expanded.
//!
//! Skipped: URLs, absolute and home paths (`/api/...`, `~/.cache/...`), placeholders and globs
//! (`<id>`, `{file}`, `*`, `$VAR`, `DATA/...` in capitals), build outputs that a fresh clone
//! lacks (`target/`, `dist/`, the fuzz corpus), paths that leave the repository (`../shared/...`
//! from the root), and prose such as `alloc/free` (no extension, no known directory).

use anyhow::{Context, Result};
use std::path::{Component, Path, PathBuf};

/// Extensions that make a word with a `/` a file path (besides a known directory in front).
const EXTENSIONS: [&str; 16] =
    ["rs", "toml", "md", "h", "cpp", "py", "sh", "html", "css", "js", "json", "txt", "csv", "gz", "pickle", "lock"];

/// Build outputs and scratch folders (see the .gitignore files): comments may name them, a
/// fresh clone does not have them.
const GENERATED: [&str; 9] = [
    "target",
    "dist",
    "tests/out",
    "fuzz/target",
    "fuzz/corpus",
    "fuzz/artifacts",
    "fuzz/coverage",
    "collector/python/memory_tracer/_lib",
    "collector/python/memory_tracer/_src",
];

/// A path named in a comment that does not exist: `file:line: path`.
#[derive(Debug, PartialEq)]
pub struct Stale {
    pub file: PathBuf,
    pub line: usize,
    pub path: String,
}

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: `{}`", self.file.display(), self.line, self.path)
    }
}

/// Every stale path named in the repository at `root`.
pub fn stale_paths(root: &Path) -> Result<Vec<Stale>> {
    let top_level: Vec<String> = dirs_in(root)?.into_iter().filter(|d| d != ".git").collect();
    let mut crates: Vec<PathBuf> = top_level
        .iter()
        .map(|d| root.join(d))
        .filter(|d| d.join("Cargo.toml").is_file())
        .map(|d| d.strip_prefix(root).unwrap_or(&d).to_path_buf())
        .collect();
    // Crates nested one level in a crate's folder (fuzz/, and any to come).
    let mut nested = Vec::new();
    for krate in &crates {
        for d in dirs_in(&root.join(krate))? {
            if root.join(krate).join(&d).join("Cargo.toml").is_file() {
                nested.push(krate.join(d));
            }
        }
    }
    let mut files = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    // The user and internals documentation README and ARCHITECTURE.md link to.
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "md")).collect())
        .unwrap_or_default();
    docs.sort();
    files.extend(docs.into_iter().filter_map(|p| p.strip_prefix(root).ok().map(Path::to_path_buf)));
    for krate in &crates {
        walk(root, krate, &mut files)?;
    }
    crates.extend(nested);
    // The innermost crate first, so a file is matched to the crate it is in.
    crates.sort_by_key(|c| std::cmp::Reverse(c.components().count()));
    let mut stale = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(root.join(&file)).with_context(|| format!("cannot read {}", file.display()))?;
        let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
        let mut bases = vec![PathBuf::new(), dir];
        match crates.iter().find(|c| file.starts_with(c)) {
            Some(krate) => bases.extend([krate.clone(), krate.join("src")]),
            None => bases.extend(crates.iter().flat_map(|c| [c.clone(), c.join("src")])),
        }
        bases.dedup();
        let markdown = file.extension().is_some_and(|e| e == "md");
        // A code span may run on over a line break; a blank line, code or a fence ends it.
        let mut in_code = false;
        for (i, line) in text.lines().enumerate() {
            let comment = if markdown { Some(line).filter(|l| !l.trim_start().starts_with("```")) } else { comment_of(line) };
            let Some(comment) = comment.filter(|c| !c.trim().is_empty()) else {
                in_code = false;
                continue;
            };
            let (found, still_in_code) = words(comment, in_code);
            in_code = still_in_code;
            for (word, backticked, item) in found {
                for path in expand(&word) {
                    if checked(&path, backticked, root, &top_level, &bases) && !exists(&path, root, &bases) {
                        stale.push(Stale { file: file.clone(), line: i + 1, path: word.clone() });
                        break;
                    }
                    // `file.rs::name`: the file defines `name` (a test, a function, a type).
                    if let Some(item) = &item {
                        let named = resolve(&path, root, &bases).and_then(|f| std::fs::read_to_string(f).ok());
                        if named.is_some_and(|text| !defines(&text, item)) {
                            stale.push(Stale { file: file.clone(), line: i + 1, path: format!("{word}::{item}") });
                            break;
                        }
                    }
                }
            }
        }
    }
    Ok(stale)
}

/// Names of the directories in `dir`.
fn dirs_in(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            out.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// The Rust and C++ files and READMEs under `dir` (relative to `root`), build outputs skipped.
fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<_> =
        std::fs::read_dir(root.join(dir)).with_context(|| format!("cannot list {}", dir.display()))?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = dir.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            if !generated(&path) && !entry.file_name().to_string_lossy().starts_with('.') {
                walk(root, &path, out)?;
            }
        } else if path.extension().is_some_and(|e| ["rs", "h", "cpp"].iter().any(|x| e == *x)) || entry.file_name() == "README.md" {
            out.push(path);
        }
    }
    Ok(())
}

fn generated(path: &Path) -> bool {
    GENERATED.iter().any(|g| path.starts_with(g))
}

/// The comment on a line of Rust or C++: the whole line when it starts with `//`, else what
/// follows a ` //` outside a string literal (an even number of quotes before it).
fn comment_of(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    if let Some(rest) = trimmed.strip_prefix("//") {
        return Some(rest);
    }
    let at = line.match_indices(" //").map(|(i, _)| i).find(|&i| line[..i].matches('"').count().is_multiple_of(2))?;
    Some(&line[at + 3..])
}

/// The words of a comment that could be paths, each with whether it was backticked (inside a
/// `code` span, which may have opened on an earlier line: `in_code`), split at white space and
/// at markdown's `](`, with punctuation around them trimmed; and whether a span is still open
/// at the end of the line.
fn words(comment: &str, in_code: bool) -> (Vec<(String, bool, Option<String>)>, bool) {
    let mut out = Vec::new();
    let mut backticked = !in_code;
    for part in comment.split('`') {
        backticked = !backticked;
        for word in part.split_whitespace().flat_map(|w| w.split("](")) {
            let word = word.trim_start_matches(['(', '[', '"', '\'']).trim_end_matches(['.', ',', ';', ':', ')', ']', '"', '\'', '!', '?']);
            // A line or anchor after a file (`a.rs:12`, `README.md#usage`) is not part of it;
            // an item after it (`a.rs::a_test`) is checked on its own ([`items`]).
            let path = word.split([':', '#']).next().unwrap_or("");
            if path.contains('/') {
                let item = word[path.len()..].strip_prefix("::").map(|rest| rest.trim_end_matches(['(', ')']).to_owned());
                out.push((path.to_owned(), backticked, item.filter(|i| !i.is_empty())));
            }
        }
    }
    (out, backticked)
}

/// `a/{b,c}.h` as `a/b.h` and `a/c.h`; a word without braces as itself; a brace without a
/// comma (a placeholder such as `{id}`) as nothing.
fn expand(word: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (word.find('{'), word.find('}')) else {
        return if word.contains(['{', '}']) { Vec::new() } else { vec![word.to_owned()] };
    };
    if close < open || !word[open..close].contains(',') {
        return Vec::new();
    }
    word[open + 1..close].split(',').flat_map(|alt| expand(&format!("{}{alt}{}", &word[..open], &word[close + 1..]))).collect()
}

/// Whether `path` is a repository path this rule checks (see the module's documentation).
fn checked(path: &str, backticked: bool, root: &Path, top_level: &[String], bases: &[PathBuf]) -> bool {
    let path = path.trim_end_matches('/');
    let path_chars = path.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '+'));
    if !path_chars || !path.contains('/') || path.contains("//") || path.starts_with('/') {
        return false;
    }
    let first = path.split('/').next().unwrap_or("");
    // `DATA/traces`, `OUT_DIR/x.so`: placeholders in capitals.
    if first.len() > 1 && first.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
        return false;
    }
    if GENERATED.iter().any(|g| Path::new(path).starts_with(g)) {
        return false;
    }
    let dir_in_base = first != "." && bases.iter().any(|b| root.join(b).join(first).is_dir());
    let extension = path.rsplit('/').next().and_then(|name| name.rsplit_once('.')).map(|(_, e)| e);
    let known_extension = extension.is_some_and(|e| EXTENSIONS.contains(&e));
    top_level.iter().any(|t| t == first) || (known_extension && (dir_in_base || extension == Some("rs"))) || (backticked && dir_in_base)
}

/// Whether `path` exists under one of the bases; a path that leaves the repository from any
/// base (`../shared/NOTES.md` from the root) or lands in a build output counts as existing.
fn exists(path: &str, root: &Path, bases: &[PathBuf]) -> bool {
    bases.iter().any(|base| match normalise(&base.join(path.trim_end_matches('/'))) {
        None => true,
        Some(p) => generated(&p) || root.join(p).exists(),
    })
}

/// The file `path` names under the first base that has it.
fn resolve(path: &str, root: &Path, bases: &[PathBuf]) -> Option<PathBuf> {
    bases.iter().filter_map(|b| normalise(&b.join(path))).map(|p| root.join(p)).find(|p| p.is_file())
}

/// Whether `text` (Rust or Python) defines `item`'s last segment (`Type::method` is `method`):
/// a `fn`, `def`, type, trait, constant, static, module or `class`.
fn defines(text: &str, item: &str) -> bool {
    let name = item.rsplit("::").next().unwrap_or(item);
    let after = |kw: &str| {
        text.match_indices(kw).any(|(at, _)| {
            let before_ok = at == 0 || !text.as_bytes()[at - 1].is_ascii_alphanumeric();
            let rest = &text[at + kw.len()..];
            before_ok && rest.starts_with(name) && !rest[name.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
        })
    };
    ["fn ", "def ", "struct ", "enum ", "trait ", "type ", "const ", "static ", "mod ", "class "].iter().any(|kw| after(kw))
}

/// `a/./b/../c` as `a/c`; `None` when it climbs above the start.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
    }

    fn is_checked(word: &str, backticked: bool) -> bool {
        let root = root();
        let top_level = dirs_in(&root).unwrap();
        let bases = [PathBuf::new(), PathBuf::from("collector"), PathBuf::from("collector/src")];
        checked(word, backticked, &root, &top_level, &bases)
    }

    #[test]
    fn words_come_from_code_spans_and_prose() {
        let (w, open) = words(" see `shared/src/model.rs` and (collector/shim/mt_shim.h), [x](tests/data/facts.json): a.rs:12", false);
        assert_eq!(
            w,
            [
                ("shared/src/model.rs".into(), true, None),
                ("collector/shim/mt_shim.h".into(), false, None),
                ("tests/data/facts.json".into(), false, None)
            ]
        );
        assert!(!open);
        let (w, open) = words("runs `cargo test -p", false);
        assert!(w.is_empty() && open);
        let (w, open) = words("shared/tests` in import/export", true);
        assert_eq!(w, [("shared/tests".into(), true, None), ("import/export".into(), false, None)]);
        assert!(!open);
        let (w, _) = words("`shared/src/model.rs::totals()`, tests/x.py::test_y.", false);
        assert_eq!(w, [("shared/src/model.rs".into(), true, Some("totals".into())), ("tests/x.py".into(), false, Some("test_y".into()))]);
    }

    /// The hole the rule had: a test named after `::` could move or go and the path still
    /// passed.
    #[test]
    fn an_item_after_a_path_is_defined_there() {
        let text = "fn real_test() {}\nstruct Thing;\ndef test_py():\n    pass\nfn real_test_longer() {}\n";
        assert!(defines(text, "real_test") && defines(text, "Thing::new_or_not") == defines(text, "new_or_not"));
        assert!(defines(text, "test_py") && defines(text, "Thing"));
        assert!(!defines(text, "real") && !defines(text, "moved_test"));
        let root = root();
        let bases = [PathBuf::new()];
        let file = resolve("xtask/src/doc_paths.rs", &root, &bases).unwrap();
        let me = std::fs::read_to_string(file).unwrap();
        assert!(defines(&me, "an_item_after_a_path_is_defined_there") && !defines(&me, "a_test_that_was_never_written"));
    }

    #[test]
    fn comments_are_found_after_code_but_not_inside_strings() {
        assert_eq!(comment_of("    /// doc"), Some("/ doc"));
        assert_eq!(comment_of("let x = 1; // why"), Some(" why"));
        assert_eq!(comment_of(r#"let url = "http://a/b"; let y = 2;"#), None);
        assert_eq!(comment_of(r#"f("a // b")"#), None);
    }

    #[test]
    fn braces_expand_and_placeholders_vanish() {
        assert_eq!(expand("shim/mt_shim.{h,cpp}"), ["shim/mt_shim.h", "shim/mt_shim.cpp"]);
        assert!(expand("/api/trace/{id}/leaks").is_empty());
        assert_eq!(expand("a/b.rs"), ["a/b.rs"]);
    }

    #[test]
    fn what_is_checked() {
        for (word, backticked) in [
            ("shared/src/model.rs", false),
            ("tests/data/", false),
            ("python/memory_tracer/_shim.py", false),
            ("src/gone.rs", false),
            ("nowhere/gone.rs", false),
            ("pyrun/gone/", true),
        ] {
            assert!(is_checked(word, backticked), "{word} should be checked");
        }
        for (word, backticked) in [
            ("alloc/free", false),
            ("import/export", false),
            ("pyrun/gone/", false),
            ("capture/", true),
            ("torch/csrc/autograd/function.h", false),
            ("DATA/traces/x.json", false),
            ("target/release/collector", false),
            ("/api/trace/list", true),
            ("~/.cache/memory-tracer/", true),
            ("tests/data/*.pickle", true),
            ("fuzz/seeds/<target>/", true),
            ("https://example.com/a.rs", false),
        ] {
            assert!(!is_checked(word, backticked), "{word} should be skipped");
        }
    }

    #[test]
    fn paths_outside_the_repository_are_allowed() {
        let root = root();
        assert!(exists("../shared/NOTES-toolchain.md", &root, &[PathBuf::new()]));
        assert!(exists("record/shim/mt_shim.h", &root, &[PathBuf::new()]));
        assert!(!exists("record/shim/gone.h", &root, &[PathBuf::new()]));
        assert!(exists("src/assemble.rs", &root, &[PathBuf::new(), PathBuf::from("record")]));
    }
}
