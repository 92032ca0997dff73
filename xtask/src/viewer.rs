//! The viewer's build: what `viewer/index.html`'s `data-trunk` links ask for, done with the
//! pinned wasm-bindgen and wasm-opt and written into `dist/` as Trunk writes it (a hashed
//! stylesheet, the page's module script and wasm, the Web Worker's no-modules script, wasm and
//! loader). Trunk itself is not needed: compiling it from crates.io took 7 of a fresh
//! machine's first 23 minutes (docs/benchmarks.md, "The first run"), for a dev server the
//! collector replaces. `index.html` stays Trunk's input, so `trunk serve` works where Trunk is.

use crate::cmd::run;
use crate::install;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The viewer's components in headless Chromium (runner: wasm-bindgen-test-runner, from
/// `.cargo/config.toml`; browser options in `viewer/webdriver.json`). Chromium's temporary
/// profiles (~30 MB a browser, left behind) go to a folder of `target/`, removed after, not to
/// `/tmp`.
pub fn browser_tests() -> Result<()> {
    let temp = std::env::current_dir()?.join(cargo_target_dir()).join("tmp/viewer-chromium");
    std::fs::create_dir_all(&temp).with_context(|| format!("cannot create {}", temp.display()))?;
    let ran = run(Command::new("cargo")
        .args(["test", "-p", "viewer", "--target", "wasm32-unknown-unknown", "--test", "web"])
        .envs([("CHROMEDRIVER", Path::new("/usr/bin/chromedriver")), ("TMPDIR", &temp)])
        .current_dir("viewer"));
    std::fs::remove_dir_all(&temp).ok();
    ran
}

/// One `<link data-trunk ...>` of the page.
#[derive(Debug, PartialEq)]
enum Asset {
    /// `rel="css"`: a stylesheet, copied under a hashed name.
    Css { href: String },
    /// `rel="rust"`: a binary of the viewer crate; `worker` for `data-type="worker"` (built for
    /// `no-modules`, with a loader script), the page's module otherwise; `opt` the wasm-opt level.
    Rust { bin: String, worker: bool, opt: Option<String> },
}

/// The `data-trunk` links of `html`, each with the line it is on.
fn assets(html: &str) -> Result<Vec<(usize, Asset)>> {
    let mut out = Vec::new();
    for (n, line) in html.lines().enumerate() {
        if !line.contains("data-trunk") {
            continue;
        }
        let attr = |name: &str| -> Option<String> {
            let key = format!(" {name}=\"");
            let start = line.find(&key)? + key.len();
            Some(line[start..].split('"').next()?.to_owned())
        };
        let asset = match attr("rel").as_deref() {
            Some("css") => {
                Asset::Css { href: attr("href").with_context(|| format!("viewer/index.html:{}: a css link without href", n + 1))? }
            }
            Some("rust") => Asset::Rust {
                bin: attr("data-bin").with_context(|| format!("viewer/index.html:{}: a rust link without data-bin", n + 1))?,
                worker: attr("data-type").as_deref() == Some("worker"),
                opt: attr("data-wasm-opt").filter(|o| o != "0"),
            },
            other => bail!("viewer/index.html:{}: a data-trunk link this build does not know (rel={other:?})", n + 1),
        };
        out.push((n, asset));
    }
    Ok(out)
}

/// Where cargo writes its builds: `CARGO_TARGET_DIR` when set (several worktrees sharing one
/// build), else `target/`.
pub fn cargo_target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("target"))
}

/// FNV-1a of `bytes`, as the 16 hex digits a file name carries.
fn hash(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{h:016x}")
}

/// Builds the viewer into `dist/` ([`compile`], then [`package`], with the pinned wasm-opt).
/// `optimize`: run wasm-opt (the tests, benchmarks and wheels); the main job skips it (the
/// wasm is larger, the build minutes shorter).
pub fn build(optimize: bool) -> Result<()> {
    run(Command::new("cargo").args(["fetch"]))?;
    compile()?;
    package(&install::wasm_opt(), optimize)?;
    let wasm: u64 = std::fs::read_dir("dist")?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "wasm"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    if wasm == 0 {
        bail!("the viewer's build left no .wasm in dist/");
    }
    eprintln!("xtask: viewer built into dist/ ({wasm} bytes of wasm)");
    Ok(())
}

/// Compiles the page's binaries for wasm32 (release): all the build needs but wasm-bindgen and
/// wasm-opt, so it can run while those are installed.
pub fn compile() -> Result<()> {
    let html = std::fs::read_to_string("viewer/index.html").context("cannot read viewer/index.html")?;
    let assets = assets(&html)?;
    let bins: Vec<&str> = assets
        .iter()
        .filter_map(|(_, a)| match a {
            Asset::Rust { bin, .. } => Some(bin.as_str()),
            Asset::Css { .. } => None,
        })
        .collect();
    let mut cargo = Command::new("cargo");
    cargo.args(["build", "--release", "--target=wasm32-unknown-unknown", "--manifest-path", "viewer/Cargo.toml"]);
    for b in &bins {
        cargo.args(["--bin", b]);
    }
    run(&mut cargo)
}

/// Writes `dist/` (replaced whole once everything is written) from what [`compile`] built.
/// `optimize`: run wasm-opt at the levels the page asks for (the tests and wheels); the main
/// job skips it, which only makes the wasm larger.
pub fn package(wasm_opt: &Path, optimize: bool) -> Result<()> {
    let html = std::fs::read_to_string("viewer/index.html").context("cannot read viewer/index.html")?;
    let assets = assets(&html)?;
    let staging = PathBuf::from("target/dist-staging");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    let mut page: Vec<String> = html.lines().map(str::to_owned).collect();
    let mut head_end = Vec::new();
    for (line, asset) in &assets {
        match asset {
            Asset::Css { href } => {
                let src = Path::new("viewer").join(href);
                let bytes = std::fs::read(&src).with_context(|| format!("cannot read {}", src.display()))?;
                let name = format!("{}-{}.css", src.file_stem().and_then(|s| s.to_str()).unwrap_or("style"), hash(&bytes));
                std::fs::write(staging.join(&name), &bytes)?;
                page[*line] = format!("    <link rel=\"stylesheet\" href=\"./{name}\"/>");
            }
            Asset::Rust { bin, worker, opt } => {
                let wasm = cargo_target_dir().join(format!("wasm32-unknown-unknown/release/{bin}.wasm"));
                let bytes = std::fs::read(&wasm).with_context(|| format!("cargo built no {}", wasm.display()))?;
                // Trunk's names: the worker keeps its own (its loader names it), the page's is hashed.
                let name = if *worker { bin.clone() } else { format!("{bin}-{}", hash(&bytes)) };
                let target = if *worker { "no-modules" } else { "web" };
                run(Command::new("wasm-bindgen")
                    .arg(format!("--target={target}"))
                    .arg(format!("--out-dir={}", staging.display()))
                    .arg(format!("--out-name={name}"))
                    .arg("--no-typescript")
                    .arg(&wasm))?;
                let out_wasm = staging.join(format!("{name}_bg.wasm"));
                if let (true, Some(level)) = (optimize, opt) {
                    run(Command::new(wasm_opt).arg(format!("--output={}", out_wasm.display())).arg(format!("-O{level}")).arg(&out_wasm))?;
                }
                if *worker {
                    std::fs::write(
                        staging.join(format!("{name}_loader.js")),
                        format!("importScripts(\"./{name}.js\");wasm_bindgen(\"./{name}_bg.wasm\");"),
                    )?;
                    page[*line] = String::new();
                } else {
                    page[*line] = format!(
                        "<script type=\"module\">\nimport init, * as bindings from './{name}.js';\nconst wasm = await init({{ module_or_path: './{name}_bg.wasm' }});\nwindow.wasmBindings = bindings;\ndispatchEvent(new CustomEvent(\"TrunkApplicationStarted\", {{detail: {{wasm}}}}));\n</script>"
                    );
                    head_end.push(format!(
                        "<link rel=\"modulepreload\" href=\"./{name}.js\" crossorigin=\"anonymous\"><link rel=\"preload\" href=\"./{name}_bg.wasm\" crossorigin=\"anonymous\" as=\"fetch\" type=\"application/wasm\">"
                    ));
                }
            }
        }
    }
    let mut page = page.join("\n");
    page = page.replacen("</head>", &format!("  {}</head>", head_end.join("")), 1);
    std::fs::write(staging.join("index.html"), page + "\n")?;
    let _ = std::fs::remove_dir_all("dist");
    std::fs::rename(&staging, "dist").context("cannot move the built viewer into dist/")?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The page's links as the build reads them: each kind, its attributes, its line.
    #[test]
    fn the_pages_links_are_read_with_their_attributes() {
        let html = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../viewer/index.html")).unwrap();
        let a = assets(&html).unwrap();
        assert_eq!(a.len(), 3, "{a:?}");
        assert!(matches!(&a[0].1, Asset::Css { href } if href.ends_with("style.css")));
        assert_eq!(a[1].1, Asset::Rust { bin: "viewer".into(), worker: false, opt: Some("z".into()) });
        assert_eq!(a[2].1, Asset::Rust { bin: "worker".into(), worker: true, opt: Some("3".into()) });
        assert!(assets("<link data-trunk rel=\"copy-dir\" href=\"x\" />").is_err());
        assert_ne!(hash(b"a"), hash(b"b"));
        assert_eq!(hash(b"").len(), 16);
    }
}
