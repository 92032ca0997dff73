//! Named stretches and moments of a run: layer scopes (module paths), iterations, marks.

use super::{Phase, StrId};
use serde::{Deserialize, Serialize};

/// The layer scope the collector creates the input batch in; analyses tell data from weights
/// by it.
pub const INPUT_LAYER: &str = "input";

/// The layer of memory allocated outside every module, named by the innermost frame of the
/// program's own code that allocated it: `train.py:40 in train_step` (the file's base name).
pub fn source_layer(file: &str, line: u32, function: &str) -> String {
    let base = file.rsplit(['/', '\\']).next().unwrap_or(file);
    format!("{base}:{line} in {function}")
}

/// Whether a layer name is a source line ([`source_layer`]), not a module path: module paths
/// are split at their dots, a file name must not be.
pub fn is_source_layer(layer: &str) -> bool {
    layer.split_once(" in ").is_some_and(|(at, _)| {
        at.rsplit_once(':').is_some_and(|(file, line)| !file.is_empty() && !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// Where something happened, for a sentence: `in blocks.0.mlp` for a module, `at train.py:40 in
/// train_step` for a source line.
pub fn layer_place(layer: &str) -> String {
    if is_source_layer(layer) {
        format!("at {layer}")
    } else {
        format!("in {layer}")
    }
}

/// A named scope: a module path such as `layer1.0.conv1`, `optimizer.step`, an iteration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerScope {
    pub name: StrId,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Nesting depth, 0 for outermost.
    pub depth: u16,
    pub phase: Phase,
    pub thread: u64,
}

/// One iteration of the traced loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterationSpan {
    pub index: u32,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// A named moment of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub ts_ns: u64,
    pub name: StrId,
    /// The program's value for it (a counter unless it gave one).
    pub value: i64,
    /// The rank that marked it, in a merged trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_layers_are_told_from_module_paths() {
        let l = source_layer("/home/me/proj/train.py", 40, "train_step");
        assert_eq!(l, "train.py:40 in train_step");
        assert!(is_source_layer(&l));
        assert!(is_source_layer("<string>:1 in <module>"));
        assert_eq!(layer_place(&l), "at train.py:40 in train_step");
        assert_eq!(layer_place("blocks.0"), "in blocks.0");
        for module in ["blocks.0.mlp", "optimizer.step", "compiled(GPT)", "unattributed", "layer1.0 in x", "a:b in c"] {
            assert!(!is_source_layer(module), "{module}");
        }
    }
}
