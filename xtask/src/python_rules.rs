//! Tidy rules for the Python package (and the Python tests), the Rust ones' counterparts: a
//! file at most [`FILE_LINES`] lines, a function at most [`FUNCTION_LINES`] (signature to its
//! last line, comments and blank lines inside included, nested functions counted in theirs),
//! and no submodule importing back up from its package's `__init__.py` (`from . import X` or
//! `from memory_tracer import X` where `X` is no submodule, `import memory_tracer`): what
//! several modules share lives in a module of its own, as a Rust crate root holds no items its
//! modules use (`layers.rs`).

use crate::source::python_files;
use anyhow::{Context, Result};
use std::path::Path;

/// The most lines a Python file may have (as [`crate::fn_length::FILE_LINES`]).
pub const FILE_LINES: usize = 800;

/// The most lines a Python function may span (as [`crate::fn_length::FUNCTION_LINES`]).
pub const FUNCTION_LINES: usize = 120;

/// Where [`FILE_LINES`] and [`FUNCTION_LINES`] hold.
pub const SOURCES: [&str; 2] = ["collector/python/memory_tracer", "tests/python"];

/// The packages whose submodules may not import from their `__init__.py`.
pub const PACKAGES: [&str; 1] = ["collector/python/memory_tracer"];

/// `file: N lines` for every Python file under `dir` longer than `max` lines.
pub fn too_long_files(dir: &Path, max: usize) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for file in python_files(dir)? {
        let n = read(&file)?.lines().count();
        if n > max {
            found.push(format!("{}: {n} lines (at most {max})", file.display()));
        }
    }
    Ok(found)
}

/// `file:line: def name is N lines` for every function under `dir` longer than `max` lines.
pub fn too_long_functions(dir: &Path, max: usize) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for file in python_files(dir)? {
        for (name, line, len) in functions(&lex(&read(&file)?)) {
            if len > max {
                found.push(format!("{}:{line}: def {name} is {len} lines (at most {max})", file.display()));
            }
        }
    }
    Ok(found)
}

/// `file:line: statement` for every import in a module of the package in `dir` (the
/// `__init__.py` files left out) of a name that a package's `__init__.py` holds rather than a
/// submodule.
pub fn imports_from_init(dir: &Path) -> Result<Vec<String>> {
    let package = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut found = Vec::new();
    for file in python_files(dir)? {
        if file.file_name().is_some_and(|n| n == "__init__.py") {
            continue;
        }
        let folder = file.parent().unwrap_or(dir);
        for (line, statement) in logical_lines(&lex(&read(&file)?)) {
            for part in statement.split(';').map(str::trim) {
                if let Some(name) = from_init(part, &package, dir, folder) {
                    found.push(format!("{}:{line}: `{part}` takes {name} from a package's __init__.py", file.display()));
                }
            }
        }
    }
    Ok(found)
}

/// The name an import statement in a file of `folder` takes from a package's `__init__.py`, if
/// it takes one: `from . import X` (`from .. import X`, …) or `from PACKAGE import X` where `X`
/// is no submodule of that package, and `import PACKAGE` itself.
fn from_init(statement: &str, package: &str, package_dir: &Path, folder: &Path) -> Option<String> {
    let words: Vec<&str> = statement.split_whitespace().collect();
    match words.as_slice() {
        ["import", rest @ ..] => {
            let imported = rest.join(" ");
            imported.split(',').map(|m| m.split_whitespace().next().unwrap_or("")).find(|m| *m == package).map(|m| format!("`{m}` itself"))
        }
        ["from", source, "import", rest @ ..] => {
            let from: &Path = if *source == package {
                package_dir
            } else if !source.is_empty() && source.chars().all(|c| c == '.') {
                folder.ancestors().nth(source.len() - 1)?
            } else {
                return None;
            };
            if !from.join("__init__.py").is_file() {
                return None;
            }
            let names = rest.join(" ");
            let names = names.trim_start_matches('(').trim_end_matches(')');
            names
                .split(',')
                .filter_map(|n| n.split_whitespace().next())
                .find(|n| *n == "*" || !(from.join(format!("{n}.py")).is_file() || from.join(n).join("__init__.py").is_file()))
                .map(str::to_owned)
        }
        _ => None,
    }
}

fn read(file: &Path) -> Result<String> {
    std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))
}

/// One physical line of Python source, as [`lex`] reads it.
#[derive(Debug)]
struct Line {
    /// Its code: comments left out, string contents blanked (their quotes kept).
    code: String,
    /// Whether a statement starts on it (not inside brackets, a string or after a `\`).
    starts: bool,
}

impl Line {
    fn indent(&self) -> usize {
        self.code.len() - self.code.trim_start().len()
    }

    fn blank(&self) -> bool {
        self.code.trim().is_empty()
    }
}

/// The lines of `text` with comments and string contents blanked, each saying whether a
/// statement starts on it.
fn lex(text: &str) -> Vec<Line> {
    #[derive(Clone, Copy, PartialEq)]
    enum In {
        Code,
        Str { quote: char, triple: bool },
    }
    let mut out = Vec::new();
    let mut state = In::Code;
    let mut depth = 0usize;
    let mut continued = false;
    for raw in text.lines() {
        let starts = state == In::Code && depth == 0 && !continued;
        continued = false;
        let mut code = String::with_capacity(raw.len());
        let chars: Vec<char> = raw.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            match state {
                In::Code => match c {
                    '#' => break,
                    '\'' | '"' => {
                        let triple = chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c);
                        let n = if triple { 3 } else { 1 };
                        code.extend(std::iter::repeat_n(c, n));
                        i += n;
                        state = In::Str { quote: c, triple };
                        continue;
                    }
                    '(' | '[' | '{' => depth += 1,
                    ')' | ']' | '}' => depth = depth.saturating_sub(1),
                    '\\' if i + 1 == chars.len() => continued = true,
                    _ => {}
                },
                In::Str { quote, triple } => {
                    if c == '\\' {
                        i += 2;
                        continue;
                    }
                    let closes = c == quote && (!triple || (chars.get(i + 1) == Some(&quote) && chars.get(i + 2) == Some(&quote)));
                    if closes {
                        let n = if triple { 3 } else { 1 };
                        code.extend(std::iter::repeat_n(c, n));
                        i += n;
                        state = In::Code;
                    } else {
                        i += 1;
                    }
                    continue;
                }
            }
            code.push(c);
            i += 1;
        }
        // A one-quote string does not run past its line (Python refuses one that would).
        if matches!(state, In::Str { triple: false, .. }) {
            state = In::Code;
        }
        out.push(Line { code, starts });
    }
    out
}

/// (first line, statement) of every statement, its continuation lines joined.
fn logical_lines(lines: &[Line]) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        match out.last_mut() {
            Some((_, statement)) if !line.starts => {
                statement.push(' ');
                statement.push_str(line.code.trim().trim_end_matches('\\'));
            }
            _ => out.push((i + 1, line.code.trim().trim_end_matches('\\').to_owned())),
        }
    }
    out
}

/// (name, first line, lines spanned) of every `def` in `lines`: from its `def` line to the
/// last line of its body (the body ends at the next statement indented no deeper than it).
fn functions(lines: &[Line]) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.code.trim_start();
        let Some(rest) = t.strip_prefix("def ").or_else(|| t.strip_prefix("async def ")).filter(|_| line.starts) else { continue };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let indent = line.indent();
        let mut last = i;
        for (j, l) in lines.iter().enumerate().skip(i + 1) {
            if l.starts && !l.blank() && l.indent() <= indent {
                break;
            }
            if !l.blank() {
                last = j;
            }
        }
        out.push((name, i + 1, last - i + 1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_comments_and_brackets_do_not_start_statements() {
        let text = "x = '''a\n# not a comment\n'''  # a comment\ny = (1,\n     2)\nz = 1 + \\\n    2\ns = \"it's\" # c\n";
        let lines = lex(text);
        let starts: Vec<bool> = lines.iter().map(|l| l.starts).collect();
        assert_eq!(starts, [true, false, false, true, false, true, false, true]);
        assert_eq!(lines[2].code, "'''  ");
        assert_eq!(lines[7].code, "s = \"\" ");
    }

    #[test]
    fn a_function_runs_to_its_last_body_line_and_one_past_the_limit_is_refused() {
        let text = "def a(x,\n      y):\n    '''doc\ndef not_one():\n'''\n    if x:\n\n        return 1\n    # trailing\n\nclass C:\n    async def b(self):\n        pass\n\n\n    def c(self): return 2\n";
        let f = functions(&lex(text));
        assert_eq!(f, vec![("a".to_owned(), 1, 8), ("b".to_owned(), 12, 2), ("c".to_owned(), 16, 1)]);
        let body = |n: usize| "    x = 1\n".repeat(n);
        let dir = crate::source::temp_tree(
            "python-functions",
            &[("long.py", &format!("def long():\n{}", body(4))), ("short.py", &format!("def short():\n{}", body(3)))],
        );
        let found = too_long_functions(&dir, 4).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].ends_with("long.py:1: def long is 5 lines (at most 4)"), "{found:?}");
    }

    #[test]
    fn a_file_one_past_the_limit_is_refused() {
        let dir = crate::source::temp_tree("python-files", &[("long.py", &"x = 1\n".repeat(5)), ("sub/short.py", &"x = 1\n".repeat(4))]);
        let found = too_long_files(&dir, 4).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].ends_with("long.py: 5 lines (at most 4)"), "{found:?}");
    }

    /// `_notebook.py` and `pytest_plugin.py` took `MemoryTracer` and `collector_path` from the
    /// package's `__init__.py` (inside functions, to dodge the import cycle that made).
    #[test]
    fn a_submodule_importing_from_init_is_refused_and_submodules_are_not() {
        let dir = crate::source::temp_tree(
            "python-init",
            &[
                ("pkg/__init__.py", "from . import _a\nfrom ._b import Thing\n"),
                ("pkg/_a.py", "from . import _b, sub\nfrom ._b import Thing\nimport os, pkg._b\ns = 'from . import Thing'\n"),
                ("pkg/_b.py", "def f():\n    from . import Thing  # lazily\nfrom pkg import (_a,\n    Thing as T)\nimport json, pkg\n"),
                ("pkg/sub/__init__.py", "from .. import _a\n"),
                ("pkg/sub/helper.py", "from . import helper as h\n"),
                ("pkg/sub/part.py", "from . import helper\nfrom .. import _a\nfrom .. import Thing\nfrom . import missing\n"),
            ],
        );
        let found = imports_from_init(&dir.join("pkg")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let tails: Vec<&str> = found.iter().map(|f| f.rsplit_once("/pkg/").map_or(f.as_str(), |(_, t)| t)).collect();
        assert_eq!(
            tails,
            [
                "_b.py:2: `from . import Thing` takes Thing from a package's __init__.py",
                "_b.py:3: `from pkg import (_a, Thing as T)` takes Thing from a package's __init__.py",
                "_b.py:5: `import json, pkg` takes `pkg` itself from a package's __init__.py",
                "sub/part.py:3: `from .. import Thing` takes Thing from a package's __init__.py",
                "sub/part.py:4: `from . import missing` takes missing from a package's __init__.py",
            ],
            "{found:?}"
        );
    }
}
