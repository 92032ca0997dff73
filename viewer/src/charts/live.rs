//! A live trace's charts: allocated and reserved so far, every rank overlaid, one rank small.

use super::{area, draw_mesh, err, Palette, Res, TickedAxis};
use plotters::prelude::*;
use shared::units::{byte_ticks, format_seconds};
use web_sys::HtmlCanvasElement;

/// A running trace's memory so far (`[ns, allocated, reserved]` points from
/// `collector serve`'s live events), drawn as steps; reserved only where the device has it.
pub fn draw_live(canvas: &HtmlCanvasElement, pal: &Palette, points: &[[u64; 3]]) -> Res<()> {
    let root = area(canvas, pal)?;
    let t1 = points.last().map_or(1.0, |p| p[0] as f64 / 1e9).max(1e-3);
    let yt = byte_ticks(points.iter().map(|p| p[1].max(p[2])).max().unwrap_or(0) as f64 * 1.02, 5);
    let ymax = yt.end;
    let mut chart = ChartBuilder::on(&root)
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(78)
        .build_cartesian_2d(0f64..t1, TickedAxis::new(ymax, yt.ticks.clone()))
        .map_err(err)?;
    draw_mesh(&mut chart, pal, (8, 5), &|v| format_seconds(*v), &|v| yt.label(*v), None)?;
    let step = |i: usize| live_steps(points, i);
    chart.draw_series(AreaSeries::new(step(1), 0.0, pal.allocated.mix(0.25)).border_style(pal.allocated)).map_err(err)?;
    if points.iter().any(|p| p[2] > 0) {
        chart.draw_series(LineSeries::new(step(2), pal.reserved.stroke_width(2))).map_err(err)?;
    }
    root.present().map_err(err)
}

/// The live chart of a torchrun job: each rank's allocated memory as its own line, on one
/// time axis and byte scale.
pub fn draw_live_ranks(canvas: &HtmlCanvasElement, pal: &Palette, ranks: &std::collections::BTreeMap<u32, Vec<[u64; 3]>>) -> Res<()> {
    let root = area(canvas, pal)?;
    let all = || ranks.values().flatten();
    let t1 = all().map(|p| p[0] as f64 / 1e9).fold(1e-3, f64::max);
    let yt = byte_ticks(all().map(|p| p[1]).max().unwrap_or(0) as f64 * 1.02, 5);
    let mut chart = ChartBuilder::on(&root)
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(78)
        .build_cartesian_2d(0f64..t1, TickedAxis::new(yt.end, yt.ticks.clone()))
        .map_err(err)?;
    draw_mesh(&mut chart, pal, (8, 5), &|v| format_seconds(*v), &|v| yt.label(*v), None)?;
    let colors = [pal.allocated, pal.reserved, pal.forward, pal.backward, pal.optimizer, pal.driver, pal.highlight];
    for (k, (rank, points)) in ranks.iter().enumerate() {
        let color = colors[k % colors.len()];
        let line = points.iter().map(|p| (p[0] as f64 / 1e9, p[1] as f64));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(err)?
            .label(format!("rank {rank}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(pal.background.mix(0.8))
        .border_style(pal.grid)
        .label_font(("sans-serif", 12).into_font().color(&pal.text))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// One rank's small multiple in the live view of a job of several ranks: its allocated memory
/// as steps, reserved as a line, on the scale every rank's chart shares (`t1` seconds, `ymax`
/// bytes), with `title` above; no axes, so many fit side by side.
pub fn draw_live_small(canvas: &HtmlCanvasElement, pal: &Palette, points: &[[u64; 3]], scale: (f64, f64), title: &str) -> Res<()> {
    let root = area(canvas, pal)?;
    let (t1, ymax) = (scale.0.max(1e-3), scale.1.max(1.0));
    let mut chart = ChartBuilder::on(&root)
        .margin(4)
        .caption(title, ("sans-serif", 12).into_font().color(&pal.text))
        .build_cartesian_2d(0f64..t1, 0f64..ymax)
        .map_err(err)?;
    chart.configure_mesh().disable_mesh().disable_axes().draw().map_err(err)?;
    let step = |i: usize| live_steps(points, i);
    chart.draw_series(AreaSeries::new(step(1), 0.0, pal.allocated.mix(0.25)).border_style(pal.allocated)).map_err(err)?;
    if points.iter().any(|p| p[2] > 0) {
        chart.draw_series(LineSeries::new(step(2), pal.reserved.stroke_width(1))).map_err(err)?;
    }
    root.present().map_err(err)
}

/// Column `i` of live points (`[ns, allocated, reserved]`) as steps: each level holds until
/// the next point's time, then rises or falls there.
fn live_steps(points: &[[u64; 3]], i: usize) -> impl Iterator<Item = (f64, f64)> + '_ {
    points.iter().enumerate().flat_map(move |(k, p)| {
        let t = p[0] as f64 / 1e9;
        let prev = if k == 0 { p[i] } else { points[k - 1][i] };
        [(t, prev as f64), (t, p[i] as f64)]
    })
}
