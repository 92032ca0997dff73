//! `collector advise`'s text: the baseline, the rows every surface shows
//! ([`shared::analysis::advice::advice_rows`]) as a table, the changes with no effect here, each
//! change's reasoning, the checkpoint candidates, what is not available and the notes.

use shared::analysis::advice::{advice_rows, AdviceReport, AdviceRows, Measure};
use shared::model::layer_place;
use shared::units::{format_bytes, format_seconds};
use std::io::Write;

/// The advice as text: the baseline, a table of [`shared::analysis::advice::advice_rows`]
/// (suggestion | predicted peak of what runs out | vs measured | allocated | device total
/// with the ledger | extra time per iteration), the changes with no effect here, each change's
/// reasoning, the checkpoint candidates, what is not available and the notes.
pub fn print_advice(r: &AdviceReport, mut out: impl Write) -> anyhow::Result<()> {
    let b = &r.baseline;
    let at = if b.peak_layer.is_empty() {
        format!("in the {} phase", b.peak_phase.as_str())
    } else {
        format!("{} ({})", layer_place(&b.peak_layer), b.peak_phase.as_str())
    };
    writeln!(out, "Advice for {} ({})", b.device, b.source_format)?;
    writeln!(out, "  measured peak      {} ({} bytes) {at}", format_bytes(b.peak_allocated_bytes), b.peak_allocated_bytes)?;
    let rows = advice_rows(r);
    if rows.judged_by == Measure::Reserved {
        writeln!(
            out,
            "  reserved peak      {} ({} bytes): what runs out, what changes are judged by",
            format_bytes(b.peak_reserved_bytes),
            b.peak_reserved_bytes
        )?;
    }
    if let Some(o) = b.outside_pytorch_bytes {
        writeln!(out, "  outside PyTorch    {} (the ledger: CUDA context, libraries, kernels)", format_bytes(o))?;
    }
    if let Some(t) = b.iteration_time_s {
        writeln!(out, "  iteration time     {} (median of {} iterations)", format_seconds(t), b.iterations)?;
    }
    let parts: Vec<String> = [("weights", b.weights_bytes), ("gradients", b.gradients_bytes), ("optimizer state", b.optimizer_state_bytes)]
        .iter()
        .filter_map(|(n, v)| v.map(|v| format!("{n} {}", format_bytes(v))))
        .chain(b.operator_data.then(|| format!("activations at the peak {}", format_bytes(b.activations_at_peak_bytes))))
        .collect();
    if !parts.is_empty() {
        writeln!(out, "  memory             {}", parts.join(", "))?;
    }
    if let Some(budget) = r.budget_bytes {
        let met = match r.budget_met {
            Some(true) => "met by the suggestions marked *",
            _ => "not met by any suggestion",
        };
        writeln!(out, "  budget             {} ({budget} bytes): {met}", format_bytes(budget))?;
    }
    print_table(&rows, &mut out)?;
    if !rows.no_effect.is_empty() {
        let what = match rows.judged_by {
            Measure::Reserved => "the reserved peak",
            Measure::Allocated => "the peak",
        };
        writeln!(out)?;
        writeln!(out, "No effect here (saves nothing of {what} on this trace):")?;
        for row in &rows.no_effect {
            writeln!(out, "  - {}", row.line())?;
        }
    }
    if !rows.ranked.is_empty() || !rows.no_effect.is_empty() {
        writeln!(out)?;
        for (i, (row, s)) in rows.ranked.iter().zip(&r.suggestions).enumerate() {
            writeln!(out, "{:>3}. {} — {}", i + 1, s.kind.as_str(), row.change)?;
            writeln!(out, "     {}", row.reasoning)?;
        }
        for (row, s) in rows.no_effect.iter().zip(&r.no_effect) {
            writeln!(out, "  -  {} — {} (no effect here)", s.kind.as_str(), row.change)?;
            writeln!(out, "     {}", row.reasoning)?;
        }
    }
    if !r.checkpoint_candidates.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "Checkpoint candidates (activations a checkpoint drops: at the peak / per iteration; forward time = recompute cost):"
        )?;
        let w = r.checkpoint_candidates.iter().map(|c| c.layer.chars().count()).max().unwrap_or(0);
        for c in &r.checkpoint_candidates {
            writeln!(
                out,
                "  {:<w$}  {:>12} / {:>12}  {:>10}  recompute working set {}",
                c.layer,
                format_bytes(c.activation_bytes_at_peak),
                format_bytes(c.activation_bytes),
                format_seconds(c.forward_time_s),
                format_bytes(c.recompute_working_set_bytes)
            )?;
        }
    }
    for (title, list) in [("Not available", &r.not_available), ("Notes", &r.notes)] {
        if !list.is_empty() {
            writeln!(out)?;
            writeln!(out, "{title}:")?;
            for n in list {
                writeln!(out, "  - {n}")?;
            }
        }
    }
    Ok(())
}

/// The ranked rows as a table: suggestion | predicted peak | vs measured | allocated | device
/// total (with the ledger) | extra time per iteration.
fn print_table(rows: &AdviceRows, out: &mut impl Write) -> anyhow::Result<()> {
    if !rows.ranked.is_empty() {
        let table: Vec<Vec<String>> = rows
            .ranked
            .iter()
            .map(|row| {
                let mark = if row.meets_budget == Some(true) { "*" } else { " " };
                let mut cells = vec![
                    format!("{mark}{:>2}  {}", row.rank.unwrap_or(0), row.label),
                    row.peak_text.clone(),
                    row.saving_text.clone(),
                    row.allocated_text.clone(),
                ];
                if rows.device_total {
                    cells.push(row.device_total_text.clone().unwrap_or_default());
                }
                cells.push(row.extra_time_text.clone());
                cells
            })
            .collect();
        let mut header = vec!["     suggestion", "predicted peak", "vs measured", "allocated"];
        if rows.device_total {
            header.push("device total");
        }
        header.push("extra time/iter");
        let header: Vec<String> = header.into_iter().map(str::to_owned).collect();
        let width = |k: usize| table.iter().map(|r| r[k].chars().count()).chain([header[k].chars().count()]).max().unwrap_or(0);
        let widths: Vec<usize> = (0..header.len() - 1).map(width).collect();
        writeln!(out)?;
        for row in std::iter::once(&header).chain(&table) {
            let mut line = format!("{:<w$}", row[0], w = widths[0]);
            for k in 1..row.len() - 1 {
                line.push_str(&format!("  {:>w$}", row[k], w = widths[k]));
            }
            line.push_str(&format!("  {}", row[row.len() - 1]));
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}
