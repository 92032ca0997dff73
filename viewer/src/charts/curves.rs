//! Curves against rank or time: the graph profile's memory by operator, ranks side by side,
//! private pools, two traces compared.

use super::{area, draw_mesh, err, font, held_steps, Chart, Mapping, Palette, Res, TickedAxis};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters_canvas::CanvasBackend;
use shared::analysis::diff::{Alignment, DiffCurves};
use shared::analysis::profile::GraphProfile;
use shared::explore::{Curve, RankCurve};
use shared::units::{byte_ticks, format_bytes, format_seconds};
use web_sys::HtmlCanvasElement;

/// Memory per rank: the profile's peak and active curves with section shading and the peak
/// marked, and any overlaid curves (a batch sweep).
pub fn draw_rank(canvas: &HtmlCanvasElement, pal: &Palette, profile: Option<&GraphProfile>, curves: &[Curve]) -> Res<Mapping> {
    let root = area(canvas, pal)?;
    let n = profile.map(|p| p.nodes.len()).into_iter().chain(curves.iter().map(|c| c.points.len())).max().unwrap_or(0).max(1) as f64;
    let yt = byte_ticks(
        profile
            .map(|p| p.peak_bytes)
            .into_iter()
            .chain(curves.iter().flat_map(|c| c.points.iter().map(|p| p.peak_bytes)))
            .max()
            .unwrap_or(0) as f64
            * 1.02,
        6,
    );
    let ymax = yt.end;
    let mut chart = ChartBuilder::on(&root)
        .margin(8)
        .margin_top(16)
        // Tick labels and the axis description below them (28 put one over the other).
        .x_label_area_size(44)
        .y_label_area_size(78)
        .build_cartesian_2d(0f64..n, TickedAxis::new(ymax, yt.ticks.clone()))
        .map_err(err)?;
    draw_mesh(&mut chart, pal, (10, 6), &|v| format!("{v:.0}"), &|v| yt.label(*v), Some("rank (operator order in the iteration)"))?;
    if let Some(p) = profile {
        let s = &p.sections;
        let end = p.nodes.len();
        let mut sections = Vec::new();
        if let Some(f) = s.forward_start_rank {
            sections.push((f, s.backward_start_rank.or(s.optimizer_start_rank).unwrap_or(end), pal.forward));
        }
        if let Some(b) = s.backward_start_rank {
            sections.push((b, s.optimizer_start_rank.unwrap_or(end), pal.backward));
        }
        if let Some(o) = s.optimizer_start_rank {
            sections.push((o, s.optimizer_end_rank.map_or(end, |e| e + 1), pal.optimizer));
        }
        chart
            .draw_series(sections.into_iter().map(|(a, b, c)| Rectangle::new([(a as f64, 0.0), (b as f64, ymax)], c.mix(0.12).filled())))
            .map_err(err)?;
        chart
            .draw_series(LineSeries::new(
                p.nodes.iter().map(|nd| (nd.rank as f64, nd.median_active_mem_bytes as f64)),
                pal.reserved.stroke_width(1),
            ))
            .map_err(err)?;
        chart
            .draw_series(LineSeries::new(
                p.nodes.iter().map(|nd| (nd.rank as f64, nd.median_peak_mem_bytes as f64)),
                pal.allocated.stroke_width(2),
            ))
            .map_err(err)?;
        let peak = (p.peak_rank as f64, p.peak_bytes as f64);
        chart.draw_series([Circle::new(peak, 5, pal.highlight.filled())]).map_err(err)?;
        let label = format!("peak {} at rank {}", format_bytes(p.peak_bytes), p.peak_rank);
        // Above the marker, clear of the curve it marks: left of it when it is far right.
        let (anchor, h) = if p.peak_rank as f64 > n * 0.6 { (peak.0 - n * 0.01, HPos::Right) } else { (peak.0 + n * 0.01, HPos::Left) };
        let style = font(pal, 12).pos(Pos::new(h, VPos::Bottom));
        chart.draw_series([Text::new(label, (anchor.max(0.0), peak.1 + ymax * 0.02), style)]).map_err(err)?;
    }
    let colours = [pal.allocated, pal.reserved, pal.forward, pal.backward, pal.driver, pal.optimizer, pal.highlight];
    for (i, c) in curves.iter().enumerate() {
        let colour = colours[i % colours.len()];
        chart
            .draw_series(LineSeries::new(c.points.iter().map(|p| (p.rank as f64, p.peak_bytes as f64)), colour.stroke_width(2)))
            .map_err(err)?;
    }
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    // Legend.
    let mut y = yr.start + 6;
    let mut legend: Vec<(String, RGBColor)> = Vec::new();
    if profile.is_some() {
        legend.push(("peak during the node".into(), pal.allocated));
        legend.push(("allocated before the node".into(), pal.reserved));
    }
    legend.extend(curves.iter().enumerate().map(|(i, c)| (c.label.clone(), colours[i % colours.len()])));
    for (name, colour) in legend {
        root.draw(&Rectangle::new([(xr.start + 8, y + 2), (xr.start + 20, y + 12)], colour.filled())).map_err(err)?;
        root.draw(&Text::new(name, (xr.start + 24, y), font(pal, 12))).map_err(err)?;
        y += 16;
    }
    root.present().map_err(err)?;
    Ok(Mapping { px: (xr.start as f64, xr.end as f64), py: (yr.start as f64, yr.end as f64), x: (0.0, n) })
}

/// The Ranks view's small multiples: one allocated-memory panel per rank's device, stacked,
/// every panel on the same time axis (0 to `end_s`, the merged trace) and the same byte
/// scale, so heights and moments compare at a glance. The panel of device `highest` (the
/// highest peak) is drawn in the highlight colour, its peak marked. Returns each panel's
/// mapping, top to bottom.
pub fn draw_rank_curves(canvas: &HtmlCanvasElement, pal: &Palette, end_s: f64, curves: &[RankCurve], highest: u8) -> Res<Vec<Mapping>> {
    let root = area(canvas, pal)?;
    let top = curves.iter().flat_map(|c| c.points.iter().map(|p| p.allocated_max_bytes)).max().unwrap_or(0);
    let yt = byte_ticks(top as f64 * 1.02, 3);
    let t1 = end_s.max(1e-9);
    let panels = root.split_evenly((curves.len().max(1), 1));
    let mut mappings = Vec::with_capacity(curves.len());
    for (c, panel) in curves.iter().zip(&panels) {
        let marked = c.device_index == highest;
        let colour = if marked { pal.highlight } else { pal.allocated };
        let mut chart = small_multiple(panel, pal, t1, &yt, 3)?;
        let peak = c.points.iter().reduce(|best, p| if p.allocated_max_bytes > best.allocated_max_bytes { p } else { best });
        if !c.points.is_empty() {
            let series = held_steps(&c.points, t1);
            chart.draw_series(AreaSeries::new(series, 0.0, colour.mix(0.25)).border_style(colour)).map_err(err)?;
        }
        let peak_bytes = peak.map_or(0, |p| p.allocated_max_bytes);
        let mut label = format!("rank {} · {} · peak {}", c.rank, c.device, format_bytes(peak_bytes));
        if marked {
            label.push_str(" · highest peak");
            if let Some(p) = peak {
                chart.draw_series([Circle::new((p.t_s, p.allocated_max_bytes as f64), 5, pal.highlight.filled())]).map_err(err)?;
            }
        }
        panel.draw(&Text::new(label, (84, 3), font(pal, 12).color(&colour))).map_err(err)?;
        let (xr, yr) = chart.plotting_area().get_pixel_range();
        mappings.push(Mapping { px: (xr.start as f64, xr.end as f64), py: (yr.start as f64, yr.end as f64), x: (0.0, t1) });
    }
    root.present().map_err(err)?;
    Ok(mappings)
}

/// One panel of small multiples over `0..t1` seconds, bytes on `yt`'s ticks, with its mesh.
fn small_multiple<'a>(
    panel: &'a DrawingArea<CanvasBackend, Shift>,
    pal: &Palette,
    t1: f64,
    yt: &shared::units::ByteTicks,
    y_labels: usize,
) -> Res<Chart<'a>> {
    let mut chart = ChartBuilder::on(panel)
        .margin(6)
        .margin_top(20)
        .x_label_area_size(22)
        .y_label_area_size(78)
        .build_cartesian_2d(0.0..t1, TickedAxis::new(yt.end, yt.ticks.clone()))
        .map_err(err)?;
    draw_mesh(&mut chart, pal, (8, y_labels), &|v| format_seconds(*v), &|v| yt.label(*v), None)?;
    Ok(chart)
}

/// The Pools view: one panel per (device, pool, stream) on the trace's time axis, each on its
/// own byte scale (a private pool is often far smaller than the default one): reserved as a
/// line, allocated as an area; private pools in the highlight colour.
pub fn draw_pool_curves(canvas: &HtmlCanvasElement, pal: &Palette, end_s: f64, curves: &[shared::analysis::pools::PoolCurve]) -> Res<()> {
    let root = area(canvas, pal)?;
    let t1 = end_s.max(1e-9);
    let panels = root.split_evenly((curves.len().max(1), 1));
    for (c, panel) in curves.iter().zip(&panels) {
        let top = c.peak_reserved_bytes.max(c.peak_allocated_bytes);
        let yt = byte_ticks(top as f64 * 1.05, 2);
        let colour = if c.private { pal.highlight } else { pal.allocated };
        let mut chart = small_multiple(panel, pal, t1, &yt, 2)?;
        if !c.points.is_empty() {
            chart.draw_series(AreaSeries::new(held_steps(&c.points, t1), 0.0, colour.mix(0.25)).border_style(colour)).map_err(err)?;
            let reserved = c.points.iter().enumerate().flat_map(|(i, p)| {
                let next = c.points.get(i + 1).map_or(t1, |n| n.t_s);
                [(p.t_s, p.reserved_max_bytes as f64), (next, p.reserved_last_bytes as f64)]
            });
            chart.draw_series(LineSeries::new(reserved, pal.reserved)).map_err(err)?;
        }
        let kind = if c.private { "private pool" } else { "default pool" };
        let label = format!(
            "{} · {kind} {} · stream {} · peak {} allocated, {} reserved",
            c.device,
            c.pool,
            c.stream,
            format_bytes(c.peak_allocated_bytes),
            format_bytes(c.peak_reserved_bytes)
        );
        panel.draw(&Text::new(label, (84, 3), font(pal, 12).color(&colour))).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// The Compare view's chart: A's and B's allocated memory (each bucket's maximum) on the
/// diff's aligned x axis, labelled by how it was aligned.
pub fn draw_diff_curves(canvas: &HtmlCanvasElement, pal: &Palette, curves: &DiffCurves, labels: (&str, &str)) -> Res<Mapping> {
    let root = area(canvas, pal)?;
    let xs = || curves.a.iter().chain(&curves.b).map(|p| p.x);
    let x0 = xs().fold(f64::INFINITY, f64::min);
    let x0 = if x0.is_finite() { x0 } else { 0.0 };
    let x1 = xs().fold(x0, f64::max).max(x0 + 1e-9);
    let top = curves.a.iter().chain(&curves.b).map(|p| p.allocated_max_bytes).max().unwrap_or(0);
    let yt = byte_ticks(top as f64 * 1.02, 6);
    let mut chart = ChartBuilder::on(&root)
        .margin(8)
        .margin_top(30)
        .x_label_area_size(44)
        .y_label_area_size(78)
        .build_cartesian_2d(x0..x1, TickedAxis::new(yt.end, yt.ticks.clone()))
        .map_err(err)?;
    let (x_fmt, x_desc): (&dyn Fn(&f64) -> String, &str) = match curves.alignment {
        Alignment::Iteration => (&|v| format!("{v:.1}"), "iteration (each iteration scaled to 1; below 0: before the first)"),
        Alignment::Seconds => (&|v| format_seconds(*v), "seconds since each trace's start"),
    };
    draw_mesh(&mut chart, pal, (10, 6), x_fmt, &|v| yt.label(*v), Some(x_desc))?;
    let sides = [(&curves.a, pal.allocated, labels.0, "A"), (&curves.b, pal.reserved, labels.1, "B")];
    for (points, colour, _, _) in sides {
        chart
            .draw_series(LineSeries::new(points.iter().map(|p| (p.x, p.allocated_max_bytes as f64)), colour.stroke_width(2)))
            .map_err(err)?;
    }
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let mut x = xr.start + 8;
    for (_, colour, name, side) in sides {
        let text = format!("{side}: {name}");
        root.draw(&Rectangle::new([(x, 10), (x + 12, 20)], colour.filled())).map_err(err)?;
        root.draw(&Text::new(text.clone(), (x + 16, 8), font(pal, 12))).map_err(err)?;
        x += 30 + 7 * text.chars().count() as i32;
    }
    root.present().map_err(err)?;
    Ok(Mapping { px: (xr.start as f64, xr.end as f64), py: (yr.start as f64, yr.end as f64), x: (x0, x1) })
}
