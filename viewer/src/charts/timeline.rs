//! The memory timeline (allocated, reserved, phases, marks, the zoomed window) and the
//! fragmentation chart below it.

use super::{area, draw_mesh, err, font, steps, window_chart, Mapping, Palette, Res, TickedAxis};
use plotters::prelude::*;
use shared::analysis::TimelinePoint;
use shared::explore::Band;
use shared::units::format_seconds;
use web_sys::HtmlCanvasElement;

/// The memory timeline: allocated (max per bucket, filled), reserved, driver-used, phase and
/// layer bands along the top, and a marker at `selected`.
#[allow(clippy::too_many_arguments)]
pub fn draw_timeline(
    canvas: &HtmlCanvasElement,
    pal: &Palette,
    window: (f64, f64),
    points: &[TimelinePoint],
    driver: &[(f64, u64)],
    phase_bands: &[Band],
    layer_bands: &[Band],
    selected: Option<f64>,
) -> Res<Mapping> {
    let root = area(canvas, pal)?;
    let top = points.iter().map(|p| p.reserved_max_bytes.max(p.allocated_max_bytes)).chain(driver.iter().map(|d| d.1)).max().unwrap_or(0);
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
    }
    if let Some(t) = selected.filter(|t| *t >= t0 && *t <= t1) {
        chart.draw_series(LineSeries::new([(t, 0.0), (t, ymax)], pal.highlight.stroke_width(1))).map_err(err)?;
    }
    // Legend, drawn by hand so it reads in both themes.
    let mut x = xr.start + 8;
    let mut legend = vec![("allocated", pal.allocated), ("reserved", pal.reserved)];
    if !driver.is_empty() {
        legend.push(("driver used", pal.driver));
    }
    for (name, colour) in legend {
        root.draw(&Rectangle::new([(x, yr.start + 8), (x + 12, yr.start + 18)], colour.filled())).map_err(err)?;
        root.draw(&Text::new(name, (x + 16, yr.start + 6), font(pal, 12))).map_err(err)?;
        x += 24 + 7 * name.len() as i32;
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
