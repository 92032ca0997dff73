//! Reading the sources the tidy rules look at: listing a tree's Rust or Python files, and
//! Rust code with its comments (and string contents) blanked out, lines kept.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// The `.rs` files under `dir`, sorted.
pub fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    files_with(dir, "rs")
}

/// The `.py` files under `dir`, sorted (`__pycache__` left out).
pub fn python_files(dir: &Path) -> Result<Vec<PathBuf>> {
    files_with(dir, "py")
}

fn files_with(dir: &Path, extension: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let p = entry?.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "__pycache__") {
                out.extend(files_with(&p, extension)?);
            }
        } else if p.extension().is_some_and(|e| e == extension) {
            out.push(p);
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

/// A folder made of `files` (path, text) under the temporary folder, one per call (tests run on
/// several threads of one process), for a test that plants a violation.
#[cfg(test)]
pub fn temp_tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let root = std::env::temp_dir().join(format!("xtask-{name}-{}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (path, text) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    root
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
}
