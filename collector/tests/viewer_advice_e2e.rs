//! One advice, everywhere, end to end in Debian's headless Chromium: the viewer `cargo xtask
//! viewer` built (`dist/`, served by a plain static server) opens real PyTorch snapshots and
//! its Advice table shows the rows `collector advise --json` gives for the same file — the same
//! changes in the same order, each with the same predicted reserved peak (what runs out), the
//! same saving and the allocated peak beside it — and lists the changes that save nothing
//! there under "No effect here", as the CLI does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod webdriver;

use serde_json::{json, Value};
use shared::analysis::advice::{advice_rows, AdviceReport, AdviceRows};
use std::path::Path;
use std::process::Command;
use webdriver::viewer::{dist, repo};
use webdriver::{static_server, Browser};

/// `collector advise FILE --json`, read back as its rows.
fn cli_rows(path: &Path) -> AdviceRows {
    let out = Command::new(env!("CARGO_BIN_EXE_collector")).arg("advise").arg(path).arg("--json").output().unwrap();
    assert!(out.status.success(), "collector advise: {}", String::from_utf8_lossy(&out.stderr));
    let report: AdviceReport = serde_json::from_slice(&out.stdout).unwrap();
    advice_rows(&report)
}

/// Opens `path` in the page and waits until it is drawn and its advice is shown.
fn open(b: &Browser, path: &Path) {
    let name = path.file_name().unwrap().to_str().unwrap();
    b.upload("#trace-file", path);
    b.wait_for(
        &format!(
            "const h = document.querySelector('#summary h2'); return document.body.dataset.drawnMs && h && h.textContent === {} && !document.querySelector('#progress')",
            json!(name)
        ),
        90,
        &format!("{name} to be drawn"),
    );
    b.exec("document.getElementById('advice').scrollIntoView()", json!([]));
    b.wait_for("return document.querySelector('#advice-measured')", 60, "the advice");
}

/// The Advice table's rows and its "No effect here" list, as the page shows them.
const SHOWN: &str = r#"
const table = document.getElementById('advice-table');
const rows = [...(table ? table.querySelectorAll('tbody tr') : [])].map(r => [
  r.dataset.kind, r.cells[0].textContent, r.cells[1].textContent,
  r.cells[2].dataset.bytes, r.cells[2].textContent, r.cells[3].dataset.bytes, r.cells[3].textContent,
  r.cells[4].dataset.bytes, r.cells[4].textContent]);
const none = [...document.querySelectorAll('#advice-no-effect li')].map(l => [l.dataset.kind, l.textContent]);
const header = table ? table.querySelector('thead th:nth-child(3)').textContent : null;
return {judged: document.getElementById('advice-measured').dataset.judgedBy, header, rows, none};"#;

/// What the page must show for `rows`, in [`SHOWN`]'s shape: no table where nothing is ranked.
fn expected(rows: &AdviceRows) -> Value {
    let judged = serde_json::to_value(rows.judged_by).unwrap();
    let header = match (rows.ranked.is_empty(), judged == "reserved") {
        (true, _) => Value::Null,
        (false, true) => json!("predicted reserved peak"),
        (false, false) => json!("predicted peak"),
    };
    let ranked: Vec<Value> = rows
        .ranked
        .iter()
        .map(|r| {
            json!([
                r.kind.as_str(),
                r.rank.unwrap().to_string(),
                r.change,
                r.peak_bytes.to_string(),
                r.peak_text,
                r.saving_bytes.to_string(),
                r.saving_text,
                r.allocated_peak_bytes.to_string(),
                r.allocated_text
            ])
        })
        .collect();
    let none: Vec<Value> = rows.no_effect.iter().map(|r| json!([r.kind.as_str(), r.line()])).collect();
    json!({"judged": judged, "header": header, "rows": ranked, "none": none})
}

/// A fragmented snapshot (8.4 % of its reserved memory unused at the peak) where a replay finds
/// that expandable segments save 18 MiB of the reserved peak and dropping the optimizer's state
/// 48 MiB; then one where nothing saves any of it (Adam's state and `set_to_none` move only the
/// allocated peak): the page shows `collector advise --json`'s rows for both.
#[test]
fn the_viewers_advice_rows_are_collector_advise_json_rows() {
    let (_server, url) = static_server(&dist());
    let b = Browser::start(1400, 1000);
    b.goto(&format!("{url}/index.html"));
    b.wait_for("return document.querySelector('#trace-file')", 30, "the page");

    let fragmented = repo().join("tests/data/resnet18_sgd_2steps.pickle");
    let rows = cli_rows(&fragmented);
    let kinds: Vec<&str> = rows.ranked.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["optimizer", "expandable_segments"], "{rows:?}");
    open(&b, &fragmented);
    assert_eq!(b.exec(SHOWN, json!([])), expected(&rows));
    let shots = repo().join("target/e2e-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    b.screenshot(&shots.join("advice-reserved.png"));

    let unmoved = repo().join("tests/data/mlp_adam_3steps.pickle");
    let rows = cli_rows(&unmoved);
    assert!(rows.ranked.is_empty() && rows.no_effect.iter().any(|r| r.kind.as_str() == "set_to_none"), "{rows:?}");
    open(&b, &unmoved);
    b.wait_for("return document.querySelectorAll('#advice-no-effect li').length > 0", 60, "the changes with no effect");
    let nothing = b.exec("return document.getElementById('advice-nothing').textContent", json!([]));
    assert_eq!(nothing, "No change saves any of the reserved peak on this trace.");
    assert_eq!(b.exec(SHOWN, json!([])), expected(&rows));
    b.screenshot(&shots.join("advice-no-effect.png"));
}
