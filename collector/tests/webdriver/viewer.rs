//! The built viewer and the pages the browser tests open it in: where `cargo xtask viewer` put
//! it, the test data, the screenshots' folder, and the waits every viewer test shares.

use super::Browser;
use serde_json::json;
use std::path::PathBuf;

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The viewer `cargo xtask viewer` built (`dist/`, which `cargo xtask test` builds first).
pub fn dist() -> PathBuf {
    let d = repo().join("dist");
    assert!(
        d.join("index.html").exists() && d.join("worker_loader.js").exists(),
        "{} has no built viewer: run `cargo xtask viewer` before this test",
        d.display()
    );
    d
}

/// A file of `tests/data/`.
pub fn sample(name: &str) -> PathBuf {
    repo().join("tests/data").join(name)
}

/// Where the browser tests leave their screenshots (`target/e2e-screenshots/`).
pub fn screenshots() -> PathBuf {
    let d = repo().join("target/e2e-screenshots");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Opens the viewer at `url` and waits until it takes a file.
pub fn goto_viewer(b: &Browser, url: &str) {
    b.goto(url);
    b.wait_for("return document.querySelector('#trace-file')", 30, "the page");
}

/// Waits until `file_name` is loaded and every chart drawn.
pub fn wait_drawn(b: &Browser, file_name: &str) {
    b.wait_for(
        &format!(
            "const h = document.querySelector('#summary h2'); return document.body.dataset.drawnMs && h && h.textContent === {} && !document.querySelector('#progress')",
            json!(file_name)
        ),
        90,
        &format!("{file_name} to be drawn"),
    );
}
