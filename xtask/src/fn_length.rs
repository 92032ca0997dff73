//! Function lengths by brace matching: the viewer's components stay at most 80 lines a
//! function (clippy's `too_many_lines` holds the rest of the workspace to 120).

use anyhow::Result;
use std::path::Path;

/// The most lines a function in the viewer's `components/` may span, signature to closing brace.
pub const COMPONENT_LINES: usize = 80;

/// `file:line: fn name is N lines` for every function in the Rust files under `dir` longer
/// than `max` lines.
pub fn too_long(dir: &Path, max: usize) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for file in crate::rust_files(dir)? {
        let text = std::fs::read_to_string(&file)?;
        for (name, line, len) in functions(&crate::layers::strip_comments(&text)) {
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
        let t = line.trim_start();
        let t = t.strip_prefix("pub(crate) ").or_else(|| t.strip_prefix("pub ")).unwrap_or(t);
        let t = t.strip_prefix("async ").unwrap_or(t);
        let Some(rest) = t.strip_prefix("fn ") else { continue };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if let Some(end) = body_end(&lines, i) {
            out.push((name, i + 1, end - i + 1));
        }
    }
    out
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
}
