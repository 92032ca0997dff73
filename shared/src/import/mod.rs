//! Importers: bytes in, [`Trace`] out. The format is detected from the content.
//!
//! Supported: Memory Tracer's own format ([`native`]), PyTorch memory snapshot pickles
//! ([`snapshot`]), torch.profiler Chrome traces ([`chrome`]) and DFTracer `.pfw` ([`dftracer`]),
//! each optionally gzip-compressed. Decompression is bounded by
//! [`ImportOptions::max_decompressed_bytes`]. Every format streams into its importer from the
//! decompressor or from [`import_reader`]'s reader, so that neither a file nor its
//! decompressed bytes are ever held whole: a gzip bomb costs what the importer keeps, not what
//! it decompresses to.

pub mod chrome;
pub mod dftracer;
pub mod native;
pub mod pickle;
pub mod snapshot;

use crate::model::{SourceFormat, Trace};
use std::io::{BufReader, Read};

/// What went wrong while importing, and where.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("the input is empty; expected a trace (PyTorch memory snapshot pickle, torch.profiler Chrome trace JSON, DFTracer .pfw or Memory Tracer trace)")]
    Empty,
    #[error("unrecognised input: expected a PyTorch memory snapshot pickle, a torch.profiler Chrome trace (JSON with \"traceEvents\"), DFTracer .pfw JSON lines or a Memory Tracer trace; found {found}")]
    UnknownFormat { found: String },
    #[error("corrupt pickle at byte {offset}: {reason}")]
    Pickle { offset: usize, reason: String },
    #[error("not a PyTorch memory snapshot: expected a dict with keys 'segments' and 'device_traces' (torch.cuda.memory._dump_snapshot), found {found}")]
    NotASnapshot { found: String },
    #[error("invalid memory snapshot at {path}: {reason}")]
    Snapshot { path: String, reason: String },
    #[error("invalid JSON at line {line}, column {column}: {reason}")]
    Json { line: usize, column: usize, reason: String },
    #[error("invalid Chrome trace at {path}: {reason}")]
    Chrome { path: String, reason: String },
    #[error("invalid DFTracer trace at line {line}: {reason}")]
    Dftracer { line: usize, reason: String },
    #[error("invalid Memory Tracer trace at {path}: {reason}")]
    Native { path: String, reason: String },
    #[error("Memory Tracer trace version {found} is not supported: this build reads version {supported} (a newer Memory Tracer wrote it)")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("corrupt gzip stream after {decompressed_bytes} decompressed bytes: {reason}")]
    Gzip { decompressed_bytes: u64, reason: String },
    #[error("reading the input failed: {reason}")]
    Read { reason: String },
    #[error(
        "input decompresses to more than {limit_bytes} bytes, the limit (raise it with max_decompressed_bytes if the file is genuine)"
    )]
    TooLarge { limit_bytes: u64 },
}

impl ImportError {
    pub(crate) fn json(e: &serde_json::Error) -> Self {
        let reason = e.to_string();
        // serde_json appends " at line L column C"; keep the message short.
        let reason = match reason.rfind(" at line ") {
            Some(i) => reason[..i].to_owned(),
            None => reason,
        };
        ImportError::Json { line: e.line(), column: e.column(), reason }
    }
}

/// Knobs of [`import`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ImportOptions {
    /// Largest decompressed size accepted from gzip input, in bytes. Default is 4 GiB.
    pub max_decompressed_bytes: u64,
}

impl Default for ImportOptions {
    fn default() -> Self {
        Self { max_decompressed_bytes: 4 << 30 }
    }
}

/// Formats [`detect`] recognises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    MemoryTracer,
    PytorchSnapshot,
    ChromeTrace,
    Dftracer,
}

impl From<Format> for SourceFormat {
    fn from(f: Format) -> Self {
        match f {
            Format::MemoryTracer => SourceFormat::MemoryTracer,
            Format::PytorchSnapshot => SourceFormat::PytorchSnapshot,
            Format::ChromeTrace => SourceFormat::ChromeTrace,
            Format::Dftracer => SourceFormat::Dftracer,
        }
    }
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// True if `data` starts like a gzip stream.
pub fn is_gzip(data: &[u8]) -> bool {
    data.starts_with(&GZIP_MAGIC)
}

/// Decompresses gzip input, refusing to produce more than `limit_bytes`.
pub fn gunzip_bounded(data: &[u8], limit_bytes: u64) -> Result<Vec<u8>, ImportError> {
    let mut out = Vec::new();
    let mut dec = flate2::read::MultiGzDecoder::new(data).take(limit_bytes.saturating_add(1));
    dec.read_to_end(&mut out).map_err(|e| ImportError::Gzip { decompressed_bytes: out.len() as u64, reason: e.to_string() })?;
    if out.len() as u64 > limit_bytes {
        return Err(ImportError::TooLarge { limit_bytes });
    }
    Ok(out)
}

fn skip_ws(data: &[u8]) -> &[u8] {
    let data = data.strip_prefix(b"\xef\xbb\xbf").unwrap_or(data);
    let n = data.iter().take_while(|b| b.is_ascii_whitespace()).count();
    &data[n..]
}

fn describe(data: &[u8]) -> String {
    let head: String =
        data.iter().take(16).map(|&b| if (0x20..0x7f).contains(&b) { (b as char).to_string() } else { format!("\\x{b:02x}") }).collect();
    format!("{} bytes starting with \"{head}\"", data.len())
}

/// Finds `needle` in `hay`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Which format `data` (already decompressed) is in.
pub fn detect(data: &[u8]) -> Result<Format, ImportError> {
    let body = skip_ws(data);
    let Some(&first) = body.first() else {
        return Err(ImportError::Empty);
    };
    match first {
        0x80 => Ok(Format::PytorchSnapshot),
        b'{' => {
            let head = &body[..body.len().min(256)];
            if contains(head, b"\"format\":\"memory-tracer\"") || contains(head, b"\"format\": \"memory-tracer\"") {
                Ok(Format::MemoryTracer)
            } else if dftracer::looks_like_jsonl(body) {
                Ok(Format::Dftracer)
            } else if contains(body, b"\"traceEvents\"") {
                Ok(Format::ChromeTrace)
            } else {
                Err(ImportError::UnknownFormat {
                    found: "a JSON object without \"traceEvents\" or a Memory Tracer \"format\" field".into(),
                })
            }
        }
        b'[' => {
            if dftracer::looks_like_jsonl(&body[1..]) {
                Ok(Format::Dftracer)
            } else {
                Ok(Format::ChromeTrace)
            }
        }
        _ => Err(ImportError::UnknownFormat { found: describe(data) }),
    }
}

/// Bytes read before the format is chosen: detection sees at least this much. Shorter inputs
/// are imported from memory.
const HEAD_BYTES: usize = 1 << 20;

/// A gzip decoder that refuses to produce more than `limit_bytes` and remembers why it
/// stopped, so that an importer's read error can be reported as what it was.
struct BoundedGunzip<R: Read> {
    inner: flate2::read::MultiGzDecoder<R>,
    read_bytes: u64,
    limit_bytes: u64,
    failure: Option<ImportError>,
}

impl<R: Read> Read for BoundedGunzip<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.failure.is_some() {
            return Err(std::io::Error::other("the gzip stream already failed"));
        }
        let room = self.limit_bytes.saturating_add(1).saturating_sub(self.read_bytes);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        match self.inner.read(&mut buf[..want]) {
            Ok(n) => {
                self.read_bytes += n as u64;
                if self.read_bytes > self.limit_bytes {
                    self.failure = Some(ImportError::TooLarge { limit_bytes: self.limit_bytes });
                    return Err(std::io::Error::other("decompressed size limit reached"));
                }
                Ok(n)
            }
            Err(e) => {
                self.failure = Some(ImportError::Gzip { decompressed_bytes: self.read_bytes, reason: e.to_string() });
                Err(e)
            }
        }
    }
}

/// Imports a trace of any supported format, gzip-compressed or not.
pub fn import(data: &[u8], options: &ImportOptions) -> Result<Trace, ImportError> {
    if is_gzip(data) {
        return import_gzip(data, options.max_decompressed_bytes);
    }
    import_plain(data)
}

/// Imports a trace of any supported format, gzip-compressed or not, read from `reader`: the
/// input is never held whole (see [`import_streamed`]).
pub fn import_reader(mut reader: impl Read, options: &ImportOptions) -> Result<Trace, ImportError> {
    let mut magic = Vec::with_capacity(2);
    (&mut reader).take(2).read_to_end(&mut magic).map_err(|e| ImportError::Read { reason: e.to_string() })?;
    let reader = magic.as_slice().chain(reader);
    if is_gzip(&magic) {
        return import_gzip(reader, options.max_decompressed_bytes);
    }
    let (head, more) = read_head(reader)?;
    match more {
        Some(rest) => import_streamed(&head, rest),
        None => import_plain(&head),
    }
}

/// Reads the first [`HEAD_BYTES`] of `reader` that are not all whitespace (leading whitespace
/// says nothing about the format): the head, and the rest of the input if there is more.
fn read_head<R: Read>(mut reader: R) -> Result<(Vec<u8>, Option<R>), ImportError> {
    let mut head = Vec::new();
    loop {
        head.clear();
        (&mut reader).take(HEAD_BYTES as u64 + 1).read_to_end(&mut head).map_err(|e| ImportError::Read { reason: e.to_string() })?;
        if head.len() <= HEAD_BYTES {
            return Ok((head, None));
        }
        if !skip_ws(&head).is_empty() {
            return Ok((head, Some(reader)));
        }
    }
}

/// Gzip input, decompressed as it is imported and bounded by `limit_bytes`.
fn import_gzip(compressed: impl Read, limit_bytes: u64) -> Result<Trace, ImportError> {
    let mut gz = BoundedGunzip { inner: flate2::read::MultiGzDecoder::new(compressed), read_bytes: 0, limit_bytes, failure: None };
    let result = read_head(&mut gz).and_then(|(head, more)| match more {
        Some(rest) => import_streamed(&head, rest),
        None => import_plain(&head),
    });
    // A failure of the stream outranks the parse error it caused.
    match gz.failure.take() {
        Some(e) => Err(e),
        None => result,
    }
}

/// A long input: `head` decides the format, then `head` and `rest` stream into its importer.
fn import_streamed(head: &[u8], rest: impl Read) -> Result<Trace, ImportError> {
    let input = head.chain(rest);
    match detect(head) {
        // `"traceEvents"` may lie past the head; the Chrome importer says if it is missing.
        Ok(Format::ChromeTrace) => chrome::import_reader(input),
        Err(ImportError::UnknownFormat { .. }) if skip_ws(head).first() == Some(&b'{') => chrome::import_reader(input),
        Ok(Format::Dftracer) => dftracer::import_reader(BufReader::with_capacity(64 << 10, input)),
        Ok(Format::PytorchSnapshot) => snapshot::import_reader(input),
        Ok(Format::MemoryTracer) => native::import_reader(BufReader::with_capacity(64 << 10, input)),
        Err(e) => Err(e),
    }
}

fn import_plain(data: &[u8]) -> Result<Trace, ImportError> {
    match detect(data)? {
        Format::MemoryTracer => native::import(data),
        Format::PytorchSnapshot => snapshot::import(data),
        Format::ChromeTrace => chrome::import(data),
        Format::Dftracer => dftracer::import(data),
    }
}
