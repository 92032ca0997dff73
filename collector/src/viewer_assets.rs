//! The viewer's files, embedded at build time (`build.rs`): what `collector serve` serves, and
//! what `collector report` writes with a trace, as a static folder that any static host serves
//! (no server logic: the page fetches the trace named in its `<meta name="memory-tracer-trace">`)
//! or as one self-contained HTML file with the wasm, the worker and the trace inlined.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use traceio::files::write_atomic;

include!(concat!(env!("OUT_DIR"), "/viewer_assets.rs"));

/// The embedded viewer's files, or an error saying how to get them.
pub fn embedded() -> Result<&'static [(&'static str, &'static [u8])]> {
    if !VIEWER_ASSETS.iter().any(|(n, _)| *n == "index.html") {
        bail!(
            "this collector was built without the viewer: build it first (`cargo xtask viewer` writes dist/), then rebuild the collector"
        );
    }
    Ok(VIEWER_ASSETS)
}

fn asset(predicate: impl Fn(&str) -> bool, what: &str) -> Result<&'static [u8]> {
    embedded()?.iter().find(|(n, _)| predicate(n)).map(|(_, b)| *b).with_context(|| format!("the embedded viewer has no {what}"))
}

/// A file name that is safe in a URL, a header and on any file system.
pub(crate) fn safe_name(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "trace".into());
    let cleaned: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' }).collect();
    if cleaned.starts_with('.') || cleaned == "index.html" {
        format!("trace{cleaned}")
    } else {
        cleaned
    }
}

/// Writes the static report folder; returns the files written.
pub fn write_folder(trace_path: &Path, trace_bytes: &[u8], out: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let trace_name = safe_name(trace_path);
    let mut written = Vec::new();
    for (name, bytes) in embedded()? {
        let dest = out.join(name);
        if *name == "index.html" {
            let html = std::str::from_utf8(bytes).context("the embedded index.html is not UTF-8")?;
            let meta = format!("<meta name=\"memory-tracer-trace\" content=\"{trace_name}\" />\n</head>");
            let html = html.replacen("</head>", &meta, 1);
            write_atomic(&dest, |w| Ok(w.write_all(html.as_bytes())?))?;
        } else {
            write_atomic(&dest, |w| Ok(w.write_all(bytes)?))?;
        }
        written.push(dest);
    }
    let dest = out.join(&trace_name);
    write_atomic(&dest, |w| Ok(w.write_all(trace_bytes)?))?;
    written.push(dest);
    Ok(written)
}

/// A JavaScript string literal that is safe inside `<script>`.
fn js_string(s: &str) -> Result<String> {
    Ok(serde_json::to_string(s)?.replace("</", "<\\/"))
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Writes one HTML file holding the viewer, its worker and the trace (base64), for mailing.
pub fn write_single_file(trace_path: &Path, trace_bytes: &[u8], out: &Path) -> Result<()> {
    let is = |prefix: &'static str, suffix: &'static str| move |n: &str| n.starts_with(prefix) && n.ends_with(suffix);
    let css = std::str::from_utf8(asset(is("style", ".css"), "stylesheet")?)?;
    let main_js = std::str::from_utf8(asset(|n| n.starts_with("viewer") && n.ends_with(".js"), "viewer script")?)?;
    let main_wasm = asset(is("viewer", "_bg.wasm"), "viewer wasm")?;
    let worker_js = std::str::from_utf8(asset(|n| n == "worker.js", "worker script")?)?;
    let worker_wasm = asset(|n| n == "worker_bg.wasm", "worker wasm")?;
    // The page's icon, inline in its index.html (a single file asks no server for one).
    let page = std::str::from_utf8(asset(|n| n == "index.html", "page")?)?;
    let icon = page.lines().find(|l| l.contains("rel=\"icon\"")).unwrap_or_default().trim();
    let name = safe_name(trace_path);
    // The worker runs from a Blob: its glue, then its wasm from inlined bytes.
    let worker_source = format!(
        "{worker_js}\nwasm_bindgen({{module_or_path: Uint8Array.from(atob({}), c => c.charCodeAt(0))}});",
        js_string(&base64(worker_wasm))?
    );
    let html = format!(
        r#"<!doctype html>
<html lang="en" data-theme="dark">
<head>
<meta charset="utf-8" />
<meta name="viewport" content="width=device-width, initial-scale=1" />
<title>Memory Tracer · {title}</title>
{icon}
<style>{css}</style>
</head>
<body>
<script>
const b64 = s => Uint8Array.from(atob(s), c => c.charCodeAt(0));
window.__mtWorkerUrl = URL.createObjectURL(new Blob([{worker_source}], {{type: "text/javascript"}}));
window.__mtTrace = {{name: {name}, bytes: b64({trace})}};
</script>
<script type="module">
const url = URL.createObjectURL(new Blob([{main_js}], {{type: "text/javascript"}}));
const glue = await import(url);
await glue.default({{module_or_path: Uint8Array.from(atob({main_wasm}), c => c.charCodeAt(0))}});
</script>
</body>
</html>
"#,
        title = name.replace(['<', '>', '&'], "_"),
        css = css.replace("</", "<\\/"),
        worker_source = js_string(&worker_source)?,
        name = js_string(&name)?,
        trace = js_string(&base64(trace_bytes))?,
        main_js = js_string(main_js)?,
        main_wasm = js_string(&base64(main_wasm))?,
    );
    write_atomic(out, |w| Ok(w.write_all(html.as_bytes())?))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn names_cannot_escape_or_replace_the_page() {
        assert_eq!(safe_name(Path::new("/a/b/../x y.pickle")), "x_y.pickle");
        assert_eq!(safe_name(Path::new("index.html")), "traceindex.html");
        assert_eq!(safe_name(Path::new(".hidden")), "trace.hidden");
        assert_eq!(js_string("</script>").unwrap(), "\"<\\/script>\"");
    }
}
