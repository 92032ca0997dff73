//! `PYTORCH_CUDA_ALLOC_CONF` read the way PyTorch 2.6 to 2.15 read it: every key those
//! releases accept, their validation rules and messages, and the settings dict that memory
//! snapshots carry.

use std::collections::BTreeMap;
use std::fmt;

/// One MiB, the unit of every `_mb` key.
pub const MIB: u64 = 1 << 20;
/// `kLargeBuffer`: the default `large_segment_size_mb` and `max_non_split_rounding_mb`.
pub const DEFAULT_LARGE_SEGMENT_BYTES: u64 = 20 * MIB;
/// `roundup_power2_divisions` has one entry per power-of-two interval from 1 MiB to 64 GiB.
pub const DIVISION_INTERVALS: usize = 16;

/// A PyTorch 2.x release, which decides the keys and rules a configuration is read with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TorchRelease {
    /// The `x` of `2.x`.
    pub minor: u32,
}

impl TorchRelease {
    /// The oldest release modelled.
    pub const OLDEST: TorchRelease = TorchRelease { minor: 6 };
    /// The newest release modelled; [`AllocConf::parse`] reads with its rules.
    pub const NEWEST: TorchRelease = TorchRelease { minor: 15 };

    /// The release of a version string such as `2.11.0+cu130`; `None` unless it is a 2.x.
    pub fn parse(version: &str) -> Option<TorchRelease> {
        let mut parts = version.trim().split(['.', '+']);
        if parts.next()? != "2" {
            return None;
        }
        let minor: String = parts.next()?.chars().take_while(char::is_ascii_digit).collect();
        minor.parse().ok().map(|minor| TorchRelease { minor })
    }

    const fn new(minor: u32) -> TorchRelease {
        TorchRelease { minor }
    }
}

impl fmt::Display for TorchRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "2.{}", self.minor)
    }
}

/// Which CUDA allocator serves the device (`backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The caching allocator this module models.
    Native,
    /// `cudaMallocAsync`: the driver's stream-ordered pools, not modelled.
    CudaMallocAsync,
}

/// The reserve of address space each expandable segment takes (`expandable_segments_reserve`,
/// PyTorch 2.15): a fraction of the device's memory, or a number of GiB.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReserveSpec {
    Fraction(f64),
    Gib(f64),
}

impl ReserveSpec {
    /// The reserve in bytes on a device of `device_bytes`, capped at PyTorch's 9/8 of it.
    pub fn bytes(self, device_bytes: u64) -> u64 {
        let full = device_bytes.saturating_add(device_bytes / 8);
        let want = match self {
            ReserveSpec::Fraction(f) => f * device_bytes as f64,
            ReserveSpec::Gib(g) => g * (1u64 << 30) as f64,
        };
        if want >= u64::MAX as f64 {
            full
        } else {
            (want as u64).min(full)
        }
    }
}

impl fmt::Display for ReserveSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReserveSpec::Fraction(x) => write!(f, "{x}"),
            ReserveSpec::Gib(g) => write!(f, "{g}G"),
        }
    }
}

/// An allocator configuration: the keys a `PYTORCH_CUDA_ALLOC_CONF` string (or a snapshot's
/// settings) set. A key left `None` has PyTorch's default; the accessors give effective values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllocConf {
    /// `backend`. Default native.
    pub backend: Option<Backend>,
    /// `max_split_size_mb`, in bytes: blocks this large are never split. Default no limit.
    pub max_split_size_bytes: Option<u64>,
    /// `max_non_split_rounding_mb`, in bytes: how much larger than an oversize request a cached
    /// oversize block may be and still serve it. Default `large_segment_size_mb`.
    pub max_non_split_rounding_bytes: Option<u64>,
    /// `roundup_power2_divisions`, per power-of-two interval from 1 MiB (index 0 also covers
    /// smaller sizes) to 32 GiB and up. Default all 0 (round to 512 bytes only).
    pub roundup_power2_divisions: Option<[u64; DIVISION_INTERVALS]>,
    /// `garbage_collection_threshold` in (0, 1); acts only under a memory fraction. Default off.
    pub garbage_collection_threshold: Option<f64>,
    /// `expandable_segments`. Default false.
    pub expandable_segments: Option<bool>,
    /// `large_segment_size_mb` (2.11+), in bytes: the segment requests of 1 to 10 MiB get, and
    /// the page of large expandable segments. Default 20 MiB.
    pub large_segment_size_bytes: Option<u64>,
    /// `per_process_memory_fraction` (2.10+) in [0, 1]. Default none (1).
    pub per_process_memory_fraction: Option<f64>,
    /// `throw_on_cudamalloc_oom` (2.12+): refuse, without the release-and-retry sequence, an
    /// allocation that would pass the memory fraction. Default false.
    pub throw_on_cudamalloc_oom: Option<bool>,
    /// `expandable_segments_reserve` (2.15). Default 9/8 of the device's memory.
    pub expandable_segments_reserve: Option<ReserveSpec>,
    /// Keys accepted that do not change where blocks go, with their values as given.
    pub unmodelled: BTreeMap<String, String>,
}

/// Why a configuration could not be read or used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfError {
    #[error("allocator configuration: unknown key '{key}' (PyTorch {release} accepts {accepted})")]
    UnknownKey { key: String, release: TorchRelease, accepted: String },
    #[error("allocator configuration: key '{key}' needs PyTorch {since} or newer (read as PyTorch {release})")]
    NotInRelease { key: String, since: TorchRelease, release: TorchRelease },
    #[error("allocator configuration: key '{key}' has value '{value}': expected {expected}")]
    BadValue { key: String, value: String, expected: String },
    #[error("allocator configuration: expected {expected} but found {found} at byte {at}")]
    Syntax { expected: String, found: String, at: usize },
    #[error("allocator settings: '{key}' is {found}: expected {expected}")]
    BadSetting { key: String, found: String, expected: String },
    #[error("allocator configuration: backend:cudaMallocAsync is not modelled (only the native caching allocator is)")]
    UnsupportedBackend,
}

/// How a key's value is read.
#[derive(Clone, Copy)]
enum Kind {
    Backend,
    Bool,
    MaxSplit,
    NonSplitRounding,
    LargeSegment,
    GcThreshold,
    Divisions,
    Fraction,
    Threads,
    PositiveMib,
    Mib,
    Reserve,
    ReserveByClass,
}

/// Every key PyTorch 2.6 to 2.15 accept, with the release that added it.
const KEYS: [(&str, u32, Kind); 22] = [
    ("backend", 6, Kind::Backend),
    ("expandable_segments", 6, Kind::Bool),
    ("max_split_size_mb", 6, Kind::MaxSplit),
    ("max_non_split_rounding_mb", 6, Kind::NonSplitRounding),
    ("large_segment_size_mb", 11, Kind::LargeSegment),
    ("roundup_power2_divisions", 6, Kind::Divisions),
    ("garbage_collection_threshold", 6, Kind::GcThreshold),
    ("per_process_memory_fraction", 10, Kind::Fraction),
    ("throw_on_cudamalloc_oom", 12, Kind::Bool),
    ("expandable_segments_reserve", 15, Kind::Reserve),
    ("expandable_segments_reserve_by_class", 15, Kind::ReserveByClass),
    ("release_lock_on_cudamalloc", 6, Kind::Bool),
    ("release_lock_on_hipmalloc", 6, Kind::Bool),
    ("pinned_use_cuda_host_register", 6, Kind::Bool),
    ("pinned_use_hip_host_register", 6, Kind::Bool),
    ("pinned_num_register_threads", 6, Kind::Threads),
    ("pinned_use_background_threads", 6, Kind::Bool),
    ("graph_capture_record_stream_reuse", 9, Kind::Bool),
    ("pinned_reserve_segment_size_mb", 10, Kind::PositiveMib),
    ("pinned_free_catch_all", 12, Kind::Bool),
    ("pinned_max_round_threshold_mb", 13, Kind::Mib),
    ("pinned_max_cached_size_mb", 13, Kind::Mib),
];

/// A token of a configuration string and the byte it starts at.
struct Tok {
    text: String,
    at: usize,
}

/// PyTorch's `ConfigTokenizer`: `,` `:` `[` `]` are tokens of their own, whitespace is dropped
/// (also inside a word), everything else forms words.
fn tokenize(s: &str) -> Vec<Tok> {
    let mut toks = Vec::new();
    let mut word = String::new();
    let mut start = 0;
    for (at, ch) in s.char_indices() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            if !word.is_empty() {
                toks.push(Tok { text: std::mem::take(&mut word), at: start });
            }
            toks.push(Tok { text: ch.to_string(), at });
        } else if !ch.is_whitespace() {
            if word.is_empty() {
                start = at;
            }
            word.push(ch);
        }
    }
    if !word.is_empty() {
        toks.push(Tok { text: word, at: start });
    }
    toks
}

/// A walk over the tokens of one configuration string.
struct Parser<'a> {
    toks: &'a [Tok],
    i: usize,
    end: usize,
    release: TorchRelease,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i)
    }

    fn syntax(&self, expected: &str) -> ConfError {
        match self.peek() {
            Some(t) => ConfError::Syntax { expected: expected.to_owned(), found: format!("'{}'", t.text), at: t.at },
            None => ConfError::Syntax { expected: expected.to_owned(), found: "the end".to_owned(), at: self.end },
        }
    }

    fn expect(&mut self, sep: &str, expected: &str) -> Result<(), ConfError> {
        match self.peek() {
            Some(t) if t.text == sep => {
                self.i += 1;
                Ok(())
            }
            _ => Err(self.syntax(expected)),
        }
    }

    /// A single value word (not a separator).
    fn word(&mut self, key: &str) -> Result<String, ConfError> {
        match self.peek() {
            Some(t) if !matches!(t.text.as_str(), "," | ":" | "[" | "]") => {
                let text = t.text.clone();
                self.i += 1;
                Ok(text)
            }
            _ => Err(self.syntax(&format!("a value for '{key}'"))),
        }
    }

    /// The `(left, right)` pairs of a `[left:right,...]` list; the `[` is next.
    fn list(&mut self, key: &str) -> Result<Vec<(String, String)>, ConfError> {
        self.expect("[", "'['")?;
        let mut items = Vec::new();
        loop {
            if self.peek().is_some_and(|t| t.text == "]") {
                self.i += 1;
                return Ok(items);
            }
            let left = self.word(key)?;
            self.expect(":", &format!("':' after '{left}' in the list of '{key}'"))?;
            let right = self.word(key)?;
            items.push((left, right));
            if self.peek().is_some_and(|t| t.text == ",") {
                self.i += 1;
            } else if self.peek().is_none_or(|t| t.text != "]") {
                return Err(self.syntax(&format!("',' or ']' in the list of '{key}'")));
            }
        }
    }
}

fn bad(key: &str, value: &str, expected: impl Into<String>) -> ConfError {
    ConfError::BadValue { key: key.to_owned(), value: value.to_owned(), expected: expected.into() }
}

fn parse_bool(key: &str, value: &str) -> Result<bool, ConfError> {
    match value {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(bad(key, value, "True or False (with that capital letter)")),
    }
}

fn parse_uint(key: &str, value: &str, expected: &str) -> Result<u64, ConfError> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(key, value, expected));
    }
    // A number past u64 is still "a lot": PyTorch caps MiB values at SIZE_MAX / 1 MiB.
    Ok(value.parse::<u64>().unwrap_or(u64::MAX))
}

fn parse_float(key: &str, value: &str, expected: &str) -> Result<f64, ConfError> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(bad(key, value, expected)),
    }
}

/// MiB to bytes, capped as PyTorch caps it (`SIZE_MAX / 1 MiB` MiB).
fn mib_bytes(mb: u64) -> u64 {
    mb.min(u64::MAX / MIB) * MIB
}

fn parse_reserve(key: &str, value: &str) -> Result<ReserveSpec, ConfError> {
    let expected = "a positive fraction of the device's memory (0.5) or a number of GiB (40G)";
    let number = |text: &str| text.parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0);
    let spec = match value.strip_suffix(['G', 'g']) {
        Some(g) => number(g).map(ReserveSpec::Gib),
        None => number(value).map(ReserveSpec::Fraction),
    };
    spec.ok_or_else(|| bad(key, value, expected))
}

impl AllocConf {
    /// Reads a `PYTORCH_CUDA_ALLOC_CONF` string with the newest release's rules.
    pub fn parse(s: &str) -> Result<AllocConf, ConfError> {
        AllocConf::parse_for(s, TorchRelease::NEWEST)
    }

    /// Reads a `PYTORCH_CUDA_ALLOC_CONF` string as `release` reads it: the keys it knows, its
    /// bounds, and its reading of `roundup_power2_divisions` lists. A key given twice keeps
    /// its last value, as in PyTorch.
    pub fn parse_for(s: &str, release: TorchRelease) -> Result<AllocConf, ConfError> {
        let toks = tokenize(s);
        let mut p = Parser { toks: &toks, i: 0, end: s.len(), release };
        let mut conf = AllocConf::default();
        // PyTorch 2.11+ reads large_segment_size_mb first: the other sizes' lower bound is it.
        if release.minor >= 11 {
            conf.large_segment_size_bytes = prescan_large_segment(&toks)?;
        }
        while p.peek().is_some() {
            let key = p.word("a key").map_err(|_| p.syntax("a key"))?;
            let kind = lookup(&key, release)?;
            p.expect(":", &format!("':' after '{key}'"))?;
            conf.read_value(&mut p, &key, kind)?;
            if p.peek().is_some() {
                p.expect(",", "',' between settings")?;
            }
        }
        Ok(conf)
    }

    fn read_value(&mut self, p: &mut Parser<'_>, key: &str, kind: Kind) -> Result<(), ConfError> {
        if matches!(kind, Kind::Divisions) {
            let divisions = read_divisions(p, key)?;
            self.roundup_power2_divisions = Some(divisions);
            return Ok(());
        }
        if matches!(kind, Kind::ReserveByClass) {
            let items = p.list(key)?;
            for (class, spec) in &items {
                parse_reserve(key, spec).map_err(|_| bad(key, &format!("{class}:{spec}"), "class:reserve pairs"))?;
            }
            let text = items.iter().map(|(c, s)| format!("{c}:{s}")).collect::<Vec<_>>().join(",");
            self.unmodelled.insert(key.to_owned(), format!("[{text}]"));
            return Ok(());
        }
        let value = p.word(key)?;
        self.read_scalar(key, kind, &value, p.release)
    }

    fn read_scalar(&mut self, key: &str, kind: Kind, value: &str, release: TorchRelease) -> Result<(), ConfError> {
        match kind {
            Kind::Backend => {
                self.backend = Some(match value {
                    "native" => Backend::Native,
                    "cudaMallocAsync" => Backend::CudaMallocAsync,
                    _ => return Err(bad(key, value, "native or cudaMallocAsync")),
                })
            }
            Kind::Bool => {
                let b = parse_bool(key, value)?;
                match key {
                    "expandable_segments" => self.expandable_segments = Some(b),
                    "throw_on_cudamalloc_oom" => self.throw_on_cudamalloc_oom = Some(b),
                    _ => {
                        self.unmodelled.insert(key.to_owned(), value.to_owned());
                    }
                }
            }
            Kind::MaxSplit | Kind::NonSplitRounding => {
                let (min_mb, rule) = self.split_bound(release);
                let expected = format!("a whole number of MiB {rule}");
                let mb = parse_uint(key, value, &expected)?;
                if mb < min_mb {
                    return Err(bad(key, value, expected));
                }
                let slot =
                    if matches!(kind, Kind::MaxSplit) { &mut self.max_split_size_bytes } else { &mut self.max_non_split_rounding_bytes };
                *slot = Some(mib_bytes(mb));
            }
            Kind::LargeSegment => {
                // Read before the rest (see `parse_for`); checked there.
            }
            Kind::GcThreshold => {
                let expected = "a number between 0 and 1, both excluded";
                let v = parse_float(key, value, expected)?;
                if !(v > 0.0 && v < 1.0) {
                    return Err(bad(key, value, expected));
                }
                self.garbage_collection_threshold = Some(v);
            }
            Kind::Fraction => {
                let expected = "a number between 0 and 1, both included";
                let v = parse_float(key, value, expected)?;
                if !(0.0..=1.0).contains(&v) {
                    return Err(bad(key, value, expected));
                }
                self.per_process_memory_fraction = Some(v);
            }
            Kind::Threads => {
                let expected = "a power of two up to 128";
                let n = parse_uint(key, value, expected)?;
                if !n.is_power_of_two() || n > 128 {
                    return Err(bad(key, value, expected));
                }
                self.unmodelled.insert(key.to_owned(), n.to_string());
            }
            Kind::PositiveMib | Kind::Mib => {
                let positive = matches!(kind, Kind::PositiveMib);
                let expected = if positive { "a whole number of MiB above 0" } else { "a whole number of MiB" };
                let n = parse_uint(key, value, expected)?;
                if positive && n == 0 {
                    return Err(bad(key, value, expected));
                }
                self.unmodelled.insert(key.to_owned(), n.to_string());
            }
            Kind::Reserve => self.expandable_segments_reserve = Some(parse_reserve(key, value)?),
            Kind::Divisions | Kind::ReserveByClass => {}
        }
        Ok(())
    }

    /// The least `max_split_size_mb` and `max_non_split_rounding_mb` accept, and how to say it.
    fn split_bound(&self, release: TorchRelease) -> (u64, String) {
        let large_mb = self.large_segment_bytes() / MIB;
        if release.minor <= 8 {
            // PyTorch 2.6-2.8: "too small, must be > 20", and 20 itself is refused.
            (large_mb + 1, format!("above {large_mb}"))
        } else {
            (large_mb, format!("of at least {large_mb}"))
        }
    }

    /// Reads the settings dict of a memory snapshot (`allocator_settings`): its
    /// `PYTORCH_CUDA_ALLOC_CONF` string (PyTorch's last settings string), overridden by the
    /// effective values the dict lists beside it (`max_split_size`, `expandable_segments`,
    /// `garbage_collection_threshold`, `roundup_power2_divisions`, ...).
    pub fn from_settings(v: &serde_json::Value) -> Result<AllocConf, ConfError> {
        let Some(map) = v.as_object() else {
            return Err(ConfError::BadSetting { key: "allocator_settings".into(), found: kind_of(v), expected: "an object".into() });
        };
        let mut conf = match map.get("PYTORCH_CUDA_ALLOC_CONF") {
            Some(serde_json::Value::String(s)) => AllocConf::parse(s)?,
            Some(serde_json::Value::Null) | None => AllocConf::default(),
            Some(other) => {
                return Err(ConfError::BadSetting {
                    key: "PYTORCH_CUDA_ALLOC_CONF".into(),
                    found: kind_of(other),
                    expected: "a string".into(),
                })
            }
        };
        conf.apply_settings(map)?;
        Ok(conf)
    }

    fn apply_settings(&mut self, map: &serde_json::Map<String, serde_json::Value>) -> Result<(), ConfError> {
        use serde_json::Value as J;
        let setting_err = |key: &str, found: &J, expected: &str| ConfError::BadSetting {
            key: key.to_owned(),
            found: format!("{} ({found})", kind_of(found)),
            expected: expected.to_owned(),
        };
        if let Some(v) = map.get("max_split_size") {
            // size_t in PyTorch: -1 (SIZE_MAX written as a signed number), 0 or anything past
            // i64 means no limit.
            let limit = match (v.as_i64(), v.as_u64()) {
                (Some(n), _) => u64::try_from(n).ok().filter(|&n| n > 0),
                (None, Some(_)) => None,
                (None, None) => return Err(setting_err("max_split_size", v, "a whole number of bytes")),
            };
            if limit != self.max_split_size_bytes {
                self.max_split_size_bytes = limit;
            }
        }
        if let Some(v) = map.get("expandable_segments") {
            let b = v.as_bool().ok_or_else(|| setting_err("expandable_segments", v, "true or false"))?;
            if b != self.expandable() {
                self.expandable_segments = Some(b);
            }
        }
        if let Some(v) = map.get("garbage_collection_threshold") {
            let t = v.as_f64().ok_or_else(|| setting_err("garbage_collection_threshold", v, "a number"))?;
            if t != self.gc_threshold() {
                self.garbage_collection_threshold = (t > 0.0 && t < 1.0).then_some(t);
            }
        }
        if let Some(v) = map.get("roundup_power2_divisions") {
            let d = settings_divisions(v)
                .ok_or_else(|| setting_err("roundup_power2_divisions", v, "an object of MiB interval to divisions"))?;
            if d != self.divisions() {
                self.roundup_power2_divisions = Some(d);
            }
        }
        for (key, name) in [
            ("release_lock_on_cudamalloc", "release_lock_on_cudamalloc"),
            ("pinned_use_cuda_host_register", "pinned_use_cuda_host_register"),
            ("graph_capture_record_stream_reuse", "graph_capture_record_stream_reuse"),
        ] {
            if let Some(J::Bool(true)) = map.get(key) {
                self.unmodelled.entry(name.to_owned()).or_insert_with(|| "True".to_owned());
            }
        }
        if let Some(n) = map.get("pinned_num_register_threads").and_then(J::as_u64).filter(|&n| n > 1) {
            self.unmodelled.entry("pinned_num_register_threads".to_owned()).or_insert_with(|| n.to_string());
        }
        Ok(())
    }

    /// This configuration with every key `other` sets taken from `other`: the what-if of a
    /// trace is its own settings overridden by the user's string.
    pub fn overridden_by(&self, other: &AllocConf) -> AllocConf {
        let mut unmodelled = self.unmodelled.clone();
        unmodelled.extend(other.unmodelled.iter().map(|(k, v)| (k.clone(), v.clone())));
        AllocConf {
            backend: other.backend.or(self.backend),
            max_split_size_bytes: other.max_split_size_bytes.or(self.max_split_size_bytes),
            max_non_split_rounding_bytes: other.max_non_split_rounding_bytes.or(self.max_non_split_rounding_bytes),
            roundup_power2_divisions: other.roundup_power2_divisions.or(self.roundup_power2_divisions),
            garbage_collection_threshold: other.garbage_collection_threshold.or(self.garbage_collection_threshold),
            expandable_segments: other.expandable_segments.or(self.expandable_segments),
            large_segment_size_bytes: other.large_segment_size_bytes.or(self.large_segment_size_bytes),
            per_process_memory_fraction: other.per_process_memory_fraction.or(self.per_process_memory_fraction),
            throw_on_cudamalloc_oom: other.throw_on_cudamalloc_oom.or(self.throw_on_cudamalloc_oom),
            expandable_segments_reserve: other.expandable_segments_reserve.or(self.expandable_segments_reserve),
            unmodelled,
        }
    }

    /// The keys set here that do not change where blocks go (host-allocator and locking
    /// settings, per-class reserves), in key order.
    pub fn unmodelled_keys(&self) -> Vec<&str> {
        self.unmodelled.keys().map(String::as_str).collect()
    }

    /// `Err(UnsupportedBackend)` for `backend:cudaMallocAsync`, which the model cannot replay.
    pub fn check_modelled(&self) -> Result<(), ConfError> {
        match self.backend {
            Some(Backend::CudaMallocAsync) => Err(ConfError::UnsupportedBackend),
            _ => Ok(()),
        }
    }

    /// Effective `max_split_size` in bytes (`u64::MAX`: no limit).
    pub fn max_split_bytes(&self) -> u64 {
        self.max_split_size_bytes.unwrap_or(u64::MAX)
    }

    /// Effective `large_segment_size` in bytes.
    pub fn large_segment_bytes(&self) -> u64 {
        self.large_segment_size_bytes.unwrap_or(DEFAULT_LARGE_SEGMENT_BYTES)
    }

    /// Effective `max_non_split_rounding_size` in bytes.
    pub fn max_non_split_rounding(&self) -> u64 {
        self.max_non_split_rounding_bytes.unwrap_or_else(|| self.large_segment_bytes())
    }

    /// Effective `roundup_power2_divisions`.
    pub fn divisions(&self) -> [u64; DIVISION_INTERVALS] {
        self.roundup_power2_divisions.unwrap_or([0; DIVISION_INTERVALS])
    }

    /// Effective `garbage_collection_threshold` (0: off).
    pub fn gc_threshold(&self) -> f64 {
        self.garbage_collection_threshold.unwrap_or(0.0)
    }

    /// Effective `expandable_segments`.
    pub fn expandable(&self) -> bool {
        self.expandable_segments.unwrap_or(false)
    }

    /// The rounding and splitting rules as the snapshot replay's model holds them, whose
    /// `round_size` is PyTorch's.
    pub fn allocator_config(&self) -> crate::allocator::AllocatorConfig {
        crate::allocator::AllocatorConfig {
            max_split_bytes: self.max_split_size_bytes,
            roundup_power2_divisions: self.divisions().to_vec(),
            expandable_segments: self.expandable(),
            whole_segments: false,
        }
    }
}

fn kind_of(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
    .to_owned()
}

/// A snapshot's `roundup_power2_divisions`: `{"1": d, "2": d, ..., "32768": d}` (MiB interval
/// starts) or a plain list of 16.
fn settings_divisions(v: &serde_json::Value) -> Option<[u64; DIVISION_INTERVALS]> {
    let mut d = [0u64; DIVISION_INTERVALS];
    match v {
        serde_json::Value::Object(m) => {
            for (k, n) in m {
                let mb: u64 = k.parse().ok()?;
                if !mb.is_power_of_two() {
                    return None;
                }
                let i = (mb.trailing_zeros() as usize).min(DIVISION_INTERVALS - 1);
                d[i] = n.as_u64()?;
            }
        }
        serde_json::Value::Array(a) => {
            for (i, n) in a.iter().take(DIVISION_INTERVALS).enumerate() {
                d[i] = n.as_u64()?;
            }
        }
        _ => return None,
    }
    Some(d)
}

fn lookup(key: &str, release: TorchRelease) -> Result<Kind, ConfError> {
    match KEYS.iter().find(|(k, _, _)| *k == key) {
        Some(&(_, since, kind)) if since <= release.minor => Ok(kind),
        Some(&(_, since, _)) => Err(ConfError::NotInRelease { key: key.to_owned(), since: TorchRelease::new(since), release }),
        None => {
            let accepted: Vec<&str> = KEYS.iter().filter(|(_, since, _)| *since <= release.minor).map(|(k, _, _)| *k).collect();
            Err(ConfError::UnknownKey { key: key.to_owned(), release, accepted: accepted.join(", ") })
        }
    }
}

/// `large_segment_size_mb`, which PyTorch 2.11+ reads before the other keys.
fn prescan_large_segment(toks: &[Tok]) -> Result<Option<u64>, ConfError> {
    let mut found = None;
    for (i, t) in toks.iter().enumerate() {
        let is_key = i == 0 || toks[i - 1].text == ",";
        if !is_key || t.text != "large_segment_size_mb" || toks.get(i + 1).is_none_or(|c| c.text != ":") {
            continue;
        }
        let value = toks.get(i + 2).map(|v| v.text.as_str()).unwrap_or("");
        let expected = "a whole number of MiB above 10";
        let mb = parse_uint(&t.text, value, expected)?;
        if mb <= 10 {
            return Err(bad(&t.text, value, expected));
        }
        found = Some(mib_bytes(mb));
    }
    Ok(found)
}

/// `roundup_power2_divisions:N` or `[mb:N,...,>:N]`, read as `p.release` reads it.
fn read_divisions(p: &mut Parser<'_>, key: &str) -> Result<[u64; DIVISION_INTERVALS], ConfError> {
    let mut d = [0u64; DIVISION_INTERVALS];
    if p.peek().is_none_or(|t| t.text != "[") {
        let value = p.word(key)?;
        let expected = "a power of two, or a list such as [256:1,512:2,>:4]";
        let n = parse_uint(key, &value, expected)?;
        if !n.is_power_of_two() {
            return Err(bad(key, &value, expected));
        }
        return Ok([n; DIVISION_INTERVALS]);
    }
    let release = p.release;
    let items = p.list(key)?;
    let mut first = true;
    let mut last_index = 0usize;
    for (interval, div) in &items {
        let item = format!("{interval}:{div}");
        let n = parse_uint(key, div, "divisions that are 0 or a power of two")
            .map_err(|_| bad(key, &item, "divisions that are 0 or a power of two"))?;
        if n != 0 && !n.is_power_of_two() {
            return Err(bad(key, &item, "divisions that are 0 or a power of two"));
        }
        if interval == ">" {
            // PyTorch 2.6-2.8 fill from the last interval named (overwriting it); 2.9+ from the next.
            let from = if release.minor <= 8 { last_index } else { last_index + 1 };
            for slot in d.iter_mut().skip(from) {
                *slot = n;
            }
            continue;
        }
        let mb = parse_uint(key, interval, "intervals in MiB that are powers of two")
            .map_err(|_| bad(key, &item, "intervals in MiB that are powers of two"))?;
        if !mb.is_power_of_two() {
            return Err(bad(key, &item, "intervals in MiB that are powers of two"));
        }
        let index = (mb.trailing_zeros() as usize).min(DIVISION_INTERVALS - 1);
        if first {
            for slot in d.iter_mut().take(index) {
                *slot = n;
            }
            first = false;
        }
        d[index] = n;
        last_index = index;
    }
    Ok(d)
}

impl fmt::Display for AllocConf {
    /// The canonical string: the keys set, in a fixed order, each as PyTorch reads it back
    /// (`AllocConf::parse(&c.to_string()) == Ok(c)`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        let bool_text = |b: bool| if b { "True" } else { "False" };
        if let Some(b) = self.backend {
            parts.push(format!("backend:{}", if b == Backend::Native { "native" } else { "cudaMallocAsync" }));
        }
        if let Some(b) = self.expandable_segments {
            parts.push(format!("expandable_segments:{}", bool_text(b)));
        }
        if let Some(b) = self.large_segment_size_bytes {
            parts.push(format!("large_segment_size_mb:{}", b / MIB));
        }
        if let Some(b) = self.max_split_size_bytes {
            parts.push(format!("max_split_size_mb:{}", b / MIB));
        }
        if let Some(b) = self.max_non_split_rounding_bytes {
            parts.push(format!("max_non_split_rounding_mb:{}", b / MIB));
        }
        if let Some(d) = self.roundup_power2_divisions {
            parts.push(format!("roundup_power2_divisions:{}", divisions_text(&d)));
        }
        if let Some(t) = self.garbage_collection_threshold {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
        if let Some(x) = self.per_process_memory_fraction {
            parts.push(format!("per_process_memory_fraction:{x}"));
        }
        if let Some(b) = self.throw_on_cudamalloc_oom {
            parts.push(format!("throw_on_cudamalloc_oom:{}", bool_text(b)));
        }
        if let Some(r) = self.expandable_segments_reserve {
            parts.push(format!("expandable_segments_reserve:{r}"));
        }
        parts.extend(self.unmodelled.iter().map(|(k, v)| format!("{k}:{v}")));
        f.write_str(&parts.join(","))
    }
}

/// Divisions as a value every release reads the same: one number when all intervals agree,
/// else every interval named (no `>`, whose reading changed in 2.9).
fn divisions_text(d: &[u64; DIVISION_INTERVALS]) -> String {
    if d.iter().all(|&x| x == d[0]) && d[0].is_power_of_two() {
        return d[0].to_string();
    }
    let items: Vec<String> = d.iter().enumerate().map(|(i, n)| format!("{}:{n}", 1u64 << i)).collect();
    format!("[{}]", items.join(","))
}

/// `kMinLargeAlloc`: requests below it (and above 1 MiB) get a whole large segment.
pub(super) const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// `kRoundLarge`: larger requests' segments are rounded up to this.
pub(super) const ROUND_LARGE: u64 = 2 * MIB;

/// The segment size PyTorch asks of cudaMalloc for a block of `size` bytes (already rounded)
/// when `large_segment_size` is `large_segment` (`get_allocation_size`).
pub fn allocation_size(size: u64, large_segment: u64) -> u64 {
    if size <= crate::allocator::SMALL_REQUEST_BYTES {
        crate::allocator::SMALL_SEGMENT_BYTES
    } else if size < MIN_LARGE_ALLOC {
        large_segment
    } else {
        size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_drop_whitespace_and_split_on_separators() {
        let t: Vec<String> = tokenize(" max_split _size_mb : 200 ,x:[a:1]").into_iter().map(|t| t.text).collect();
        assert_eq!(t, ["max_split_size_mb", ":", "200", ",", "x", ":", "[", "a", ":", "1", "]"]);
    }

    #[test]
    fn releases_read_from_version_strings() {
        assert_eq!(TorchRelease::parse("2.11.0+cu130"), Some(TorchRelease { minor: 11 }));
        assert_eq!(TorchRelease::parse("2.6"), Some(TorchRelease { minor: 6 }));
        assert_eq!(TorchRelease::parse("1.13.1"), None);
        assert_eq!(TorchRelease::parse("2.x"), None);
    }
}
