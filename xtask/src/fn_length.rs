//! Function and file lengths, in lines of the file (comments and blank lines count, as a
//! reader sees them): at most 120 a function everywhere (by brace matching), 80 in the viewer's
//! components, and 800 a file outside its tests.

use crate::source::{rust_files, strip_comments};
use anyhow::Result;
use std::path::Path;

/// The most lines a function in the viewer's `components/` may span, signature to closing brace.
pub const COMPONENT_LINES: usize = 80;

/// The most lines any function may span (clippy's `too_many_lines` counts only code lines).
pub const FUNCTION_LINES: usize = 120;

/// The most lines a Rust source file may have outside its `#[cfg(test)]` items (a file past it
/// holds several jobs and is cut along them). Test targets (`tests/`, `benches/`) are not sources.
pub const FILE_LINES: usize = 800;

/// Where [`FUNCTION_LINES`] and [`FILE_LINES`] hold: every crate's sources.
pub const SOURCES: [&str; 9] =
    ["shared/src", "protocol/src", "record/src", "traceio/src", "device/src", "capture/src", "collector/src", "viewer/src", "xtask/src"];

/// `file: N lines outside its tests` for every Rust file under `dir` longer than `max` lines
/// outside its `#[cfg(test)]` items.
pub fn too_long_files(dir: &Path, max: usize) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for file in rust_files(dir)? {
        let text = std::fs::read_to_string(&file)?;
        let n = lines_outside_tests(&text);
        if n > max {
            found.push(format!("{}: {n} lines outside its tests (at most {max})", file.display()));
        }
    }
    Ok(found)
}

/// Lines of `text` outside its tests: every line but those of each item under a `#[cfg(test)]`
/// line (the attribute, any attributes after it, and the item to its closing brace or
/// semicolon), wherever in the file it stands. Comments do not count as opening tests.
fn lines_outside_tests(text: &str) -> usize {
    let code = strip_comments(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut count = 0;
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            i = test_item_end(&lines, i) + 1;
        } else {
            count += 1;
            i += 1;
        }
    }
    count
}

/// The last line of the item whose attribute is on line `start`: its closing brace, else the
/// line of the semicolon that ends it (`mod tests;`), else the file's end.
fn test_item_end(lines: &[&str], start: usize) -> usize {
    if let Some(end) = body_end(lines, start) {
        return end;
    }
    lines.iter().enumerate().skip(start).find(|(_, l)| l.contains(';')).map_or(lines.len().saturating_sub(1), |(i, _)| i)
}

/// `file: N components` for every Rust file under `dir` that defines more than one
/// `#[component]` (ARCHITECTURE.md: one component per file).
pub fn several_components(dir: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for file in rust_files(dir)? {
        let text = std::fs::read_to_string(&file)?;
        let n = components(&strip_comments(text.split("#[cfg(test)]").next().unwrap_or("")));
        if n > 1 {
            found.push(format!("{}: {n} components (one per file)", file.display()));
        }
    }
    Ok(found)
}

/// How many `#[component]` attributes `code` (comments stripped) has.
fn components(code: &str) -> usize {
    code.lines().filter(|l| matches!(l.trim(), "#[component]" | "#[leptos::component]")).count()
}

/// `file:line: fn name is N lines` for every function in the Rust files under `dir` longer
/// than `max` lines.
pub fn too_long(dir: &Path, max: usize) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for file in rust_files(dir)? {
        let text = std::fs::read_to_string(&file)?;
        // Comments blanked, not removed: a function's length is its lines in the file.
        for (name, line, len) in functions(&strip_comments(&text)) {
            if len > max {
                found.push(format!("{}:{line}: fn {name} is {len} lines (at most {max})", file.display()));
            }
        }
    }
    Ok(found)
}

/// (name, first line, lines spanned) of every `fn` with a body in `code` (comments stripped).
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = after_fn_keyword(line) else { continue };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if let Some(end) = body_end(&lines, i) {
            out.push((name, i + 1, end - i + 1));
        }
    }
    out
}

/// What follows `fn ` when `line` starts a function: any visibility (`pub`, `pub(crate)`,
/// `pub(super)`, `pub(in path)`) and qualifiers (`const`, `async`, `unsafe`, `extern "C"`).
fn after_fn_keyword(line: &str) -> Option<&str> {
    let mut t = line.trim_start();
    if let Some(rest) = t.strip_prefix("pub(") {
        t = rest.split_once(')')?.1.trim_start();
    } else if let Some(rest) = t.strip_prefix("pub ") {
        t = rest.trim_start();
    }
    loop {
        let before = t;
        for q in ["const ", "async ", "unsafe ", "default "] {
            t = t.strip_prefix(q).unwrap_or(t).trim_start();
        }
        if let Some(rest) = t.strip_prefix("extern ") {
            let rest = rest.trim_start();
            t = match rest.strip_prefix('"') {
                Some(abi) => abi.split_once('"').map_or(rest, |(_, r)| r).trim_start(),
                None => rest,
            };
        }
        if t == before {
            break;
        }
    }
    t.strip_prefix("fn ")
}

/// The line where the body opened at or after line `start` closes (None for a declaration
/// without a body).
fn body_end(lines: &[&str], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut opened = false;
    let mut in_string = false;
    for (i, line) in lines.iter().enumerate().skip(start) {
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if in_string => {
                    chars.next();
                }
                '"' => in_string = !in_string,
                '\'' if !in_string => {
                    // A char literal ('{', '\''), not a lifetime: skip to its closing quote.
                    let ahead: String = chars.clone().take(3).collect();
                    if ahead.starts_with('\\') {
                        chars.next();
                        chars.next();
                        chars.next();
                    } else if ahead.chars().nth(1) == Some('\'') {
                        chars.next();
                        chars.next();
                    }
                }
                '{' if !in_string => {
                    depth += 1;
                    opened = true;
                }
                '}' if !in_string => {
                    depth = depth.saturating_sub(1);
                    if opened && depth == 0 {
                        return Some(i);
                    }
                }
                ';' if !in_string && !opened => return None,
                _ => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_count_from_signature_to_closing_brace() {
        let code = "fn a() {\n    let s = \"}{\";\n    let c = '{';\n}\n\npub fn b(x: u8)\n    -> u8\n{\n    if x > 0 { 1 } else { 0 }\n}\nfn decl();\n";
        let f = functions(code);
        assert_eq!(f, vec![("a".to_owned(), 1, 4), ("b".to_owned(), 6, 5)]);
    }

    #[test]
    fn components_are_counted_outside_comments() {
        assert_eq!(components("#[component]\nfn A() {}\n// #[component]\n    #[leptos::component]\nfn B() {}\n"), 2);
        let dir = std::env::temp_dir().join(format!("xtask-components-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("two.rs"), "#[component]\nfn A() {}\n#[component]\nfn B() {}\n").unwrap();
        std::fs::write(dir.join("one.rs"), "#[component]\nfn A() {}\nfn helper() {}\n").unwrap();
        let found = several_components(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].ends_with("two.rs: 2 components (one per file)"), "{found:?}");
    }

    /// The hole the check had: it stopped at the first `#[cfg(test)]`, so code after a test
    /// module (or after a `#[cfg(test)]` helper) was not counted.
    #[test]
    fn a_file_is_measured_outside_its_tests_and_one_past_the_limit_is_refused() {
        assert_eq!(lines_outside_tests("//! a\n// #[cfg(test)]\nfn a() {}\n\n#[cfg(test)]\nmod tests {}\n"), 4);
        assert_eq!(lines_outside_tests("fn a() {}\n"), 1);
        let after = "fn a() {}\n#[cfg(test)]\n#[allow(x)]\nmod tests {\n    fn t() { let s = \"}\"; }\n}\nfn b() {}\n#[cfg(test)]\nmod more;\nfn c() {}\n";
        assert_eq!(lines_outside_tests(after), 3);
        let dir = std::env::temp_dir().join(format!("xtask-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let body = |n: usize| "fn f() {}\n".repeat(n);
        std::fs::write(dir.join("long.rs"), body(5)).unwrap();
        std::fs::write(dir.join("short.rs"), body(4) + "#[cfg(test)]\nmod tests {\n" + &body(10) + "}\n").unwrap();
        std::fs::write(dir.join("after.rs"), body(2) + "#[cfg(test)]\nmod tests {\n" + &body(10) + "}\n" + &body(3)).unwrap();
        let found = too_long_files(&dir, 4).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].ends_with("after.rs: 5 lines outside its tests (at most 4)"), "{found:?}");
        assert!(found[1].ends_with("long.rs: 5 lines outside its tests (at most 4)"), "{found:?}");
    }

    /// The holes the check had: `pub(super) fn` was not a function, and comment lines did
    /// not count.
    #[test]
    fn every_visibility_and_qualifier_starts_a_function_and_comments_count() {
        let code = "pub(super) fn a() {\n    // one\n    // two\n}\npub(in crate::x) const unsafe fn b() {}\nextern \"C\" fn c() {\n}\n";
        let f = functions(&strip_comments(code));
        assert_eq!(f, vec![("a".to_owned(), 1, 4), ("b".to_owned(), 5, 1), ("c".to_owned(), 6, 2)]);
    }
}
