//! Mixed-precision predictions against runs that applied them, on an H100
//! (`tests/gpu/amp_fixtures.sh`: a 2-layer Llama-architecture LM and ResNet-18;
//! `tests/gpu/amp_run.sh`: the 6-layer Llama-architecture LM with GQA at 8 x 512, where a
//! global halving of activations was 7.5 % and 12.8 % low, and the GPT-2-shaped decoder at
//! 8 x 1024, where it was 6.5 % high with checkpoints): each fixture is a baseline traced with every operator and
//! the `collector advise --verify` table of the same program run with autocast, with the
//! suggested checkpoints, and both, whose peaks PyTorch's counters confirmed. The predictions
//! are computed again from the baseline by the code under test, and must land within 5 %.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::analysis::advice::{advise, predict_peak, AdviceOptions, SuggestionKind};
use shared::{import, ImportOptions, Trace};
use std::path::PathBuf;

fn data(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// The baseline trace and the verify table's rows: (configuration, flags, measured peak).
fn fixture(name: &str) -> (Trace, Vec<(String, Vec<String>, u64)>) {
    let trace = import(&data(&format!("amp_{name}.baseline.mtrace.json.gz")), &ImportOptions::default()).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&data(&format!("amp_{name}.verify.json"))).unwrap();
    let rows = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let flags = r["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_owned()).collect();
            let measured = r["peak_allocated_bytes"].as_u64().unwrap();
            // The measured peak is PyTorch's own.
            assert_eq!(Some(measured), r["pytorch_max_allocated_bytes"].as_u64(), "{name}");
            (r["configuration"].as_str().unwrap().to_owned(), flags, measured)
        })
        .collect();
    (trace, rows)
}

fn within_5_percent(what: &str, predicted: u64, measured: u64) {
    let err = (predicted as f64 - measured as f64) / measured as f64 * 100.0;
    assert!(err.abs() <= 5.0, "{what}: predicted {predicted}, measured {measured} ({err:+.1} %)");
}

/// Every configuration the run measured: autocast alone (the AMP suggestion's peak), and the
/// suggested checkpoints without and with autocast (replayed for the same modules).
#[test]
fn autocast_and_checkpoint_predictions_land_within_5_percent_of_the_runs() {
    for name in ["llama", "resnet18", "llama_6l", "gpt2"] {
        let (trace, rows) = fixture(name);
        let report = advise(&trace, &AdviceOptions::default());
        let mut checked = 0;
        for (config, flags, measured) in &rows {
            let amp = flags.iter().any(|f| f == "--amp");
            let layers: Vec<String> = flags
                .iter()
                .position(|f| f == "--checkpoint")
                .map(|k| flags[k + 1].split(',').map(str::to_owned).collect())
                .unwrap_or_default();
            let predicted = match (amp, layers.is_empty()) {
                (false, true) => continue,
                (true, true) => {
                    report.suggestions.iter().find(|s| s.kind == SuggestionKind::Amp).expect("an AMP suggestion").predicted_peak_bytes
                }
                (_, false) => predict_peak(&trace, &layers, amp).unwrap(),
            };
            within_5_percent(&format!("{name} {config}"), predicted, *measured);
            checked += 1;
        }
        assert!(checked >= 1, "{name}: {rows:?}");
    }
}

/// A model none of whose operators autocast runs in bf16 gets no AMP suggestion, but a note
/// saying why (here: the ResNet-18 baseline with its convolutions and matmuls renamed).
#[test]
fn a_model_without_autocast_eligible_operators_gets_a_note_not_a_suggestion() {
    let (mut trace, _) = fixture("resnet18");
    let other = trace.strings.intern("aten::my_custom_op");
    for o in &mut trace.ops {
        let n = trace.strings.get(o.name).unwrap_or_default();
        if n.starts_with("aten::conv")
            || n.starts_with("aten::_conv")
            || n.starts_with("aten::cudnn")
            || matches!(n, "aten::linear" | "aten::addmm" | "aten::mm" | "aten::matmul")
        {
            o.name = other;
        }
    }
    let report = advise(&trace, &AdviceOptions::default());
    assert!(report.suggestions.iter().all(|s| s.kind != SuggestionKind::Amp), "{:?}", report.suggestions);
    assert!(report.notes.iter().any(|n| n.contains("no operator autocast runs in bf16")), "{:?}", report.notes);
}
