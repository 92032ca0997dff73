//! The viewer inline in a Jupyter notebook, end to end: a notebook that traces a model with
//! `%%memtrace` and `tracer.show()` and shows a PyTorch snapshot with `memory_tracer.show(path)`
//! is run by nbclient on a real IPython kernel, saved, read back and exported to HTML by
//! nbconvert, and that HTML file opens in Debian's headless Chromium with no server: every
//! output's iframe draws the viewer (summary naming the trace with its peak, charts painted).
//!
//! Needs the torch venv's Python (`MEMORY_TRACER_PYTHON`, set by `cargo xtask`; else `python3`)
//! with nbclient, nbformat, nbconvert and ipykernel (xtask's `PY_TEST_DEPS`), chromium and
//! chromedriver (as viewer_e2e.rs), and a collector built with the viewer (dist/) and the
//! capture library.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod webdriver;

use serde_json::json;
use shared::analysis::summary;
use shared::units::format_bytes;
use shared::ImportOptions;
use std::path::{Path, PathBuf};
use std::process::Command;
use traceio::files::load_trace;
use webdriver::Browser;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> String {
    std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("notebook-e2e-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The package as the wheel holds it: the checkout's Python sources beside the capture
/// libraries this collector carries.
fn package(dir: &Path) -> PathBuf {
    let pkg = collector::pyrun::package::materialize(&dir.join("pkg")).unwrap();
    let sources = repo().join("collector/python/memory_tracer");
    for entry in std::fs::read_dir(&sources).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "py") {
            std::fs::copy(&path, pkg.join("memory_tracer").join(entry.file_name())).unwrap();
        }
    }
    pkg
}

/// Runs the notebook, saves it, reads it back and exports it: `traced.ipynb` and `traced.html`
/// in `out`, with the traces the cells save beside them.
const RUN_NOTEBOOK: &str = r#"
import sys
import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter

out, snapshot = sys.argv[1], sys.argv[2]
code = nbformat.v4.new_code_cell
nb = nbformat.v4.new_notebook(
    cells=[
        code("import torch\nimport torch.nn as nn\nimport memory_tracer\n%load_ext memory_tracer"),
        code("torch.manual_seed(0)\nmodel = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))"),
        code(f"%%memtrace --device cpu --model model --height 600 --save {out}/magic.mtrace.json\n"
             "loss = model(torch.randn(32, 64)).square().mean()\nloss.backward()"),
        code("tracer = memory_tracer.MemoryTracer(device='cpu')\n"
             "with tracer.trace(model):\n    model(torch.randn(512, 64)).sum().backward()\n"
             f"tracer.save('{out}/api.mtrace.json')\ntracer.show(height=600)"),
        code(f"memory_tracer.show('{snapshot}', height=600)"),
    ],
    metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
)
NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": out}}).execute()
nbformat.write(nb, f"{out}/traced.ipynb")
saved = nbformat.read(f"{out}/traced.ipynb", as_version=4)
body, _ = HTMLExporter().from_notebook_node(saved)
with open(f"{out}/traced.html", "w", encoding="utf-8") as f:
    f.write(body)
"#;

/// The packages RUN_NOTEBOOK imports, or a panic saying how to get them.
fn require_notebook_packages() {
    let out = Command::new(python()).args(["-c", "import nbclient, nbformat, nbconvert, ipykernel, IPython"]).output();
    let ok = out.as_ref().is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{} cannot run a notebook: {}; install the pinned nbclient, nbformat, nbconvert, ipykernel and ipython \
         (`cargo xtask test` puts them into the torch venv; see PY_TEST_DEPS in xtask/src/install.rs)",
        python(),
        out.map(|o| String::from_utf8_lossy(&o.stderr).trim().lines().last().unwrap_or_default().to_owned())
            .unwrap_or_else(|e| e.to_string())
    );
}

/// The viewer in the `index`th notebook output: loaded, summary and charts drawn.
fn viewer_ready(index: usize, name: &str) -> String {
    format!(
        "const f = document.querySelectorAll('iframe.memory-tracer-viewer')[{index}];
         const d = f && f.contentDocument;
         const h = d && d.querySelector('#summary h2');
         if (!(d && d.body.dataset.drawnMs && h && h.textContent === {name} && !d.querySelector('#progress'))) return false;
         const c = d.getElementById('timeline-canvas');
         const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
         let painted = 0;
         for (let i = 0; i < px.length; i += 4) if (px[i] !== px[0] || px[i+1] !== px[1] || px[i+2] !== px[2]) painted++;
         return {{summary: d.querySelector('#summary').innerText, painted}};",
        name = json!(name)
    )
}

#[test]
fn an_exported_notebook_draws_the_viewer_of_each_trace_it_shows() {
    require_notebook_packages();
    let dir = tmpdir("export");
    let pkg = package(&dir);
    let snapshot = repo().join("tests/data/mlp_adam_3steps.pickle").canonicalize().unwrap();
    let out = Command::new(python())
        .args(["-c", RUN_NOTEBOOK])
        .arg(&dir)
        .arg(&snapshot)
        .env("PYTHONPATH", &pkg)
        .env("MEMORY_TRACER_COLLECTOR", env!("CARGO_BIN_EXE_collector"))
        .env_remove("MEMORY_TRACER_PYTHONPATH")
        .output()
        .unwrap();
    assert!(out.status.success(), "the notebook failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let page = dir.join("traced.html");
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(html.matches("<iframe class=\"memory-tracer-viewer\"").count(), 3, "one viewer per output");

    // Opened as a file, as someone opens an exported notebook: nothing is served.
    let b = Browser::start(1400, 1000);
    b.goto(&format!("file://{}", page.display()));
    let shown = [("magic.mtrace.json", "trace.mtrace.json"), ("api.mtrace.json", "trace.mtrace.json")];
    let traces = shown.iter().map(|(saved, name)| (dir.join(saved), *name)).chain([(snapshot.clone(), "mlp_adam_3steps.pickle")]);
    for (i, (path, name)) in traces.enumerate() {
        b.exec(&format!("document.querySelectorAll('iframe.memory-tracer-viewer')[{i}].scrollIntoView()"), json!([]));
        let drawn = b.wait_for(&viewer_ready(i, name), 120, &format!("the viewer of output {i} ({name}) to draw"));
        b.screenshot(&screenshots().join(format!("notebook-{i}.png")));
        let peak = summary(&load_trace(&path, &ImportOptions::default()).unwrap()).peak_allocated_bytes;
        let text = drawn["summary"].as_str().unwrap();
        assert!(text.contains(&format_bytes(peak)), "output {i}: the summary lacks the peak {}: {text}", format_bytes(peak));
        let painted = drawn["painted"].as_u64().unwrap();
        assert!(painted > 2000, "output {i}: the timeline is blank ({painted} painted pixels)");
    }
    // Kept when something failed, to look at; about 50 MB otherwise.
    let _ = std::fs::remove_dir_all(&dir);
}

fn screenshots() -> PathBuf {
    let d = repo().join("target/e2e-screenshots");
    std::fs::create_dir_all(&d).unwrap();
    d
}
