//! What the commands print: the summary (or its `--json` form), the out-of-memory explanation,
//! leaks, diffs and advice, as text for a terminal.

use shared::analysis::{LayerMemoryStats, Summary};
use shared::model::{is_source_layer, layer_place};
use shared::report::{TraceReport, Walks};
use shared::units::{format_bytes, format_seconds};
use shared::Trace;
use std::io::Write;

pub use crate::advice_text::print_advice;

/// The out-of-memory explanation, first in `summary`.
pub fn print_oom(o: &shared::analysis::oom::OomReport, mut out: impl Write) -> anyhow::Result<()> {
    writeln!(out, "OUT OF MEMORY: {}", o.verdict)?;
    if o.ooms > 1 {
        writeln!(out, "  {} out-of-memory events (the program caught all but the last, which is explained):", o.ooms)?;
        for (k, e) in o.all.iter().enumerate() {
            let last = if k + 1 == o.all.len() { "  <- the last, the one the program saw last" } else { "" };
            writeln!(
                out,
                "    {:>2}. {:>9.3} s  {}  request {} with {} allocated, {} reserved{}{last}",
                k + 1,
                e.time_s,
                e.device,
                format_bytes(e.requested_bytes),
                format_bytes(e.allocated_bytes),
                format_bytes(e.reserved_bytes),
                e.layer.as_deref().map(|l| format!(" {}", layer_place(l))).unwrap_or_default()
            )?;
        }
    }
    for (title, groups) in [("by layer", &o.by_layer), ("by the phase that allocated it", &o.by_phase), ("by innermost frame", &o.by_frame)]
    {
        if groups.is_empty() {
            continue;
        }
        writeln!(out, "  live at the out-of-memory, {title}:")?;
        for g in groups {
            writeln!(out, "    {:>12}  {:>6} allocations  {}", format_bytes(g.bytes), g.allocations, g.name)?;
        }
    }
    if o.unrecorded_bytes > 0 {
        writeln!(out, "    {:>12}  allocated before recording began", format_bytes(o.unrecorded_bytes))?;
    }
    if !o.holders.is_empty() {
        writeln!(out, "  live at the out-of-memory, by holder:")?;
        print_holders(&o.holders, o.holders.len(), &mut out)?;
    }
    Ok(())
}

/// Prints `collector why`: the live bytes by holder, largest first (at most `top`).
pub fn print_why(w: &shared::analysis::holders::Why, top: usize, mut out: impl Write) -> anyhow::Result<()> {
    let at = match (&w.at.kind[..], &w.at.name) {
        ("mark", Some(n)) => format!("at the mark `{n}`"),
        ("peak", _) => "at the allocated peak".to_owned(),
        ("oom", _) => "at the out-of-memory".to_owned(),
        _ => "at".to_owned(),
    };
    writeln!(out, "Who holds {} on {} {at} ({})", format_bytes(w.live_bytes), w.at.device, format_seconds(w.at.time_s))?;
    if w.recorded {
        writeln!(out, "  holders recorded by the capture; {}", w.shares())?;
    } else {
        writeln!(
            out,
            "  holders inferred: trace with `collector trace --holders` to record them; {:.1} % of the live bytes have one",
            100.0 * w.coverage()
        )?;
    }
    if w.reserved_bytes > 0 {
        writeln!(out, "  reserved {}", format_bytes(w.reserved_bytes))?;
    }
    print_holders(&w.holders, top, &mut out)?;
    if w.holders.len() > top {
        let rest: u64 = w.holders[top..].iter().map(|g| g.bytes).sum();
        writeln!(out, "  {:>12}  {} more holders (--top)", format_bytes(rest), w.holders.len() - top)?;
    }
    Ok(())
}

/// Holder groups, one line each: bytes, blocks, kind, name and module, release.
fn print_holders(groups: &[shared::analysis::holders::HolderGroup], top: usize, out: &mut dyn Write) -> anyhow::Result<()> {
    for g in groups.iter().take(top) {
        let what = match (g.name.is_empty(), g.module.is_empty()) {
            (false, false) => format!("{} in {}", g.name, g.module),
            (false, true) => g.name.clone(),
            (true, false) => format!("in {}", g.module),
            (true, true) => String::new(),
        };
        let released = match g.released_at_s {
            Some(t) => format!(", released by {}", format_seconds(t)),
            None if matches!(g.kind, shared::model::HolderKind::Cache) => String::new(),
            None => ", held to the end".to_owned(),
        };
        let inferred = if g.inferred { " (inferred)" } else { "" };
        let blocks = if g.blocks > 0 { format!("{:>6} blocks", g.blocks) } else { " ".repeat(13) };
        writeln!(out, "  {:>12}  {blocks}  {:<18} {what}{released}{inferred}", format_bytes(g.bytes), g.kind.as_str())?;
    }
    Ok(())
}

/// Prints the summary (or one JSON object with `json`): the trace's [`TraceReport`] as text.
pub fn print_summary(trace: &Trace, top: usize, json: bool, out: impl Write) -> anyhow::Result<()> {
    print_report(trace, &report(trace), top, json, out)
}

/// The trace's report, its four walks over every event on as many cores.
pub fn report(trace: &Trace) -> TraceReport {
    use shared::analysis::{categories, layer_stats, summary};
    let walks = std::thread::scope(|scope| {
        let leaks = scope.spawn(|| Walks::leaks(trace));
        let layers = scope.spawn(|| layer_stats(trace));
        let categorized = scope.spawn(|| categories::categorize(trace));
        let summary = summary(trace);
        Walks { summary, layers: joined(layers), leaks: joined(leaks), categorized: joined(categorized) }
    });
    TraceReport::from_walks(trace, walks).0
}

/// A scoped thread's result; its panic goes on in this thread, as it would have without it.
fn joined<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Prints `report`, the report of `trace`, as text (or as `collector summary --json`'s object).
pub fn print_report(trace: &Trace, report: &TraceReport, top: usize, json: bool, mut out: impl Write) -> anyhow::Result<()> {
    if json {
        serde_json::to_writer_pretty(&mut out, &protocol::SummaryJson::new(trace, report, top))?;
        writeln!(out)?;
        return Ok(());
    }
    let s = &report.summary;
    print_peaks(trace, report, &mut out)?;
    let categories = &report.categories_at_peak;
    if categories.iter().any(|&(_, b)| b > 0) {
        let parts: Vec<String> = categories
            .iter()
            .filter(|&&(_, b)| b > 0)
            .map(|&(c, b)| format!("{} {}", c.as_str().replace('_', " "), format_bytes(b)))
            .collect();
        writeln!(out, "  at the peak        {}", parts.join(", "))?;
    }
    if let Some(w) = &report.holders_at_peak {
        writeln!(out, "  held at the peak   ({}; `collector why` lists them all)", w.shares())?;
        print_holders(&w.holders, w.holders.len(), &mut out)?;
    }
    print_pools(trace, s, &mut out)?;
    print_run(trace, report, &mut out)?;
    print_top_layers(trace, &report.top_layers(top), &mut out)
}

/// Private pools, pinned host memory and annotations, where the trace has them.
fn print_pools(trace: &Trace, s: &Summary, out: &mut dyn Write) -> anyhow::Result<()> {
    if let Some(h) = &s.pinned_host {
        writeln!(
            out,
            "  pinned host        peak {} allocated, {} reserved; at end {} allocated (not part of the GPU numbers)",
            format_bytes(h.peak_allocated_bytes),
            format_bytes(h.peak_reserved_bytes),
            format_bytes(h.final_allocated_bytes)
        )?;
    }
    // Without segments (a traced run records allocations only) a pool's reserved memory is unknown.
    for p in &s.pools {
        let kind = if p.index.is_some() { "private pool" } else { "default pool" };
        let t = &p.totals;
        let (peak, at_end) = if p.reserved_known {
            (
                format!("{} allocated, {} reserved", format_bytes(t.peak_allocated_bytes), format_bytes(t.peak_reserved_bytes)),
                format!("{} allocated, {} reserved", format_bytes(t.final_allocated_bytes), format_bytes(t.final_reserved_bytes)),
            )
        } else {
            (format!("{} allocated", format_bytes(t.peak_allocated_bytes)), format!("{} allocated", format_bytes(t.final_allocated_bytes)))
        };
        writeln!(out, "  {kind:<18} {} on {}: peak {peak}; at end {at_end}; {} allocations", p.pool, p.device, p.allocations)?;
    }
    let n = &s.notes;
    if !n.is_empty() {
        writeln!(
            out,
            "  notes              {} annotations, {} events with user metadata, {} allocator tags",
            n.annotations, n.user_metadata, n.internal
        )?;
        for note in trace.event_notes.iter().filter(|x| x.kind == shared::model::NoteKind::Annotation).take(5) {
            let i = note.event as usize;
            writeln!(
                out,
                "    \"{}\" on {} at 0x{:x}",
                trace.str(note.text).chars().take(80).collect::<String>(),
                format_bytes(trace.events.size_bytes[i]),
                trace.events.address[i]
            )?;
        }
    }
    Ok(())
}

/// The summary's head: what was traced, the out-of-memory explanation, the peaks and PyTorch's
/// and the driver's own counters.
fn print_peaks(trace: &Trace, report: &TraceReport, out: &mut dyn Write) -> anyhow::Result<()> {
    let s = &report.summary;
    let device = trace.meta.device_name.clone().or(s.peak_device.clone()).unwrap_or_else(|| "unknown device".into());
    writeln!(out, "Memory trace ({}, {device})", s.source_format)?;
    if let Some(m) = &trace.meta.model {
        writeln!(out, "  model              {m}")?;
    }
    if let Some(c) = &trace.meta.capture {
        writeln!(out, "  capture            {c}")?;
    }
    if let Some(c) = &trace.meta.compiled {
        writeln!(out, "  compiled code      {}", c.describe())?;
    }
    if let Some(a) = &report.allocator_settings {
        writeln!(out, "  allocator          {}", a.description)?;
        for n in &a.notes {
            writeln!(out, "                     {n}")?;
        }
    }
    if let Some(o) = &report.oom {
        print_oom(o, &mut *out)?;
        if let Some(l) = &report.ledger_at_oom {
            let outside: u64 =
                l.sources.iter().filter(|s| s.source != "pytorch_reserved" && s.source != "other_processes").map(|s| s.bytes).sum::<u64>()
                    + l.unexplained_bytes.unwrap_or(0).max(0) as u64;
            writeln!(
                out,
                "  outside PyTorch   {} of the device at the error: {} (`collector ledger --at oom`)",
                format_bytes(outside),
                l.line()
            )?;
        }
    }
    let at = |t: f64| format_seconds(t);
    writeln!(
        out,
        "  peak allocated     {} ({} bytes) at {}{}",
        format_bytes(s.peak_allocated_bytes),
        s.peak_allocated_bytes,
        at(s.peak_time_s),
        // "at 1.2 s in blocks.0", "at 1.2 s, at train.py:40 in step"
        s.peak_layer.as_deref().map(|l| format!("{} {}", if is_source_layer(l) { "," } else { "" }, layer_place(l))).unwrap_or_default()
    )?;
    let unknown = s.peak_device.as_deref().is_some_and(|p| {
        trace.meta.reserved_unknown.iter().any(|&d| trace.devices.get(d as usize).is_some_and(|dev| dev.to_string() == p))
    });
    if s.reserved_not_applicable() {
        writeln!(out, "  peak reserved      n/a (the CPU allocator caches nothing)")?;
    } else if unknown {
        writeln!(out, "  peak reserved      unknown (the trace has no segments that hold its allocations; see the warnings)")?;
    } else {
        writeln!(
            out,
            "  peak reserved      {} ({} bytes) at {}",
            format_bytes(s.peak_reserved_bytes),
            s.peak_reserved_bytes,
            at(s.peak_reserved_time_s)
        )?;
    }
    writeln!(
        out,
        "  at end             {} allocated, {} reserved",
        format_bytes(s.final_allocated_bytes),
        if unknown { "unknown".to_owned() } else { format_bytes(s.final_reserved_bytes) }
    )?;
    if let Some(peak) = trace.meta.counter(shared::model::Counter::MaxMemoryAllocated) {
        let verdict = if peak == s.peak_allocated_bytes {
            "matches the trace".to_owned()
        } else {
            format!("the trace differs by {} bytes", s.peak_allocated_bytes as i128 - peak as i128)
        };
        writeln!(out, "  PyTorch counters   max_memory_allocated {peak} bytes: {verdict}")?;
        if let Some(r) = trace.meta.counter(shared::model::Counter::MaxMemoryReserved) {
            writeln!(out, "                     max_memory_reserved {r} bytes")?;
        }
    }
    if let Some(used) = report.driver_used_peak_bytes {
        writeln!(
            out,
            "  driver used        up to {} on the device ({} samples; CUDA context, libraries and other processes included)",
            format_bytes(used),
            trace.device_samples.len()
        )?;
    }
    if let Some(l) = &report.ledger_at_peak {
        writeln!(out, "  device at peak     {} (`collector ledger`)", l.line())?;
    }
    Ok(())
}

/// The rest of the run: leaks, each device's peaks, fragmentation, counts and notes.
fn print_run(trace: &Trace, report: &TraceReport, out: &mut dyn Write) -> anyhow::Result<()> {
    let (s, leaks) = (&report.summary, &report.leaks);
    let at = |t: f64| format_seconds(t);
    if leaks.iterations >= shared::analysis::leaks::MIN_ITERATIONS {
        writeln!(out, "  leaks              {}", leaks.verdict)?;
        if leaks.leaking {
            for g in &leaks.survivors {
                writeln!(
                    out,
                    "                     kept in {} ({} per iteration, {} iterations)",
                    g.layer,
                    format_bytes(g.bytes_per_iteration as u64),
                    g.iterations
                )?;
            }
            writeln!(out, "                     see `collector leaks`")?;
        }
    }
    if trace.devices.len() > 1 {
        for d in &report.devices {
            writeln!(
                out,
                "  {:<18} peak {} allocated at {}, {} reserved ({} events)",
                d.device,
                format_bytes(d.peak_allocated_bytes),
                at(d.peak_time_s),
                format_bytes(d.peak_reserved_bytes),
                d.events
            )?;
        }
    }
    if trace.meta.fragmentation_tracked {
        writeln!(out, "  avg fragmentation  {:.1} %", s.avg_fragmentation * 100.0)?;
    } else {
        writeln!(out, "  avg fragmentation  not tracked (--no-fragmentation)")?;
    }
    writeln!(
        out,
        "  events             {} ({} allocations, {} frees), {} ops, {} layers, {} dropped, {}",
        s.total_events,
        s.total_allocations,
        s.total_deallocations,
        s.total_ops,
        s.total_layers,
        s.dropped_events,
        at(s.duration_s)
    )?;
    // A snapshot without entries says why in its own notes.
    if s.total_events == 0 && trace.meta.source_format != shared::model::SourceFormat::PytorchSnapshot {
        writeln!(
            out,
            "  note: this trace has no memory events (only spans); the layer times below are real, the memory columns are empty"
        )?;
    }
    for w in &trace.meta.warnings {
        writeln!(out, "  note: {w}")?;
    }
    Ok(())
}

/// The table of the layers with the highest peaks.
fn print_top_layers(trace: &Trace, tops: &[&LayerMemoryStats], out: &mut dyn Write) -> anyhow::Result<()> {
    if !tops.is_empty() {
        writeln!(out, "\nTop layers by peak allocated:")?;
        let compiled = |name: &str| trace.meta.compiled.as_ref().is_some_and(|c| c.modules.iter().any(|m| m == name));
        let width =
            tops.iter().map(|l| l.layer_name.chars().count() + usize::from(compiled(&l.layer_name))).max().unwrap_or(5).clamp(5, 60);
        writeln!(
            out,
            "  {:<width$}  {:>12}  {:>12}  {:>7}  {:>7}  {:>6}  {:>10}",
            "layer", "peak alloc", "peak resv", "allocs", "frees", "frag", "time"
        )?;
        for l in tops {
            let mut name: String = l.layer_name.chars().take(width).collect();
            if compiled(&l.layer_name) {
                // Its allocations include compiled code's (the summary's "compiled code" line).
                name = format!("{}*", name.chars().take(width - 1).collect::<String>());
            }
            writeln!(
                out,
                "  {:<width$}  {:>12}  {:>12}  {:>7}  {:>7}  {:>5.1}%  {:>10}",
                name,
                format_bytes(l.peak_allocated),
                format_bytes(l.peak_reserved),
                l.total_allocations,
                l.total_deallocations,
                l.avg_fragmentation * 100.0,
                format_seconds(l.duration_ms / 1000.0)
            )?;
        }
        if let Some(why) = trace.meta.lines_unnamed.as_deref().filter(|_| tops.iter().any(|l| l.layer_name == "unattributed")) {
            writeln!(out, "  unattributed: allocations outside every module, not named by their lines ({why})")?;
        }
        if tops.iter().any(|l| compiled(&l.layer_name)) {
            writeln!(out, "  * includes allocations of torch.compile'd code, attributed by its FX nodes' modules")?;
        }
        // Bytes a CUDA graph keeps for its replays (or a torch.cuda.MemPool): its pool's.
        let pooled: Vec<String> = tops
            .iter()
            .filter(|l| l.private_pool_bytes > 0)
            .map(|l| format!("{} {} of {}", l.layer_name, format_bytes(l.private_pool_bytes), format_bytes(l.allocated_bytes_total)))
            .collect();
        if !pooled.is_empty() {
            writeln!(out, "  allocated in private pools (CUDA graphs' memory, MemPools): {}", pooled.join(", "))?;
        }
    }
    Ok(())
}

/// The leak report as text.
pub fn print_leaks(r: &shared::analysis::leaks::LeakReport, mut out: impl Write) -> anyhow::Result<()> {
    writeln!(out, "Leaks on {} ({} iterations from {}, {} as warm-up)", r.device, r.iterations, r.iterations_from, r.warmup)?;
    writeln!(out, "  {}", r.verdict)?;
    if !r.allocated_at_end_bytes.is_empty() {
        let ends: Vec<String> = r.allocated_at_end_bytes.iter().map(|&b| format_bytes(b)).collect();
        writeln!(out, "  allocated at iteration ends: {}", ends.join(", "))?;
    }
    if !r.survivors.is_empty() {
        writeln!(out, "  never freed, born after warm-up (layer, operator, frame: bytes in allocations over iterations):")?;
        for g in &r.survivors {
            writeln!(
                out,
                "    {}{}{}: {} in {} over {} iteration(s), {} per iteration{}",
                g.layer,
                g.op.as_deref().map(|o| format!(" in {o}")).unwrap_or_default(),
                g.frame.as_deref().map(|f| format!(" at {f}")).unwrap_or_default(),
                format_bytes(g.bytes),
                g.allocations,
                g.iterations,
                format_bytes(g.bytes_per_iteration as u64),
                g.holder.as_deref().map(|h| format!("; held by {h}")).unwrap_or_default()
            )?;
        }
    }
    Ok(())
}

/// Signed bytes: `+2.00 MiB`, `-512 B`, `0 B`.
fn format_delta(bytes: i64) -> String {
    let sign = match bytes.signum() {
        1 => "+",
        -1 => "-",
        _ => "",
    };
    format!("{sign}{}", format_bytes(bytes.unsigned_abs()))
}

/// Where a side's peak falls: `0.309 s (iteration 1 at 69 %)`.
fn peak_when(s: &shared::analysis::diff::SideFacts) -> String {
    match &s.peak_in_iteration {
        Some(p) => format!("{} (iteration {} at {:.0} %)", format_seconds(s.peak_time_s), p.iteration, p.fraction * 100.0),
        None => format_seconds(s.peak_time_s),
    }
}

/// The trace diff as text: both sides' peaks and the change, then the top layers by change,
/// the classes, the operators on one side only and the notes.
pub fn print_diff(
    d: &shared::analysis::diff::TraceDiff,
    (label_a, label_b): (&str, &str),
    top: usize,
    mut out: impl Write,
) -> anyhow::Result<()> {
    writeln!(out, "Diff: A = {label_a}, B = {label_b}")?;
    let row = |out: &mut dyn Write, what: &str, a: String, b: String, delta: String| writeln!(out, "  {what:<18} {a:<34} {b:<34} {delta}");
    row(&mut out, "", "A".into(), "B".into(), "B - A".into())?;
    let (a, b) = (&d.a, &d.b);
    let device = |s: &shared::analysis::diff::SideFacts| format!("{} ({})", s.device.as_deref().unwrap_or("no device"), s.source_format);
    row(&mut out, "device", device(a), device(b), String::new())?;
    if a.model.is_some() || b.model.is_some() {
        row(&mut out, "model", a.model.clone().unwrap_or_default(), b.model.clone().unwrap_or_default(), String::new())?;
    }
    row(
        &mut out,
        "peak allocated",
        format_bytes(a.peak_allocated_bytes),
        format_bytes(b.peak_allocated_bytes),
        format_delta(d.peak_allocated_delta_bytes),
    )?;
    row(
        &mut out,
        "peak reserved",
        format_bytes(a.peak_reserved_bytes),
        format_bytes(b.peak_reserved_bytes),
        format_delta(d.peak_reserved_delta_bytes),
    )?;
    row(&mut out, "peak at", peak_when(a), peak_when(b), String::new())?;
    let its = |s: &shared::analysis::diff::SideFacts| format!("{} ({})", s.iterations, s.iterations_from);
    row(&mut out, "iterations", its(a), its(b), String::new())?;
    let frag =
        |s: &shared::analysis::diff::SideFacts| format!("{:.1} % (max {:.1} %)", s.avg_fragmentation * 100.0, s.max_fragmentation * 100.0);
    row(&mut out, "fragmentation", frag(a), frag(b), String::new())?;
    row(&mut out, "events, operators", format!("{}, {}", a.events, a.ops), format!("{}, {}", b.events, b.ops), String::new())?;
    print_diff_layers(d, top, &mut out)?;
    print_diff_classes(&d.classes, &mut out)?;
    print_diff_categories(&d.categories, &mut out)?;
    if let Some(ops) = &d.ops {
        for (side, list) in [("A", &ops.only_in_a), ("B", &ops.only_in_b)] {
            let names: Vec<String> = list.iter().take(top).map(|o| format!("{} x{}", o.name, o.count)).collect();
            let more = if list.len() > top { format!(", and {} more", list.len() - top) } else { String::new() };
            writeln!(
                out,
                "Operators only in {side} ({}): {}{more}",
                list.len(),
                if names.is_empty() { "none".to_owned() } else { names.join(", ") }
            )?;
        }
    }
    if !d.notes.is_empty() {
        writeln!(out, "Notes:")?;
        for n in &d.notes {
            writeln!(out, "  - {n}")?;
        }
    }
    Ok(())
}

fn print_diff_layers(d: &shared::analysis::diff::TraceDiff, top: usize, out: &mut dyn Write) -> anyhow::Result<()> {
    use shared::analysis::diff::Presence;
    if d.layers.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "Layers by change of peak (top {} of {}; peak = allocated total at the layer's events):",
        top.min(d.layers.len()),
        d.layers.len()
    )?;
    let width = d.layers.iter().take(top).map(|l| l.layer_name.chars().count()).max().unwrap_or(5).clamp(5, 60);
    writeln!(out, "  {:<width$}  {:>12}  {:>12}  {:>13}  {:>10}  {:>10}", "layer", "peak A", "peak B", "change", "allocs A", "allocs B")?;
    let side = |s: Option<shared::analysis::diff::LayerSide>, f: fn(shared::analysis::diff::LayerSide) -> String| {
        s.map_or_else(|| "-".to_owned(), f)
    };
    for l in d.layers.iter().take(top) {
        let flag = match l.presence {
            Presence::Both => "",
            Presence::OnlyA => "  only in A",
            Presence::OnlyB => "  only in B",
        };
        writeln!(
            out,
            "  {:<width$}  {:>12}  {:>12}  {:>13}  {:>10}  {:>10}{flag}",
            l.layer_name,
            side(l.a, |x| format_bytes(x.peak_allocated_bytes)),
            side(l.b, |x| format_bytes(x.peak_allocated_bytes)),
            format_delta(l.peak_delta_bytes),
            side(l.a, |x| x.allocations.to_string()),
            side(l.b, |x| x.allocations.to_string()),
        )?;
    }
    Ok(())
}

/// One row of bytes on both sides and their difference.
fn diff_row(out: &mut dyn Write, name: &str, a: u64, b: u64, delta: i64) -> anyhow::Result<()> {
    writeln!(out, "  {name:<18} {:>12}  {:>12}  {:>13}", format_bytes(a), format_bytes(b), format_delta(delta))?;
    Ok(())
}

/// Bytes per allocation category at each side's peak, where either side has any.
fn print_diff_categories(rows: &[shared::analysis::diff::CategoryRow], out: &mut dyn Write) -> anyhow::Result<()> {
    if rows.iter().all(|r| r.a_bytes == 0 && r.b_bytes == 0) {
        return Ok(());
    }
    writeln!(out, "Categories at each side's peak:")?;
    for r in rows.iter().filter(|r| r.a_bytes > 0 || r.b_bytes > 0) {
        let name = r.category.as_str().replace('_', " ");
        diff_row(out, &name, r.a_bytes, r.b_bytes, r.delta_bytes)?;
    }
    Ok(())
}

fn print_diff_classes(c: &shared::analysis::diff::ClassesDiff, out: &mut dyn Write) -> anyhow::Result<()> {
    use shared::analysis::diff::ClassSide;
    if c.rows.is_empty() {
        writeln!(out, "Classes: not compared")?;
        for (side, s) in [("A", &c.a), ("B", &c.b)] {
            if let ClassSide::Unavailable { reason } = s {
                writeln!(out, "  {side}: {reason}")?;
            }
        }
        return Ok(());
    }
    let at = |s: &ClassSide| match s {
        ClassSide::Available { rank, node_name, total_allocated_bytes, .. } => {
            format!("{} at rank {rank} ({node_name})", format_bytes(*total_allocated_bytes))
        }
        ClassSide::Unavailable { .. } => String::new(),
    };
    writeln!(out, "Classes at each side's peak rank (A: {}; B: {}):", at(&c.a), at(&c.b))?;
    for r in &c.rows {
        let name = match r.class {
            shared::analysis::profile::TensorClass::Param => "weights",
            shared::analysis::profile::TensorClass::Grad => "gradients",
            shared::analysis::profile::TensorClass::OptState => "optimizer state",
            shared::analysis::profile::TensorClass::Act => "activations",
            shared::analysis::profile::TensorClass::Other => "other",
        };
        diff_row(out, name, r.a_bytes, r.b_bytes, r.delta_bytes)?;
    }
    Ok(())
}

/// `collector trace --progress-json`: one JSON object per line on stdout.
pub fn emit(line: &protocol::ChildLine) {
    let _ = emit_to(&mut std::io::stdout().lock(), line);
}

/// Writes `line` and its newline to `out` in one write: the traced program shares stdout, and
/// a line written in pieces (stdout flushes every 1 KiB of a longer one) could take the
/// program's output in between, leaving neither line readable.
fn emit_to(out: &mut impl Write, line: &protocol::ChildLine) -> std::io::Result<()> {
    let mut text = serde_json::to_vec(line)?;
    text.push(b'\n');
    out.write_all(&text)?;
    out.flush()
}

/// `collector check`'s report: one line per budget, then what was at the peak.
pub fn print_budget(r: &shared::analysis::budget::BudgetReport, trace: &str, mut out: impl Write) -> anyhow::Result<()> {
    writeln!(out, "{}: {}", if r.passed { "PASS" } else { "FAIL" }, trace)?;
    for c in &r.checks {
        writeln!(out, "  {} {:<15} {}  (limit {})", if c.passed { "ok  " } else { "FAIL" }, c.name, c.actual, c.limit)?;
    }
    let at = r.peak_layer.as_deref().map(|l| format!(" {}", layer_place(l))).unwrap_or_default();
    let device = r.device.as_deref().map(|d| format!(" on {d}")).unwrap_or_default();
    writeln!(
        out,
        "  peak allocated {} at {}{at}{device}; peak reserved {}",
        format_bytes(r.peak_allocated_bytes),
        format_seconds(r.peak_time_s),
        format_bytes(r.peak_reserved_bytes)
    )?;
    Ok(())
}

/// GitHub Actions workflow commands: an `::error` annotation per failed budget.
pub fn print_github_annotations(r: &shared::analysis::budget::BudgetReport, trace: &str, mut out: impl Write) -> anyhow::Result<()> {
    // Workflow commands end at a newline and treat `%`, `\r`, `\n` specially.
    let escape = |s: &str| s.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A");
    for c in r.checks.iter().filter(|c| !c.passed) {
        let at = r.peak_layer.as_deref().map(|l| format!(", peak {}", layer_place(l))).unwrap_or_default();
        let message = format!("{}: {} over the limit {}{at} ({trace})", c.name, c.actual, c.limit);
        writeln!(out, "::error title=Memory budget::{}", escape(&message))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each write that reaches the file descriptor, as stdout's line buffer passes them on.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl Write for Writes {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A progress line longer than stdout's 1 KiB line buffer reaches the descriptor in one
    /// write, whole and ending its line, so the traced program's output cannot split it.
    #[test]
    fn a_long_progress_line_is_one_write() {
        let points: Vec<[u64; 3]> = (0..200u64).map(|i| [i * 1_000_000, i << 20, i << 21]).collect();
        let line = protocol::ChildLine::Memory { points: points.clone(), rank: Some(3) };
        let mut out = std::io::LineWriter::with_capacity(1024, Writes::default());
        emit_to(&mut out, &line).unwrap_or_else(|e| panic!("{e}"));
        let writes = out.into_inner().unwrap_or_else(|e| panic!("{e}")).0;
        assert_eq!(writes.len(), 1, "{} writes", writes.len());
        let text = String::from_utf8(writes[0].clone()).unwrap_or_else(|e| panic!("{e}"));
        assert!(text.len() > 4096 && text.ends_with('\n') && text.matches('\n').count() == 1, "{} bytes", text.len());
        let back: protocol::ChildLine = serde_json::from_str(text.trim_end()).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(back, protocol::ChildLine::Memory { points: p, rank: Some(3) } if p == points));
    }

    fn summary_text(trace: &Trace) -> String {
        let mut out = Vec::new();
        print_summary(trace, 3, false, &mut out).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&out).into_owned()
    }

    /// A snapshot whose segments cannot hold its allocations says its reserved memory is
    /// unknown; a trace with no device at all says nothing of the kind.
    #[test]
    fn reserved_memory_is_unknown_only_where_the_trace_says_so() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/dropped_frees.pickle.gz");
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{e}"));
        let trace = shared::import(&bytes, &shared::ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let text = summary_text(&trace);
        assert!(text.contains("peak reserved      unknown") && text.contains("allocated, unknown reserved"), "{text}");
        let empty = Trace::new(shared::model::TraceMeta::new(shared::model::SourceFormat::MemoryTracer));
        assert!(!summary_text(&empty).contains("reserved      unknown"), "{}", summary_text(&empty));
    }
}
