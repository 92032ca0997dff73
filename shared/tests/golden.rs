//! Golden-file tests: every real sample in `tests/data/` through every importer and exporter,
//! compared byte for byte with the expected output in `tests/data/golden/`.
//!
//! Regenerate all expected files with `MEMORY_TRACER_BLESS=1 cargo test -p memory-tracer-shared
//! --test golden` and review the diff.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly by design

use shared::export::{export, ExportFormat};
use shared::{import, ImportOptions};
use std::path::PathBuf;

const SAMPLES: [&str; 4] =
    ["mlp_adam_3steps.pickle", "resnet18_sgd_2steps.pickle", "convnet_profiler_trace.json", "dftracer_sample.pfw.gz"];

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

fn check(name: &str, actual: &[u8]) {
    let path = data_dir().join("golden").join(name);
    if std::env::var_os("MEMORY_TRACER_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run with MEMORY_TRACER_BLESS=1 to create it", path.display()));
    if expected != actual {
        let line = expected.split(|&b| b == b'\n').zip(actual.split(|&b| b == b'\n')).position(|(a, b)| a != b).map_or(0, |l| l + 1);
        panic!(
            "{} differs from the output (first differing line {line}, {} vs {} bytes); \
             rerun with MEMORY_TRACER_BLESS=1 if the change is intended",
            path.display(),
            expected.len(),
            actual.len()
        );
    }
}

#[test]
fn every_sample_through_every_exporter_matches_golden() {
    for sample in SAMPLES {
        let raw = std::fs::read(data_dir().join(sample)).unwrap();
        let trace = import(&raw, &ImportOptions::default()).unwrap_or_else(|e| panic!("{sample}: {e}"));
        for format in ExportFormat::ALL {
            let mut out = Vec::new();
            export(&trace, format, &mut out).unwrap();
            check(&format!("{sample}.{}", format.extension()), &out);
        }
    }
}

#[test]
fn native_format_round_trips_losslessly() {
    for sample in SAMPLES {
        let raw = std::fs::read(data_dir().join(sample)).unwrap();
        let trace = import(&raw, &ImportOptions::default()).unwrap();
        let mut first = Vec::new();
        export(&trace, ExportFormat::Native, &mut first).unwrap();
        let again = import(&first, &ImportOptions::default()).unwrap_or_else(|e| panic!("{sample}: {e}"));
        for format in ExportFormat::ALL {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            export(&trace, format, &mut a).unwrap();
            export(&again, format, &mut b).unwrap();
            assert!(a == b, "{sample}: {} export differs after a native round trip", format.name());
        }
    }
}

#[test]
fn gzip_input_imports_like_plain_input() {
    use std::io::Write;
    let raw = std::fs::read(data_dir().join("convnet_profiler_trace.json")).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).unwrap();
    let gz = gz.finish().unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    export(&import(&raw, &ImportOptions::default()).unwrap(), ExportFormat::Native, &mut a).unwrap();
    export(&import(&gz, &ImportOptions::default()).unwrap(), ExportFormat::Native, &mut b).unwrap();
    assert_eq!(a, b);
}
