//! The memory timeline (allocated, reserved, phases, marks, the zoomed window) and the
//! fragmentation chart below it.

use super::{area, draw_mesh, err, font, steps, window_chart, Mapping, Palette, Res, TickedAxis};
use plotters::prelude::*;
use shared::analysis::ledger::LedgerBands;
use shared::analysis::TimelinePoint;
use shared::explore::Band;
use shared::units::format_seconds;
use web_sys::HtmlCanvasElement;

/// Colours of the device ledger's sources, in stacking order (a source's colour by its place).
const SOURCE_COLOURS: [RGBColor; 10] = [
    RGBColor(0x8a, 0x93, 0xa3),
    RGBColor(0x3f, 0xb9, 0x8a),
    RGBColor(0xe0, 0x6c, 0x75),
    RGBColor(0x56, 0xb6, 0xc2),
    RGBColor(0xc6, 0x9b, 0x2e),
    RGBColor(0x98, 0x7c, 0xd8),
    RGBColor(0xd1, 0x8f, 0x5a),
    RGBColor(0x6f, 0x9f, 0x3f),
    RGBColor(0xc7, 0x6b, 0xb0),
    RGBColor(0x4a, 0x78, 0xc0),
];

/// The memory timeline: allocated (max per bucket, filled), reserved, driver-used, the device
/// ledger's sources outside PyTorch stacked above its reserved bytes with NVML's count for the
/// process, phase and layer bands along the top, and a marker at `selected`.
#[allow(clippy::too_many_arguments)]
pub fn draw_timeline(
    canvas: &HtmlCanvasElement,
    pal: &Palette,
    window: (f64, f64),
    points: &[TimelinePoint],
    driver: &[(f64, u64)],
    ledger: &LedgerBands,
    phase_bands: &[Band],
    layer_bands: &[Band],
    selected: Option<f64>,
) -> Res<Mapping> {
    let root = area(canvas, pal)?;
    let stacked =
        |i: usize| points[i].reserved_last_bytes + ledger.sources.iter().map(|(_, b)| b.get(i).copied().unwrap_or(0)).sum::<u64>();
    let top = points
        .iter()
        .map(|p| p.reserved_max_bytes.max(p.allocated_max_bytes))
        .chain(driver.iter().map(|d| d.1))
        .chain(ledger.nvml.iter().map(|d| d.1))
        .chain((0..points.len()).map(stacked))
        .max()
        .unwrap_or(0);
    let (mut chart, mapping, ymax) = window_chart(&root, pal, window, top, 34)?;
    let (t0, t1) = mapping.x;
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let px_per_s = (xr.end - xr.start) as f64 / (t1 - t0);
    // Bands above the plot: phases, then layers with their names where they fit.
    // A band narrower than a pixel is drawn one pixel wide, once per pixel: a long run holds
    // thousands of layer calls (9 062 in a 57.5 MB snapshot's), and drawing each took 12 ms
    // of every frame of the whole trace.
    let band_row = |bands: &[Band], row: i32, labels: bool| -> Res<()> {
        let mut drawn_to = i32::MIN;
        for b in bands.iter().filter(|b| b.end_s >= t0 && b.start_s <= t1) {
            let x0 = xr.start + ((b.start_s.max(t0) - t0) * px_per_s) as i32;
            let x1 = xr.start + ((b.end_s.min(t1) - t0) * px_per_s) as i32;
            if x1 - x0 < 1 && (!labels || x0 < drawn_to) {
                continue;
            }
            drawn_to = drawn_to.max(x1.max(x0 + 1));
            let y = yr.start - 30 + row * 14;
            let colour = if labels { pal.allocated.mix(0.25) } else { pal.phase(b.phase).mix(0.8) };
            root.draw(&Rectangle::new([(x0, y), (x1.max(x0 + 1), y + 12)], colour.filled())).map_err(err)?;
            if labels && x1 - x0 > 40 {
                let max_chars = ((x1 - x0 - 4) / 7).max(0) as usize;
                let text: String = b.label.chars().take(max_chars).collect();
                root.draw(&Text::new(text, (x0 + 2, y), font(pal, 11))).map_err(err)?;
            }
        }
        Ok(())
    };
    band_row(phase_bands, 0, false)?;
    band_row(layer_bands, 1, true)?;
    let mut legend = vec![("allocated".to_owned(), pal.allocated), ("reserved".to_owned(), pal.reserved)];
    // The ledger's sources, each a band from the one below it up by its bytes, as steps.
    let mut lower: Vec<f64> = points.iter().map(|p| p.reserved_last_bytes as f64).collect();
    let next = |i: usize| points.get(i + 1).map_or(t1, |n| n.t_s);
    for (k, (name, bytes)) in ledger.sources.iter().enumerate() {
        if bytes.len() != points.len() || bytes.iter().all(|&b| b == 0) {
            continue;
        }
        let upper: Vec<f64> = lower.iter().zip(bytes).map(|(l, &b)| l + b as f64).collect();
        let mut outline: Vec<(f64, f64)> = (0..points.len()).flat_map(|i| [(points[i].t_s, upper[i]), (next(i), upper[i])]).collect();
        outline.extend((0..points.len()).rev().flat_map(|i| [(next(i), lower[i]), (points[i].t_s, lower[i])]));
        let colour = SOURCE_COLOURS[k % SOURCE_COLOURS.len()];
        chart.draw_series(std::iter::once(Polygon::new(outline, colour.mix(0.45).filled()))).map_err(err)?;
        legend.push((name.clone(), colour));
        lower = upper;
    }
    if !points.is_empty() {
        chart
            .draw_series(
                AreaSeries::new(steps(points, t1, |p| (p.allocated_max_bytes, p.allocated_last_bytes)), 0.0, pal.allocated.mix(0.25))
                    .border_style(pal.allocated),
            )
            .map_err(err)?;
        chart
            .draw_series(LineSeries::new(
                steps(points, t1, |p| (p.reserved_max_bytes, p.reserved_last_bytes)),
                pal.reserved.stroke_width(2),
            ))
            .map_err(err)?;
    }
    if !driver.is_empty() {
        chart.draw_series(LineSeries::new(driver.iter().map(|&(t, b)| (t, b as f64)), pal.driver.stroke_width(1))).map_err(err)?;
        legend.push(("driver used".into(), pal.driver));
    }
    if !ledger.nvml.is_empty() {
        let dots = ledger.nvml.iter().map(|&(t, b)| Circle::new((t, b as f64), 2, pal.text.filled()));
        chart.draw_series(dots).map_err(err)?;
        legend.push(("NVML (this process)".into(), pal.text));
    }
    if let Some(t) = selected.filter(|t| *t >= t0 && *t <= t1) {
        chart.draw_series(LineSeries::new([(t, 0.0), (t, ymax)], pal.highlight.stroke_width(1))).map_err(err)?;
    }
    // Legend, drawn by hand so it reads in both themes; a row is full at the plot's right.
    let (mut x, mut y) = (xr.start + 8, yr.start + 8);
    for (name, colour) in legend {
        let width = 24 + 7 * name.len() as i32;
        if x + width > xr.end && x > xr.start + 8 {
            (x, y) = (xr.start + 8, y + 16);
        }
        root.draw(&Rectangle::new([(x, y), (x + 12, y + 10)], colour.filled())).map_err(err)?;
        root.draw(&Text::new(name, (x + 16, y - 2), font(pal, 12))).map_err(err)?;
        x += width;
    }
    root.present().map_err(err)?;
    Ok(mapping)
}

/// Fragmentation, (reserved − allocated) / reserved after each bucket.
pub fn draw_fragmentation(canvas: &HtmlCanvasElement, pal: &Palette, window: (f64, f64), points: &[TimelinePoint]) -> Res<Mapping> {
    let root = area(canvas, pal)?;
    let (t0, t1) = (window.0, window.1.max(window.0 + 1e-9));
    let mut chart = ChartBuilder::on(&root)
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(78)
        .build_cartesian_2d(t0..t1, TickedAxis::new(1.0, vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]))
        .map_err(err)?;
    draw_mesh(&mut chart, pal, (8, 5), &|v| format_seconds(*v), &|v| format!("{:.0} %", v * 100.0), None)?;
    let frag = |p: &TimelinePoint| {
        shared::model::Totals { allocated_bytes: p.allocated_last_bytes, reserved_bytes: p.reserved_last_bytes }.fragmentation_ratio()
    };
    chart
        .draw_series(AreaSeries::new(points.iter().map(|p| (p.t_s, frag(p))), 0.0, pal.reserved.mix(0.25)).border_style(pal.reserved))
        .map_err(err)?;
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    root.present().map_err(err)?;
    Ok(Mapping { px: (xr.start as f64, xr.end as f64), py: (yr.start as f64, yr.end as f64), x: (t0, t1) })
}
