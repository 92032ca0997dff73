//! Traces of processes that ran the recorder fallback (`memory_tracer/_history.py`): PyTorch's
//! own CUDA memory history (`torch.cuda.memory._record_memory_history`) instead of the native
//! capture (the `record` crate's shim), for a torch that no capture library fits or
//! `collector trace --capture recorder`.
//!
//! Such a process sends a hello (`"capture": "recorder"`), then, for each snapshot it took (at
//! exit, and at iteration ends before its recorder's ring would fill), a note naming the
//! complete file it wrote into the collector's private folder (`NAME.part` renamed once
//! whole): separate protocol-2 pickles of each device's entries, the annotations, the segments
//! and the allocator settings, with where each lies. The collector puts every snapshot's
//! entries and annotations end to end, with the last one's segments, into one snapshot pickle
//! that it streams into [`shared::import::snapshot`]: one replay of the allocator from the
//! first entry, whose totals are PyTorch's own (a snapshot imported alone would start from a
//! state recovered from its own segments, which misses the blocks the allocator left unsplit).
//! The process's `record_function` annotations, which the recorder keeps beside its entries
//! (`external_annotations`), become what the native capture records:
//!
//! - `memory_tracer:scope:<depth>:<phase>:<name>`: a layer scope (module path or
//!   `optimizer.step`) with its depth and phase;
//! - `memory_tracer:phase:<phase>`: the phase of every event in its span;
//! - `memory_tracer:iteration:<n>`: iteration `n`.
//!
//! An event belongs to the innermost scope open at its time (ties go to the deeper scope), a
//! free outside every scope to the layer that allocated its block, the rest to
//! [`UNATTRIBUTED`]. The program's other annotations (`Optimizer.step#SGD.step`, its own
//! `record_function`s) are left out, as the native capture leaves them out. The trace keeps
//! the CUDA device with the most events (or `--device`'s).

use super::wire::ProcessStream;
use super::{DeviceFilter, PyOptions};
use record::assemble::UNATTRIBUTED;
use shared::hash::FastMap as HashMap;
use shared::model::{Device, EventRecord, EventType, Frame, IterationSpan, LayerScope, Phase, SourceFormat, StrId, TraceMeta};
use shared::Trace;
use std::path::{Path, PathBuf};

/// The `capture` of a recorder process's hello.
pub const CAPTURE: &str = "recorder";
/// The kind of note that names a complete snapshot file.
pub const SNAPSHOT_NOTE: &str = "recorder_snapshot";
/// Where every annotation of ours starts.
const PREFIX: &str = "memory_tracer:";
/// What a process that never used CUDA recorded.
pub const NO_CUDA: &str = "the recorder fallback records CUDA memory only and this process used no CUDA, so nothing was recorded";

/// Whether the process ran the recorder fallback.
pub fn is_recorder(p: &ProcessStream) -> bool {
    p.hello.as_ref().and_then(|h| h.capture.as_deref()) == Some(CAPTURE)
}

/// The first note of a recorder trace: which capture ran, why, and what it cannot see.
pub fn capture_note(reason: &str) -> String {
    format!(
        "capture: PyTorch's recorder (fallback: {reason}); it records CUDA memory only: no CPU memory, no operators, no live streaming (the trace arrives when the process ends)"
    )
}

/// The notes of a recorder process worth saying on the collector's stderr as well: the
/// capture, and that nothing was recorded when the process used no CUDA.
pub fn stderr_notes(p: &ProcessStream) -> Vec<String> {
    let mut notes = vec![capture_note(p.hello.as_ref().and_then(|h| h.reason.as_deref()).unwrap_or("no reason given"))];
    let said = p.end.as_ref().and_then(|e| e.cuda_used);
    if recorded_nothing(p) && said == Some(false) {
        notes.push(NO_CUDA.into());
    }
    notes
}

/// Whether the process named no snapshot (it used no CUDA, or ended before writing one).
pub fn recorded_nothing(p: &ProcessStream) -> bool {
    !p.notes.iter().any(|n| n.kind == SNAPSHOT_NOTE)
}

/// One pickle of a snapshot file: what it holds and where.
type Piece = protocol::frames::SnapshotPiece;

/// A snapshot file a process named (a note frame): its pickles, checked.
struct SnapshotFile {
    name: String,
    path: PathBuf,
    pieces: Vec<Piece>,
}

impl SnapshotFile {
    fn piece(&self, what: &str, device: Option<usize>) -> Option<&Piece> {
        self.pieces.iter().find(|p| p.what == what && p.device == device)
    }
}

/// The snapshots the process named, in the order it wrote them, up to the first that cannot
/// be read (their entries go end to end, so a gap would break the replay); that one, if any,
/// and why. A name must be a plain `*.pickles` file of the process's folder whose size is the
/// one the note gives, and every pickle in it whole (a file cut short is never imported).
fn snapshot_files(p: &ProcessStream) -> (Vec<SnapshotFile>, Option<String>) {
    let mut notes: Vec<&protocol::frames::Note> = p.notes.iter().filter(|n| n.kind == SNAPSHOT_NOTE).collect();
    notes.sort_by_key(|n| n.index.unwrap_or(u64::MAX));
    let mut files = Vec::new();
    for (k, n) in notes.into_iter().enumerate() {
        let name = n.file.clone().unwrap_or_default();
        let checked = match n.pieces.clone() {
            Some(pieces) => {
                check_file(p.snapshot_dir.as_deref(), &name, n.bytes).and_then(|path| check_pieces(&path, &pieces).map(|()| (path, pieces)))
            }
            None => Err("its note lists no pieces".into()),
        };
        match checked {
            Ok((path, pieces)) if n.index == Some(k as u64) => files.push(SnapshotFile { name, path, pieces }),
            Ok(_) => return (files, Some(format!("snapshot {k} is missing, so it and the later snapshots were left out"))),
            Err(e) => return (files, Some(format!("snapshot {k} ({name}) and the later ones were left out: {e}"))),
        }
    }
    (files, None)
}

fn check_file(dir: Option<&Path>, name: &str, bytes: Option<u64>) -> Result<PathBuf, String> {
    let plain = !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\']) && name.ends_with(".pickles");
    if !plain {
        return Err(format!("`{name}` is not the name of a snapshot file (expected NAME.pickles)"));
    }
    let dir = dir.ok_or("the collector kept no folder for this process's snapshots")?;
    let path = dir.join(name);
    let size = std::fs::metadata(&path).map_err(|e| format!("{e} ({})", path.display()))?.len();
    match bytes {
        Some(b) if b != size => Err(format!("it holds {size} bytes where the process wrote {b} ({})", path.display())),
        Some(_) => Ok(path),
        None => Err("its note gives no size".into()),
    }
}

/// Each pickle lies inside the file, is protocol 2 (`\x80\x02`) and ends with STOP; lists
/// (entries, annotations, segments) start with EMPTY_LIST, the settings with EMPTY_DICT.
fn check_pieces(path: &Path, pieces: &[Piece]) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    for p in pieces {
        if p.device.is_some_and(|d| d > 255) {
            return Err(format!("its {} pickle is of device {}; at most 256 devices expected", p.what, p.device.unwrap_or(0)));
        }
        let end = p.offset.checked_add(p.bytes).filter(|&e| e <= size && p.bytes >= 4);
        let Some(end) = end else {
            return Err(format!("its {} pickle ({} bytes at {}) lies outside the file's {size} bytes", p.what, p.bytes, p.offset));
        };
        let (mut head, mut stop) = ([0u8; 3], [0u8; 1]);
        file.read_exact_at(&mut head, p.offset).and_then(|()| file.read_exact_at(&mut stop, end - 1)).map_err(|e| e.to_string())?;
        let open = if p.what == "settings" { b'}' } else { b']' };
        if head != [0x80, 2, open] || stop[0] != b'.' {
            return Err(format!(
                "its {} pickle at byte {} is not a protocol-2 pickle of a {}",
                p.what,
                p.offset,
                if open == b'}' { "dict" } else { "list" }
            ));
        }
    }
    for what in ["annotations", "segments", "settings"] {
        if !pieces.iter().any(|p| p.what == what) {
            return Err(format!("it has no {what} pickle"));
        }
    }
    Ok(())
}

/// A part of the snapshot the collector puts together: its own opcodes, or a range of a file.
enum Part {
    Bytes(Vec<u8>),
    File { path: PathBuf, offset: u64, len: u64 },
}

/// Reads the parts one after the other, opening each file range when it comes.
struct Parts {
    parts: std::vec::IntoIter<Part>,
    current: Option<Box<dyn std::io::Read + Send>>,
}

impl std::io::Read for Parts {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::io::{Seek, SeekFrom};
        loop {
            if let Some(r) = &mut self.current {
                let n = r.read(buf)?;
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
            }
            self.current = match self.parts.next() {
                None => return Ok(0),
                Some(Part::Bytes(b)) => Some(Box::new(std::io::Cursor::new(b))),
                Some(Part::File { path, offset, len }) => {
                    let mut f = std::fs::File::open(&path)?;
                    f.seek(SeekFrom::Start(offset))?;
                    Some(Box::new(f.take(len)))
                }
            };
        }
    }
}

/// BINUNICODE of a key.
fn key(k: &str) -> Part {
    let mut b = vec![b'X'];
    b.extend((k.len() as u32).to_le_bytes());
    b.extend(k.as_bytes());
    Part::Bytes(b)
}

/// A pickle's value: its bytes between PROTO and STOP.
fn value(f: &SnapshotFile, p: &Piece) -> Part {
    Part::File { path: f.path.clone(), offset: p.offset + 2, len: p.bytes - 3 }
}

/// A pickled list's items: its bytes after EMPTY_LIST and the list's own memo key (BINPUT or
/// LONG_BINPUT), up to STOP; they append to whatever list is below them.
fn items(f: &SnapshotFile, p: &Piece) -> Result<Part, String> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(&f.path).map_err(|e| format!("cannot open {}: {e}", f.path.display()))?;
    let mut op = [0u8; 1];
    file.read_exact_at(&mut op, p.offset + 3).map_err(|e| e.to_string())?;
    let skip = match op[0] {
        b'q' => 2,
        b'r' => 5,
        _ => 0,
    };
    let len = (p.bytes - 4).checked_sub(skip).ok_or_else(|| format!("its {} pickle at byte {} is cut short", p.what, p.offset))?;
    Ok(Part::File { path: f.path.clone(), offset: p.offset + 3 + skip, len })
}

/// The process's snapshots as one snapshot pickle: every snapshot's entries (per device) and
/// annotations end to end, the last one's segments and settings, imported in one replay that
/// starts from the first entry. Each pickle keeps its own memo keys: a later one reuses the
/// keys of an earlier one only after the earlier one is done with them.
fn import_all(files: &[SnapshotFile]) -> Result<Option<Trace>, String> {
    let Some(last) = files.last() else { return Ok(None) };
    let devices = files.iter().flat_map(|f| &f.pieces).filter(|p| p.what == "entries").filter_map(|p| p.device).max().map_or(0, |d| d + 1);
    let whole =
        |what: &str| last.piece(what, None).map(|p| value(last, p)).ok_or_else(|| format!("the last snapshot has no {what} pickle"));
    let mut parts =
        vec![Part::Bytes(b"\x80\x02}(".to_vec()), key("segments"), whole("segments")?, key("device_traces"), Part::Bytes(b"](".to_vec())];
    for d in 0..devices {
        parts.push(Part::Bytes(b"]".to_vec()));
        for f in files {
            if let Some(p) = f.piece("entries", Some(d)) {
                parts.push(items(f, p)?);
            }
        }
    }
    parts.extend([Part::Bytes(b"e".to_vec()), key("external_annotations"), Part::Bytes(b"]".to_vec())]);
    for f in files {
        if let Some(p) = f.piece("annotations", None) {
            parts.push(items(f, p)?);
        }
    }
    parts.extend([key("allocator_settings"), whole("settings")?, Part::Bytes(b"u.".to_vec())]);
    let reader = Parts { parts: parts.into_iter(), current: None };
    let reader = traceio::read_ahead::ReadAhead::new(reader).map_err(|e| format!("cannot start a thread to read the snapshots: {e}"))?;
    shared::import::snapshot::import_reader(reader).map(Some).map_err(|e| e.to_string())
}

/// Builds the trace of a recorder process: its snapshots imported as one, its annotations
/// turned into layer scopes, phases and iterations, and its metadata as the native capture's
/// trace has it.
pub fn build_trace(mut p: ProcessStream, opts: &PyOptions) -> Result<Trace, String> {
    let mut warnings = stderr_notes(&p);
    let hello = p.hello.take().ok_or("the process sent no capture header")?;
    let (files, left_out) = snapshot_files(&p);
    warnings.extend(left_out);
    let src = import_all(&files).unwrap_or_else(|e| {
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        warnings.push(format!("the recorder's snapshots ({}) could not be imported: {e}", names.join(", ")));
        None
    });
    let end = p.end.take();
    let device = pick_device(src.as_ref(), opts.device, &mut warnings);
    let mut meta = TraceMeta::new(SourceFormat::PytorchSnapshot);
    meta.model = Some(super::program_of(&hello));
    meta.pytorch_version.clone_from(&hello.torch_version);
    meta.fragmentation_tracked = opts.fragmentation;
    meta.allocator_settings = src.as_ref().and_then(|t| t.meta.allocator_settings.clone());
    let spans = src.as_ref().map(Spans::collect).unwrap_or_default();
    let mut trace = rebuild(src.as_ref(), device.as_ref(), &spans, Trace::new(meta));
    trace.meta.start_unix_ns = trace.events.ts_ns.first().copied().or(hello.start_unix_ns);
    if let Some(d) = &device {
        report_device(&mut trace, end.as_ref(), d.index);
    }
    super::report_env(&mut trace, &hello);
    trace.meta.reported.insert("recorder.snapshots".into(), files.len() as u64);
    if spans.is_empty() && !trace.events.is_empty() {
        warnings.push(
            "the recorder's snapshots hold no Memory Tracer annotations (this torch's recorder keeps none, or the hooks never ran): \
             no module scopes, phases or iterations; layers are the allocating Python line"
                .into(),
        );
    }
    warnings.extend(end.iter().flat_map(|e| e.notes.iter().cloned()));
    // The importer's own notes, less the annotations outside the entries' time: ours reach
    // past the last entry (the last iteration's end, the program's last lines).
    for w in src.iter().flat_map(|t| &t.meta.warnings) {
        if !w.contains("annotated spans outside the trace entries' time") {
            warnings.push(w.clone());
        }
    }
    match (&end, &p.error) {
        (None, _) => warnings.push(
            "the process ended without closing its capture (killed, crashed or os._exit): the trace holds the snapshots it wrote before"
                .into(),
        ),
        (Some(_), Some(e)) => warnings.push(format!("the capture stream was cut: {e}")),
        _ => {}
    }
    trace.meta.warnings = warnings;
    Ok(trace)
}

/// The CUDA device whose events the trace keeps: the one asked for, else the one with the
/// most events (a recorder records every device the process used).
fn pick_device(src: Option<&Trace>, filter: Option<DeviceFilter>, warnings: &mut Vec<String>) -> Option<Device> {
    let mut events: std::collections::BTreeMap<i32, usize> = std::collections::BTreeMap::new();
    if let Some(t) = src {
        for &d in &t.events.device {
            *events.entry(t.devices[d as usize].index).or_default() += 1;
        }
    }
    let cuda = |index: i32| Device { kind: "cuda".into(), index, rank: None };
    match filter {
        Some(DeviceFilter::Cpu) => {
            warnings.push("--device cpu: PyTorch's recorder records CUDA memory only, so this trace holds no memory events".into());
            None
        }
        Some(DeviceFilter::Cuda(Some(i))) => Some(cuda(i32::from(i))),
        Some(DeviceFilter::Cuda(None)) | None => {
            let most = events.iter().max_by_key(|(d, n)| (**n, std::cmp::Reverse(**d))).map(|(d, _)| *d);
            if events.len() > 1 {
                let used: Vec<String> = events.keys().map(|d| format!("cuda:{d}")).collect();
                warnings.push(format!(
                    "this process used {}; the trace keeps cuda:{} (the most events; --device cuda:N keeps another)",
                    used.join(", "),
                    most.unwrap_or(0)
                ));
            }
            let with_memory = || src.and_then(|t| t.initial_segments.first()).map(|s| i32::from(s.device));
            most.or_else(with_memory).map(cuda)
        }
    }
}

/// PyTorch's own counters of CUDA device `index` at the process's end, and the device's name.
fn report_device(trace: &mut Trace, end: Option<&protocol::frames::End>, index: i32) {
    let Some(d) = end.and_then(|e| e.cuda.iter().find(|d| d.device == Some(i64::from(index)))) else {
        return;
    };
    trace.meta.device_name.clone_from(&d.name);
    trace.meta.device_total_memory_bytes = d.total_memory;
    use shared::model::Counter;
    for (counter, value) in [
        (Counter::MaxMemoryAllocated, d.allocated_peak),
        (Counter::MaxMemoryReserved, d.reserved_peak),
        (Counter::MemoryAllocated, d.allocated_current),
        (Counter::MemoryReserved, d.reserved_current),
        (Counter::NumAllocRetries, d.num_alloc_retries),
        (Counter::NumOoms, d.num_ooms),
    ] {
        if let Some(v) = value {
            trace.meta.report(counter, v);
        }
    }
}

/// One of our annotations, parsed from its name.
#[derive(Debug, PartialEq)]
enum Annotation<'a> {
    Scope { depth: u16, phase: Phase, name: &'a str },
    Phase(Phase),
    Iteration(u32),
}

fn phase_of(name: &str) -> Option<Phase> {
    [Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Other].into_iter().find(|p| p.as_str() == name)
}

fn parse(annotation: &str) -> Option<Annotation<'_>> {
    let rest = annotation.strip_prefix(PREFIX)?;
    if let Some(scope) = rest.strip_prefix("scope:") {
        let mut parts = scope.splitn(3, ':');
        let depth = parts.next()?.parse().ok()?;
        let phase = phase_of(parts.next()?)?;
        let name = parts.next().filter(|n| !n.is_empty())?;
        return Some(Annotation::Scope { depth, phase, name });
    }
    if let Some(phase) = rest.strip_prefix("phase:") {
        return phase_of(phase).map(Annotation::Phase);
    }
    rest.strip_prefix("iteration:")?.parse().ok().map(Annotation::Iteration)
}

/// Our annotations, as spans on the recorder's clock (the importer made each START and END
/// pair a scope).
#[derive(Default)]
struct Spans {
    /// (name, start, end, depth, phase), sorted by start, outer first.
    scopes: Vec<(String, u64, u64, u16, Phase)>,
    /// Disjoint, sorted by start.
    phases: Vec<(u64, u64, Phase)>,
    iterations: Vec<IterationSpan>,
}

impl Spans {
    fn collect(t: &Trace) -> Self {
        let mut s = Spans::default();
        for sc in &t.scopes {
            match parse(t.str(sc.name)) {
                Some(Annotation::Scope { depth, phase, name }) => s.scopes.push((name.to_owned(), sc.start_ns, sc.end_ns, depth, phase)),
                Some(Annotation::Phase(phase)) => s.phases.push((sc.start_ns, sc.end_ns, phase)),
                Some(Annotation::Iteration(index)) => s.iterations.push(IterationSpan { index, start_ns: sc.start_ns, end_ns: sc.end_ns }),
                None => {}
            }
        }
        s.scopes.sort_by_key(|x| (x.1, x.3));
        s.phases.sort_by_key(|x| x.0);
        s.iterations.sort_by_key(|x| (x.start_ns, x.index));
        s
    }

    fn is_empty(&self) -> bool {
        self.scopes.is_empty() && self.phases.is_empty() && self.iterations.is_empty()
    }
}

/// Walks events in time order and says, for each, the innermost scope open at its time and
/// the phase it falls in.
struct Attribution<'s> {
    scopes: &'s [LayerScope],
    next: usize,
    open: Vec<usize>,
    phases: &'s [(u64, u64, Phase)],
    next_phase: usize,
}

impl<'s> Attribution<'s> {
    fn new(scopes: &'s [LayerScope], phases: &'s [(u64, u64, Phase)]) -> Self {
        Self { scopes, next: 0, open: Vec::new(), phases, next_phase: 0 }
    }

    fn scope_at(&mut self, ts: u64) -> Option<StrId> {
        while self.next < self.scopes.len() && self.scopes[self.next].start_ns <= ts {
            self.open.push(self.next);
            self.next += 1;
        }
        while self.open.last().is_some_and(|&top| self.scopes[top].end_ns < ts) {
            self.open.pop();
        }
        self.open.last().map(|&i| self.scopes[i].name)
    }

    fn phase_at(&mut self, ts: u64) -> Phase {
        while self.next_phase < self.phases.len() && self.phases[self.next_phase].1 < ts {
            self.next_phase += 1;
        }
        match self.phases.get(self.next_phase) {
            Some(&(start, _, phase)) if start <= ts => phase,
            _ => Phase::Other,
        }
    }
}

/// The trace of `device` from the imported snapshot: its events with the totals the replay
/// gave them and their stacks, its segments of the device as the start state, our scopes and
/// iterations. With annotations, events' layers and phases are theirs; without, the
/// importer's (the allocating Python line, the phase its stack suggests).
fn rebuild(src: Option<&Trace>, device: Option<&Device>, spans: &Spans, mut out: Trace) -> Trace {
    let unattributed = out.strings.intern(UNATTRIBUTED);
    let scopes: Vec<LayerScope> = spans
        .scopes
        .iter()
        .map(|(name, start_ns, end_ns, depth, phase)| LayerScope {
            name: out.strings.intern(name),
            start_ns: *start_ns,
            end_ns: *end_ns,
            depth: *depth,
            phase: *phase,
            thread: 0,
        })
        .collect();
    out.iterations = spans.iterations.clone();
    let found = src.zip(device).and_then(|(t, dev)| t.devices.iter().position(|d| d == dev).map(|i| (t, i)));
    if let (Some((src, si)), Some(device)) = (found, device) {
        let d_out = out.device_index(device.clone());
        let mut copy = Copier::new(src);
        out.events.set_base_totals(d_out as usize, src.events.base_totals.get(si).copied().unwrap_or_default());
        for seg in src.initial_segments.iter().filter(|s| s.device as usize == si) {
            let stream = copy.stream(&mut out, seg.stream);
            out.initial_segments.push(shared::model::SegmentInfo { device: d_out, stream, ..seg.clone() });
        }
        let mut by = Attribution::new(&scopes, &spans.phases);
        let annotated = !spans.is_empty();
        let mut owner: HashMap<u64, StrId> = HashMap::default();
        let mut totals = src.events.cursor();
        let extras = src.has_event_extras();
        let mut new_of = if extras { vec![u32::MAX; src.events.len()] } else { Vec::new() };
        for i in 0..src.events.len() {
            let after = totals.advance();
            if src.events.device[i] as usize != si {
                continue;
            }
            if let Some(slot) = new_of.get_mut(i) {
                *slot = out.events.len() as u32;
            }
            let mut rec = src.events.record(i);
            if annotated {
                rec.phase = by.phase_at(rec.ts_ns);
                // Outside every module, an allocation takes the importer's layer: the line of
                // the program's own code on its stack (`train.py:40 in step`).
                let source = (rec.event_type == EventType::Alloc && rec.layer != StrId::NONE)
                    .then(|| copy.string(&mut out, rec.layer))
                    .filter(|&l| shared::model::is_source_layer(out.str(l)));
                rec.layer = layer_of(&rec, by.scope_at(rec.ts_ns).or(source), &mut owner).unwrap_or(unattributed);
            } else {
                rec.layer = copy.string(&mut out, rec.layer);
            }
            rec.stream = copy.stream(&mut out, rec.stream);
            rec.device = d_out;
            rec.totals = Some(after);
            let index = out.events.len() as u32;
            out.events.push(rec);
            if let Some(stack) = copy.stack_of(&mut out, i) {
                out.stacks.event_stacks.push((index, stack));
            }
        }
        let new_index = |i: u32| new_of.get(i as usize).copied().filter(|&n| n != u32::MAX);
        out.pools = src.pools.clone();
        shared::ranks::carry_event_extras(&mut out, src, &new_index, &mut copy);
        out.event_notes.sort_by_key(|n| (n.event, n.ts_ns));
    }
    out.scopes = scopes;
    out.finish();
    out
}

/// An event's layer: the innermost open scope; a free outside every scope, the layer that
/// allocated its block.
fn layer_of(rec: &EventRecord, scope: Option<StrId>, owner: &mut HashMap<u64, StrId>) -> Option<StrId> {
    match rec.event_type {
        EventType::Alloc => {
            if let Some(l) = scope {
                owner.insert(rec.address, l);
            } else {
                owner.remove(&rec.address);
            }
            scope
        }
        EventType::Free => scope.or_else(|| owner.get(&rec.address).copied()),
        EventType::FreeCompleted => scope.or_else(|| owner.remove(&rec.address)),
        _ => scope,
    }
}

/// The imported snapshot's strings, streams and stacks, copied into the rebuilt trace once
/// each.
struct Copier<'t> {
    src: &'t Trace,
    strings: HashMap<StrId, StrId>,
    streams: HashMap<u16, u16>,
    stacks: HashMap<u32, u32>,
    /// Position in the source's `event_stacks` (sorted by event).
    next_stack: usize,
}

impl<'t> Copier<'t> {
    fn new(src: &'t Trace) -> Self {
        Self { src, strings: HashMap::default(), streams: HashMap::default(), stacks: HashMap::default(), next_stack: 0 }
    }

    fn string(&mut self, out: &mut Trace, id: StrId) -> StrId {
        if id.is_none() {
            return id;
        }
        let src = self.src;
        *self.strings.entry(id).or_insert_with(|| out.strings.intern(src.str(id)))
    }

    fn stream(&mut self, out: &mut Trace, s: u16) -> u16 {
        let src = self.src;
        *self.streams.entry(s).or_insert_with(|| out.stream_index(src.str(src.streams.get(s as usize).copied().unwrap_or(StrId::NONE))))
    }

    /// The rebuilt trace's stack of the source's event `event`, if it has one (events are
    /// asked in order).
    fn stack_of(&mut self, out: &mut Trace, event: usize) -> Option<u32> {
        let list = &self.src.stacks.event_stacks;
        while self.next_stack < list.len() && (list[self.next_stack].0 as usize) < event {
            self.next_stack += 1;
        }
        let &(_, stack) = list.get(self.next_stack).filter(|(e, _)| *e as usize == event)?;
        Some(self.copy_stack(out, stack))
    }

    /// The rebuilt trace's stack of the source's stack `stack`.
    fn copy_stack(&mut self, out: &mut Trace, stack: u32) -> u32 {
        if let Some(&s) = self.stacks.get(&stack) {
            return s;
        }
        let frames: Vec<u32> = self
            .src
            .stacks
            .stack_frame_ids(stack)
            .to_vec()
            .into_iter()
            .map(|f| {
                let f = self.src.stacks.frames[f as usize];
                let (name, filename) = (self.string(out, f.name), self.string(out, f.filename));
                out.stacks.intern_frame(Frame { name, filename, line: f.line })
            })
            .collect();
        let s = out.stacks.intern_stack(frames);
        self.stacks.insert(stack, s);
        s
    }
}

impl shared::ranks::IdMap for Copier<'_> {
    fn text(&mut self, out: &mut Trace, id: StrId) -> StrId {
        self.string(out, id)
    }
    fn stack(&mut self, out: &mut Trace, stack: u32) -> u32 {
        self.copy_stack(out, stack)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_names_parse_into_scopes_phases_and_iterations() {
        assert_eq!(
            parse("memory_tracer:scope:2:forward:layer1.0.conv1"),
            Some(Annotation::Scope { depth: 2, phase: Phase::Forward, name: "layer1.0.conv1" })
        );
        assert_eq!(
            parse("memory_tracer:scope:0:optimizer:optimizer.step"),
            Some(Annotation::Scope { depth: 0, phase: Phase::Optimizer, name: "optimizer.step" })
        );
        assert_eq!(parse("memory_tracer:scope:0:other:a:b"), Some(Annotation::Scope { depth: 0, phase: Phase::Other, name: "a:b" }));
        assert_eq!(parse("memory_tracer:phase:backward"), Some(Annotation::Phase(Phase::Backward)));
        assert_eq!(parse("memory_tracer:iteration:12"), Some(Annotation::Iteration(12)));
        for other in [
            "Optimizer.step#SGD.step",
            "memory_tracer:scope:x:forward:a",
            "memory_tracer:scope:1:sideways:a",
            "memory_tracer:scope:1:forward:",
            "memory_tracer:phase:lunch",
            "memory_tracer:iteration:-1",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }

    #[test]
    fn snapshot_names_must_be_plain_complete_files() {
        let dir = std::env::temp_dir().join(format!("mt-recorder-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        std::fs::write(dir.join("recorder-1-0.pickles"), b"12345").unwrap_or_default();
        assert!(check_file(Some(&dir), "recorder-1-0.pickles", Some(5)).is_ok());
        assert!(
            check_file(Some(&dir), "recorder-1-0.pickles", Some(9)).is_err_and(|e| e.contains("holds 5 bytes where the process wrote 9"))
        );
        assert!(check_file(Some(&dir), "recorder-1-0.pickles", None).is_err());
        for bad in ["../x.pickles", "/etc/passwd", ".hidden.pickles", "recorder-1-0.pickles.part", ""] {
            assert!(check_file(Some(&dir), bad, Some(5)).is_err(), "{bad}");
        }
        assert!(check_file(Some(&dir), "missing.pickles", Some(5)).is_err());
        let piece = |what: &str, offset, bytes| Piece { what: what.into(), device: None, offset, bytes };
        std::fs::write(dir.join("p.pickles"), b"\x80\x02]q\x00.\x80\x02}q\x00.").unwrap_or_default();
        let whole = [piece("annotations", 0, 6), piece("segments", 0, 6), piece("settings", 6, 6)];
        assert_eq!(check_pieces(&dir.join("p.pickles"), &whole), Ok(()));
        let outside = [piece("annotations", 0, 6), piece("segments", 0, 6), piece("settings", 6, 7)];
        assert!(check_pieces(&dir.join("p.pickles"), &outside).is_err_and(|e| e.contains("lies outside the file's 12 bytes")));
        let wrong = [piece("annotations", 6, 6), piece("segments", 0, 6), piece("settings", 6, 6)];
        assert!(check_pieces(&dir.join("p.pickles"), &wrong).is_err_and(|e| e.contains("is not a protocol-2 pickle of a list")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
