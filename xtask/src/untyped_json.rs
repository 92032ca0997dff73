//! Tidy rule: JSON is read and written through types (ARCHITECTURE.md: every shape that
//! crosses a process is a `protocol` type), never as `serde_json::Value`s taken apart or built
//! by field name. Outside tests no crate names `serde_json::Value` or `Map`, `json!` or a glob
//! of serde_json (without which a value cannot be taken apart either), except the files in
//! [`ALLOWED`], each with why. An allowed file that no longer needs it is refused too, so the
//! list stays true.

use crate::source::{rust_files, strip_comments_and_strings};
use anyhow::{Context, Result};
use std::path::Path;

/// Every crate's sources.
pub const SOURCES: [&str; 8] =
    ["shared/src", "protocol/src", "record/src", "traceio/src", "device/src", "capture/src", "collector/src", "viewer/src"];

/// Files that hold free-form JSON, and why.
pub const ALLOWED: [(&str, &str); 9] = [
    ("shared/src/model/meta.rs", "the allocator settings PyTorch reports, kept as they came (a free-form map)"),
    ("shared/src/explore/allocations.rs", "the user metadata a program attaches, shown as it came"),
    ("shared/src/import/snapshot/view.rs", "a snapshot's allocator settings, from pickle to that free-form map"),
    ("shared/src/whatif/conf.rs", "reads those allocator settings by PyTorch's own key names"),
    ("shared/src/import/chrome.rs", "other tools' Chrome traces, whose `args` are free-form"),
    ("shared/src/import/dftracer.rs", "DFTracer files, whose `args` are free-form"),
    ("shared/src/export/dftracer.rs", "DFTracer events whose `args` mirror what import/dftracer.rs reads back, metadata keys sorted"),
    ("collector/src/pyrun/wire.rs", "compares a frame's keys with its type's, to name a field the type lacks"),
    ("protocol/src/api.rs", "an OpenAPI example in a schema attribute"),
];

/// What makes a line untyped JSON.
const FORMS: [&str; 5] = ["serde_json::Value", "serde_json::Map", "serde_json::json", "json!(", "serde_json::*"];

/// `file:line: code` of every untyped line outside the allowed files, and a line for every
/// allowed file that has none.
pub fn untyped(root: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for src in SOURCES.iter().map(|s| root.join(s)).filter(|s| s.is_dir()) {
        for file in rust_files(&src)? {
            let rel = file.strip_prefix(root).unwrap_or(&file).to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let lines = untyped_lines(&text);
            match ALLOWED.iter().find(|(f, _)| *f == rel) {
                Some(_) if lines.is_empty() => {
                    found.push(format!("{rel}: allowed untyped JSON in xtask/src/untyped_json.rs, and has none: take it off the list"));
                }
                Some(_) => {}
                None => found.extend(lines.into_iter().map(|(n, line)| format!("{rel}:{n}: {line}"))),
            }
        }
    }
    Ok(found)
}

/// (line, code) of each untyped line of a Rust file, tests and comments left out.
fn untyped_lines(text: &str) -> Vec<(usize, String)> {
    let code = strip_comments_and_strings(text.split("#[cfg(test)]").next().unwrap_or(""));
    code.lines()
        .enumerate()
        .filter(|(_, l)| FORMS.iter().any(|f| l.contains(f)) || imports_untyped(l))
        .map(|(n, l)| (n + 1, l.trim().to_owned()))
        .collect()
}

/// `use serde_json::{Map, Value, json}` and its kin.
fn imports_untyped(line: &str) -> bool {
    let Some(list) = line.trim().strip_prefix("use serde_json::{") else { return false };
    list.split([',', '}']).map(|n| n.trim().split(" as ").next().unwrap_or("")).any(|n| matches!(n, "Value" | "Map" | "json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hole the rule had: it covered four crates, and `serde_json::json!` in shared's
    /// exporters or a `Value` taken apart in the viewer passed.
    #[test]
    fn every_form_is_found_outside_tests_comments_and_strings() {
        let text = "use serde_json::{Map, Value as V};\nlet a = serde_json::json!({\"a\": 1});\nlet b: serde_json::Value = x;\n\
                    let c = \"json!( in a string\"; // json!( in a comment\nuse serde_json::{from_str, to_string};\nuse serde_json::*;\n\
                    #[cfg(test)]\nmod tests { fn t() { let _ = serde_json::json!(1); } }\n";
        let lines: Vec<usize> = untyped_lines(text).into_iter().map(|(n, _)| n).collect();
        assert_eq!(lines, [1, 2, 3, 6]);
    }

    #[test]
    fn a_planted_line_is_refused_and_an_allowed_file_without_any_is_named() {
        let root = std::env::temp_dir().join(format!("xtask-json-{}", std::process::id()));
        let viewer = root.join("viewer/src");
        let shared = root.join("shared/src");
        std::fs::create_dir_all(&viewer).unwrap();
        std::fs::create_dir_all(shared.join("model")).unwrap();
        std::fs::write(viewer.join("server.rs"), "//! x\nfn f() { let body = serde_json::json!({\"a\": 1}); }\n").unwrap();
        std::fs::write(shared.join("model/meta.rs"), "//! the settings, typed now\n").unwrap();
        let found = untyped(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert!(found.iter().any(|f| f.starts_with("viewer/src/server.rs:2: ")), "{found:?}");
        assert!(found.iter().any(|f| f.starts_with("shared/src/model/meta.rs: allowed untyped JSON")), "{found:?}");
    }
}
