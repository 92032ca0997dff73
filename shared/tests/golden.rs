//! Golden-file tests: every real sample in `tests/data/` through every importer and exporter,
//! compared exactly with the expected output in `tests/data/golden/`.
//!
//! JSON outputs are stored pretty-printed (two-space indent, one value per line, the
//! exporter's own tokens and key order kept), so that a failure names the JSON pointer of the
//! first differing value and a re-bless shows as a readable diff; the comparison is of every
//! token, so any change to a value, a key or their order fails. Gzip outputs (`.pfw.gz`) are
//! compared on their decompressed lines, then byte for byte; other outputs line by line.
//!
//! Regenerate all expected files with `MEMORY_TRACER_BLESS=1 cargo test -p shared
//! --test golden` and review the diff.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly by design

use shared::export::{export, ExportFormat};
use shared::{import, ImportOptions};
use std::io::Read;
use std::path::PathBuf;

const SAMPLES: [&str; 4] =
    ["mlp_adam_3steps.pickle", "resnet18_sgd_2steps.pickle", "convnet_profiler_trace.json", "dftracer_sample.pfw.gz"];

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

/// How a golden file is stored and compared, by its name.
enum Kind {
    Json,
    Gzip,
    Text,
}

impl Kind {
    fn of(name: &str) -> Kind {
        if name.ends_with(".json") {
            Kind::Json
        } else if name.ends_with(".gz") {
            Kind::Gzip
        } else {
            Kind::Text
        }
    }
}

fn check(name: &str, actual: &[u8]) {
    let path = data_dir().join("golden").join(name);
    let kind = Kind::of(name);
    if std::env::var_os("MEMORY_TRACER_BLESS").is_some() {
        let stored = match kind {
            Kind::Json => pretty_json(actual).unwrap_or_else(|e| panic!("{name}: the export is not JSON: {e}")).text(),
            Kind::Gzip | Kind::Text => actual.to_vec(),
        };
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, stored).unwrap();
        return;
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run with MEMORY_TRACER_BLESS=1 to create it", path.display()));
    let difference = match kind {
        Kind::Json => json_difference(&expected, actual),
        Kind::Gzip => gzip_difference(&expected, actual),
        Kind::Text => line_difference(&expected, actual),
    };
    if let Some(difference) = difference {
        panic!("{difference}\nin {}; rerun with MEMORY_TRACER_BLESS=1 if the change is intended", path.display());
    }
}

/// The first difference between two JSON documents, token by token, in document order: the
/// JSON pointer of the value that differs, its line in the pretty-printed golden file, and
/// what each side holds there. Where the two sides hold different members (one was added,
/// removed or renamed), the message names the object or array both are in and each side's.
fn json_difference(expected: &[u8], actual: &[u8]) -> Option<String> {
    let expected = match pretty_json(expected) {
        Ok(p) => p,
        Err(e) => return Some(format!("the golden file is not JSON: {e}")),
    };
    let actual = match pretty_json(actual) {
        Ok(p) => p,
        Err(e) => return Some(format!("the export is not JSON: {e}")),
    };
    let (e, a) = (expected.lines.as_slice(), actual.lines.as_slice());
    let i = (0..e.len().max(a.len())).find(|&i| e.get(i).map(|l| &l.text) != a.get(i).map(|l| &l.text))?;
    let (golden, export) = (e.get(i), a.get(i));
    let where_ = format!("line {} of the golden file; {} vs {} lines", i + 1, e.len(), a.len());
    Some(match (golden, export) {
        (Some(g), Some(x)) if g.path == x.path && g.kind == x.kind => {
            format!("JSON differs at {} ({where_}):\n  golden: {}\n  export: {}", pointer(&g.path), g.value(), x.value())
        }
        _ => {
            let show = |l: Option<&Line>| l.map_or_else(|| "(end of document)".to_owned(), Line::describe);
            let common: Vec<String> = match (golden, export) {
                (Some(g), Some(x)) => g.path.iter().zip(&x.path).take_while(|(a, b)| a == b).map(|(a, _)| a.clone()).collect(),
                _ => Vec::new(),
            };
            format!("JSON differs inside {} ({where_}):\n  golden: {}\n  export: {}", pointer(&common), show(golden), show(export))
        }
    })
}

/// The first differing decompressed line of two gzip files, or, when their text is the same,
/// that the compression differs (the chunking into gzip members is part of the format).
fn gzip_difference(expected: &[u8], actual: &[u8]) -> Option<String> {
    let inflate = |bytes: &[u8], what: &str| {
        let mut text = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes).read_to_end(&mut text).map(|_| text).map_err(|e| format!("the {what} is not gzip: {e}"))
    };
    let (golden, export) = match (inflate(expected, "golden file"), inflate(actual, "export")) {
        (Ok(g), Ok(x)) => (g, x),
        (Err(e), _) | (_, Err(e)) => return Some(e),
    };
    if let Some(difference) = line_difference(&golden, &export) {
        return Some(format!("decompressed {difference}"));
    }
    (expected != actual).then(|| {
        format!(
            "the decompressed text is the same, the compressed bytes are not ({} vs {} bytes): \
             the gzip members or their compression changed",
            expected.len(),
            actual.len()
        )
    })
}

/// The first differing line of two texts, with its number and both lines.
fn line_difference(expected: &[u8], actual: &[u8]) -> Option<String> {
    let (e, a): (Vec<&[u8]>, Vec<&[u8]>) = (expected.split(|&b| b == b'\n').collect(), actual.split(|&b| b == b'\n').collect());
    let i = (0..e.len().max(a.len())).find(|&i| e.get(i) != a.get(i))?;
    let show = |l: Option<&&[u8]>| l.map_or_else(|| "(end of file)".to_owned(), |l| String::from_utf8_lossy(l).into_owned());
    Some(format!(
        "text differs at line {} ({} vs {} lines):\n  golden: {}\n  export: {}",
        i + 1,
        expected.iter().filter(|&&b| b == b'\n').count(),
        actual.iter().filter(|&&b| b == b'\n').count(),
        show(e.get(i)),
        show(a.get(i))
    ))
}

/// One line of a pretty-printed JSON document, with the path of the value it starts or closes.
struct Line {
    text: String,
    path: Vec<String>,
    kind: LineKind,
    /// Where the value starts in `text`, after the indent and any `"key": `.
    value_at: usize,
}

#[derive(PartialEq)]
enum LineKind {
    /// A scalar, an empty container, or the opening bracket of a container.
    Value,
    /// The closing bracket of a container.
    Close,
}

impl Line {
    /// The value this line holds, as written (a container shows only its opening bracket).
    fn value(&self) -> String {
        let v = self.text[self.value_at..].trim_end_matches(',');
        match (&self.kind, v) {
            (LineKind::Close, _) => format!("the end of {}", pointer(&self.path)),
            (LineKind::Value, "{") => "an object".to_owned(),
            (LineKind::Value, "[") => "an array".to_owned(),
            (LineKind::Value, v) => v.to_owned(),
        }
    }

    /// The value with its pointer, for lines at different places in the two documents.
    fn describe(&self) -> String {
        match self.kind {
            LineKind::Close => self.value(),
            LineKind::Value => format!("{} = {}", pointer(&self.path), self.value()),
        }
    }
}

struct Pretty {
    lines: Vec<Line>,
}

impl Pretty {
    /// The document as a file: its lines, each ended by a newline.
    fn text(&self) -> Vec<u8> {
        self.lines.iter().flat_map(|l| l.text.bytes().chain([b'\n'])).collect()
    }
}

/// RFC 6901 JSON pointer of a path.
fn pointer(path: &[String]) -> String {
    if path.is_empty() {
        return "the document root".to_owned();
    }
    path.iter().map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1"))).collect()
}

/// Re-lays out a JSON document as `serde_json::to_string_pretty` does (two-space indent, one
/// member or element per line, `"key": value`, empty containers as `{}` and `[]`) without
/// parsing its values: every string and number keeps its exact spelling and every object its
/// key order, so two documents have the same lines exactly when they have the same tokens.
fn pretty_json(src: &[u8]) -> Result<Pretty, String> {
    let mut p = Parser { src, pos: 0, lines: Vec::new(), path: Vec::new() };
    p.value(0, String::new())?;
    p.skip_space();
    if p.pos != src.len() {
        return Err(format!("unexpected {:?} after the document at byte {}", p.peek() as char, p.pos));
    }
    Ok(Pretty { lines: p.lines })
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    lines: Vec<Line>,
    path: Vec<String>,
}

impl Parser<'_> {
    fn peek(&self) -> u8 {
        self.src.get(self.pos).copied().unwrap_or(0)
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), String> {
        self.skip_space();
        if self.peek() != byte {
            return Err(format!("expected {:?} at byte {}, found {:?}", byte as char, self.pos, self.peek() as char));
        }
        self.pos += 1;
        Ok(())
    }

    fn line(&mut self, indent: usize, prefix: &str, value: &str, kind: LineKind) {
        let text = format!("{:width$}{prefix}{value}", "", width = 2 * indent);
        self.lines.push(Line { value_at: text.len() - value.len(), text, path: self.path.clone(), kind });
    }

    /// A string token as written, quotes and escapes included.
    fn string(&mut self) -> Result<&str, String> {
        self.skip_space();
        let start = self.pos;
        self.expect(b'"')?;
        loop {
            match self.peek() {
                0 if self.pos >= self.src.len() => return Err(format!("unterminated string from byte {start}")),
                b'\\' => self.pos += 2,
                b'"' => break,
                _ => self.pos += 1,
            }
        }
        self.pos += 1;
        std::str::from_utf8(&self.src[start..self.pos]).map_err(|e| format!("string at byte {start}: {e}"))
    }

    /// The value at `pos`, starting a line at `indent` with `prefix` (`"key": ` in an object).
    fn value(&mut self, indent: usize, prefix: String) -> Result<(), String> {
        self.skip_space();
        let open = self.peek();
        match open {
            b'{' | b'[' => {
                let close = if open == b'{' { b'}' } else { b']' };
                self.pos += 1;
                self.skip_space();
                if self.peek() == close {
                    self.pos += 1;
                    self.line(indent, &prefix, &format!("{}{}", open as char, close as char), LineKind::Value);
                    return Ok(());
                }
                self.line(indent, &prefix, &(open as char).to_string(), LineKind::Value);
                let mut index = 0usize;
                loop {
                    if open == b'{' {
                        let key = self.string()?.to_owned();
                        self.expect(b':')?;
                        let name: String = serde_json::from_str(&key).map_err(|e| format!("key {key} before byte {}: {e}", self.pos))?;
                        self.path.push(name);
                        self.value(indent + 1, format!("{key}: "))?;
                    } else {
                        self.path.push(index.to_string());
                        self.value(indent + 1, String::new())?;
                    }
                    self.path.pop();
                    index += 1;
                    self.skip_space();
                    match self.peek() {
                        b',' => {
                            self.pos += 1;
                            self.lines.last_mut().expect("a member was written").text.push(',');
                        }
                        b if b == close => {
                            self.pos += 1;
                            break;
                        }
                        b => return Err(format!("expected ',' or {:?} at byte {}, found {:?}", close as char, self.pos, b as char)),
                    }
                }
                self.line(indent, "", &(close as char).to_string(), LineKind::Close);
            }
            b'"' => {
                let s = self.string()?.to_owned();
                self.line(indent, &prefix, &s, LineKind::Value);
            }
            _ => {
                let start = self.pos;
                while !matches!(self.peek(), b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r' | 0) {
                    self.pos += 1;
                }
                if start == self.pos {
                    return Err(format!("expected a value at byte {start}"));
                }
                let token = String::from_utf8_lossy(&self.src[start..self.pos]).into_owned();
                self.line(indent, &prefix, &token, LineKind::Value);
            }
        }
        Ok(())
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
