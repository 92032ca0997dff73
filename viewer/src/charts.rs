//! Every chart the page draws, with plotters on a `<canvas>`. Drawing functions take the data
//! and a [`Palette`] and return where the plot landed in pixels ([`Mapping`]) so mouse handlers
//! can turn a pixel back into a time or a rank. Where things lie that is not plotters' to say
//! (the flame graph's boxes, a zoomed window) comes from `shared::analysis::view_math`.

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters_canvas::CanvasBackend;
use shared::analysis::active::{ActiveBand, ActiveTimeline};
use shared::analysis::diff::{Alignment, DiffCurves};
use shared::analysis::flame::{FlameGraph, FlameKind};
use shared::analysis::profile::GraphProfile;
use shared::analysis::view_math::FlameBox;
use shared::analysis::TimelinePoint;
use shared::explore::{Band, Curve, RankCurve};
use shared::model::{BlockState, SegmentInfo};
use shared::units::{byte_ticks, format_bytes, format_seconds};
use shared::Phase;
use web_sys::HtmlCanvasElement;

/// Colours of one theme.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Palette {
    pub background: RGBColor,
    pub text: RGBColor,
    pub grid: RGBColor,
    pub allocated: RGBColor,
    pub reserved: RGBColor,
    pub driver: RGBColor,
    pub forward: RGBColor,
    pub backward: RGBColor,
    pub optimizer: RGBColor,
    pub highlight: RGBColor,
    pub free: RGBColor,
}

impl Palette {
    pub const DARK: Palette = Palette {
        background: RGBColor(0x16, 0x19, 0x1e),
        text: RGBColor(0xd6, 0xdb, 0xe3),
        grid: RGBColor(0x2c, 0x31, 0x3a),
        allocated: RGBColor(0x4f, 0x9d, 0xff),
        reserved: RGBColor(0xf2, 0xa5, 0x41),
        driver: RGBColor(0xb4, 0x8e, 0xf0),
        forward: RGBColor(0x3f, 0xb9, 0x8a),
        backward: RGBColor(0xe0, 0x6c, 0x75),
        optimizer: RGBColor(0xc6, 0x9b, 0x2e),
        highlight: RGBColor(0xff, 0x4f, 0xd8),
        free: RGBColor(0x4a, 0x50, 0x5c),
    };
    pub const LIGHT: Palette = Palette {
        background: RGBColor(0xff, 0xff, 0xff),
        text: RGBColor(0x1d, 0x23, 0x2b),
        grid: RGBColor(0xe3, 0xe6, 0xea),
        allocated: RGBColor(0x1f, 0x6f, 0xd6),
        reserved: RGBColor(0xd9, 0x7a, 0x00),
        driver: RGBColor(0x7b, 0x4f, 0xc9),
        forward: RGBColor(0x1f, 0x9d, 0x6b),
        backward: RGBColor(0xc9, 0x3c, 0x4a),
        optimizer: RGBColor(0xa8, 0x7f, 0x12),
        highlight: RGBColor(0xd1, 0x00, 0xa8),
        free: RGBColor(0xc8, 0xcd, 0xd4),
    };

    pub fn phase(&self, p: Phase) -> RGBColor {
        match p {
            Phase::Forward => self.forward,
            Phase::Backward => self.backward,
            Phase::Optimizer => self.optimizer,
            Phase::Other => self.grid,
        }
    }
}

/// Where a chart's plot area landed: pixels `px` map linearly to data `x`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mapping {
    pub px: (f64, f64),
    pub py: (f64, f64),
    pub x: (f64, f64),
}

impl Mapping {
    /// The data x under pixel `px` (clamped to the plot).
    pub fn x_at(&self, px: f64) -> f64 {
        let f = ((px - self.px.0) / (self.px.1 - self.px.0).max(1.0)).clamp(0.0, 1.0);
        self.x.0 + f * (self.x.1 - self.x.0)
    }

    pub fn contains(&self, px: f64, py: f64) -> bool {
        px >= self.px.0 && px <= self.px.1 && py >= self.py.0 && py <= self.py.1
    }
}

type Res<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn area(canvas: &HtmlCanvasElement, pal: &Palette) -> Res<DrawingArea<CanvasBackend, Shift>> {
    let backend = CanvasBackend::with_canvas_object(canvas.clone()).ok_or("the canvas has no 2D context")?;
    let root = backend.into_drawing_area();
    root.fill(&pal.background).map_err(err)?;
    Ok(root)
}

fn font(pal: &Palette, size: u32) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&pal.text)
}

/// Memory through the buckets: at each bucket's start a vertical stroke to its maximum, then a
/// straight line down to its last level at the next bucket's start, so that a peak inside a
/// bucket is drawn at the bucket's start and never flattened away.
fn steps<'a>(
    points: &'a [TimelinePoint],
    end: f64,
    levels: impl Fn(&TimelinePoint) -> (u64, u64) + 'a,
) -> impl Iterator<Item = (f64, f64)> + 'a {
    points.iter().enumerate().flat_map(move |(i, p)| {
        let next = points.get(i + 1).map_or(end, |n| n.t_s);
        let (max, last) = levels(p);
        [(p.t_s, max as f64), (next, last as f64)]
    })
}

/// Like [`steps`], but each bucket's level holds flat until the next bucket (a vertical stroke
/// up to its maximum, then its last level), so a rank that stops early or pauses does not
/// draw a slope across the gap.
fn held_steps(points: &[TimelinePoint], end: f64) -> impl Iterator<Item = (f64, f64)> + '_ {
    points.iter().enumerate().flat_map(move |(i, p)| {
        let next = points.get(i + 1).map_or(end, |n| n.t_s);
        let (max, last) = (p.allocated_max_bytes as f64, p.allocated_last_bytes as f64);
        [(p.t_s, max), (p.t_s, last), (next, last)]
    })
}

/// A chart of f64 × f64 whose y axis carries its own ticks: round values of one binary unit
/// for bytes (`shared::units::byte_ticks`), fifths for ratios.
type Chart<'a> = ChartContext<'a, CanvasBackend, Cartesian2d<RangedCoordf64, TickedAxis>>;

/// A linear axis from `0` to `end` with the given ticks (plotters would pick decimal ones).
#[derive(Clone)]
struct TickedAxis {
    linear: RangedCoordf64,
    ticks: Vec<f64>,
}

impl TickedAxis {
    fn new(end: f64, ticks: Vec<f64>) -> Self {
        Self { linear: (0.0..end).into(), ticks }
    }
}

impl Ranged for TickedAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.linear.map(value, limit)
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // Grid lines at the ticks only (no light lines between them).
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.linear.range()
    }
}

/// Bytes over a time window (seconds): the axes and grid drawn, the byte axis up to a round
/// value above `top_bytes`. Returns the chart, where its plot lies, and the byte axis's end.
fn window_chart<'a>(
    root: &'a DrawingArea<CanvasBackend, Shift>,
    pal: &Palette,
    window: (f64, f64),
    top_bytes: u64,
    margin_top: u32,
) -> Res<(Chart<'a>, Mapping, f64)> {
    let yt = byte_ticks(top_bytes as f64 * 1.02, 6);
    let (t0, t1) = (window.0, window.1.max(window.0 + 1e-9));
    let mut chart = ChartBuilder::on(root)
        .margin(8)
        .margin_top(margin_top)
        .x_label_area_size(28)
        .y_label_area_size(78)
        .build_cartesian_2d(t0..t1, TickedAxis::new(yt.end, yt.ticks.clone()))
        .map_err(err)?;
    draw_mesh(&mut chart, pal, (8, 6), &|v| format_seconds(*v), &|v| yt.label(*v), None)?;
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let mapping = Mapping { px: (xr.start as f64, xr.end as f64), py: (yr.start as f64, yr.end as f64), x: (t0, t1) };
    Ok((chart, mapping, yt.end))
}

/// Axes and grid in the theme's colours, with `x_labels`/`y_labels` ticks formatted by
/// `x_fmt`/`y_fmt`, and an optional x axis description.
fn draw_mesh(
    chart: &mut Chart<'_>,
    pal: &Palette,
    (x_labels, y_labels): (usize, usize),
    x_fmt: &dyn Fn(&f64) -> String,
    y_fmt: &dyn Fn(&f64) -> String,
    x_desc: Option<&str>,
) -> Res<()> {
    let mut mesh = chart.configure_mesh();
    mesh.x_labels(x_labels)
        .y_labels(y_labels)
        .x_label_formatter(x_fmt)
        .y_label_formatter(y_fmt)
        .label_style(font(pal, 12))
        .axis_desc_style(font(pal, 12))
        .axis_style(pal.text)
        .bold_line_style(pal.grid)
        .light_line_style(pal.background);
    if let Some(d) = x_desc {
        mesh.x_desc(d);
    }
    mesh.draw().map_err(err)
}

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
    let step = |i: usize| {
        points.iter().enumerate().flat_map(move |(k, p)| {
            let t = p[0] as f64 / 1e9;
            let prev = if k == 0 { p[i] } else { points[k - 1][i] };
            [(t, prev as f64), (t, p[i] as f64)]
        })
    };
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
    let step = |i: usize| {
        points.iter().enumerate().flat_map(move |(k, p)| {
            let t = p[0] as f64 / 1e9;
            let prev = if k == 0 { p[i] } else { points[k - 1][i] };
            [(t, prev as f64), (t, p[i] as f64)]
        })
    };
    chart.draw_series(AreaSeries::new(step(1), 0.0, pal.allocated.mix(0.25)).border_style(pal.allocated)).map_err(err)?;
    if points.iter().any(|p| p[2] > 0) {
        chart.draw_series(LineSeries::new(step(2), pal.reserved.stroke_width(1))).map_err(err)?;
    }
    root.present().map_err(err)
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

/// The allocator's segments, one row each in address order, blocks coloured by state. Returns
/// how many segments did not fit.
pub fn draw_segments(canvas: &HtmlCanvasElement, pal: &Palette, segments: &[SegmentInfo], row_height: u32) -> Res<usize> {
    let root = area(canvas, pal)?;
    let (w, h) = root.dim_in_pixel();
    let rows = ((h.saturating_sub(4)) / row_height) as usize;
    let largest = segments.iter().map(|s| s.size_bytes).max().unwrap_or(1).max(1) as f64;
    let width = (w as f64 - 110.0).max(10.0);
    for (r, seg) in segments.iter().take(rows).enumerate() {
        let y = 2 + r as i32 * row_height as i32;
        let scale = width / largest;
        root.draw(&Text::new(format_bytes(seg.size_bytes), (2, y), font(pal, 10))).map_err(err)?;
        let x0 = 100.0;
        let seg_w = (seg.size_bytes as f64 * scale).max(1.0);
        root.draw(&Rectangle::new([(x0 as i32, y), ((x0 + seg_w) as i32, y + row_height as i32 - 2)], pal.free.filled())).map_err(err)?;
        for b in seg.blocks.iter().filter(|b| b.state == BlockState::Allocated) {
            let bx = x0 + (b.address.saturating_sub(seg.address)) as f64 * scale;
            let bw = (b.size_bytes as f64 * scale).max(1.0);
            root.draw(&Rectangle::new([(bx as i32, y), ((bx + bw) as i32, y + row_height as i32 - 2)], pal.allocated.filled()))
                .map_err(err)?;
        }
    }
    root.present().map_err(err)?;
    Ok(segments.len().saturating_sub(rows))
}

/// Draws the icicle laid out by [`shared::analysis::view_math::flame_layout`]; boxes whose
/// name contains `search` (case-insensitive) are highlighted and the others dimmed.
pub fn draw_flame(canvas: &HtmlCanvasElement, pal: &Palette, flame: &FlameGraph, boxes: &[FlameBox], search: &str) -> Res<()> {
    let root = area(canvas, pal)?;
    let needle = search.to_lowercase();
    for b in boxes {
        let n = &flame.nodes[b.node as usize];
        let base = match n.kind {
            FlameKind::Root | FlameKind::Unattributed => pal.free,
            FlameKind::Module => pal.allocated,
            FlameKind::Op => pal.forward,
            FlameKind::Frame => pal.reserved,
        };
        let hash = n.name.bytes().fold(0u32, |h, c| h.wrapping_mul(31).wrapping_add(c as u32));
        let shade = 0.55 + (hash % 30) as f64 / 100.0;
        let matched = !needle.is_empty() && n.name.to_lowercase().contains(&needle);
        let colour = if matched {
            pal.highlight.mix(1.0)
        } else if needle.is_empty() {
            base.mix(shade)
        } else {
            base.mix(0.2)
        };
        let (x0, y0) = (b.x as i32, b.y as i32);
        let (x1, y1) = ((b.x + b.w) as i32, (b.y + b.h) as i32);
        root.draw(&Rectangle::new([(x0, y0), (x1.max(x0 + 1), y1)], colour.filled())).map_err(err)?;
        if b.w > 30.0 {
            let max_chars = ((b.w - 6.0) / 7.0) as usize;
            let label: String = if n.name.chars().count() > max_chars {
                n.name.chars().take(max_chars.saturating_sub(1)).chain(['…']).collect()
            } else {
                n.name.clone()
            };
            root.draw(&Text::new(label, (x0 + 3, y0 + 2), font(pal, 12))).map_err(err)?;
        }
    }
    root.present().map_err(err)
}

/// Non-background pixels of a canvas, for tests and for "did it draw".
pub fn painted_pixels(canvas: &HtmlCanvasElement) -> usize {
    use wasm_bindgen::JsCast;
    let Some(ctx) = canvas.get_context("2d").ok().flatten().and_then(|c| c.dyn_into::<web_sys::CanvasRenderingContext2d>().ok()) else {
        return 0;
    };
    let Ok(img) = ctx.get_image_data(0.0, 0.0, canvas.width() as f64, canvas.height() as f64) else { return 0 };
    let data = img.data();
    let bg = [data.first().copied().unwrap_or(0), data.get(1).copied().unwrap_or(0), data.get(2).copied().unwrap_or(0)];
    data.chunks_exact(4).filter(|p| p[0] != bg[0] || p[1] != bg[1] || p[2] != bg[2]).count()
}

/// Where the Active Memory Timeline was drawn, to find the band under the pointer.
#[derive(Clone, Copy, Debug)]
pub struct ActiveMapping {
    pub plot: Mapping,
    /// The bytes at the plot's top edge.
    pub ymax: f64,
    pub columns: usize,
}

impl ActiveMapping {
    /// The (column, bytes) under pixel (px, py), inside the plot.
    pub fn at(&self, px: f64, py: f64) -> Option<(usize, f64)> {
        if !self.plot.contains(px, py) || self.columns == 0 {
            return None;
        }
        let f = ((px - self.plot.px.0) / (self.plot.px.1 - self.plot.px.0).max(1.0)).clamp(0.0, 0.999_999);
        let bytes = self.ymax * (self.plot.py.1 - py) / (self.plot.py.1 - self.plot.py.0).max(1.0);
        Some(((f * self.columns as f64) as usize, bytes))
    }
}

/// The band under (column, bytes), if any.
pub fn active_band_at(a: &ActiveTimeline, column: usize, bytes: f64) -> Option<usize> {
    let holds = |b: &ActiveBand| -> Option<bool> {
        let bottom = *b.bottoms.get(column.checked_sub(b.first_column as usize)?)? as f64;
        Some(bytes >= bottom && bytes < bottom + b.size_bytes as f64)
    };
    a.bands.iter().position(|b| holds(b).unwrap_or(false))
}

/// What gives a band its colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColourBy {
    Layer,
    Operator,
    Stack,
    /// What the allocation is for (parameter, gradient, activation, ...): fixed colours.
    Category,
}

/// A category's colour in every view, and the legend's.
pub fn category_colour(c: Option<shared::analysis::categories::Category>) -> RGBColor {
    use shared::analysis::categories::Category as C;
    match c {
        Some(C::Parameter) => RGBColor(0x4f, 0x9d, 0xff),
        Some(C::Buffer) => RGBColor(0x3b, 0xc9, 0xdb),
        Some(C::Gradient) => RGBColor(0xf2, 0xa5, 0x41),
        Some(C::Activation) => RGBColor(0x6c, 0xc6, 0x6b),
        Some(C::OptimizerState) => RGBColor(0xb4, 0x8e, 0xf0),
        Some(C::Temporary) => RGBColor(0xe8, 0x6b, 0x6b),
        Some(C::Other) | None => RGBColor(0x9a, 0xa3, 0xb0),
    }
}

impl ColourBy {
    fn key(self, b: &ActiveBand) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        match self {
            ColourBy::Layer => b.layer.hash(&mut h),
            ColourBy::Operator => b.op.hash(&mut h),
            ColourBy::Stack => b.stack.hash(&mut h),
            ColourBy::Category => b.category.hash(&mut h),
        }
        h.finish()
    }

    /// A band's colour: fixed per category, else from the hash of its key.
    pub fn colour(self, b: &ActiveBand) -> RGBColor {
        match self {
            ColourBy::Category => category_colour(b.category),
            _ => hashed_colour(self.key(b)),
        }
    }
}

/// A colour from a hash: spread hues, middling saturation and lightness, readable on both
/// themes.
fn hashed_colour(key: u64) -> RGBColor {
    let hue = (key % 360) as f64;
    let (s, l) = (0.55 + ((key >> 16) % 20) as f64 / 100.0, 0.50 + ((key >> 24) % 12) as f64 / 100.0);
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let x = c * (1.0 - ((hue / 60.0) % 2.0 - 1.0).abs());
    let m = l - c / 2.0;
    let (r, g, b) = match (hue / 60.0) as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let to = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    RGBColor(to(r), to(g), to(b))
}

/// The Active Memory Timeline: the summary band at the bottom, then every drawn allocation
/// as its own band over the columns it is live in; `pinned` is outlined and the bands that
/// share its stack (or, without stacks, its layer and size) are lit; with `found` (a search's
/// allocation events, sorted) the others are dimmed.
pub fn draw_active(
    canvas: &HtmlCanvasElement,
    pal: &Palette,
    a: &ActiveTimeline,
    by: ColourBy,
    pinned: Option<usize>,
    found: Option<&[u32]>,
) -> Res<ActiveMapping> {
    let root = area(canvas, pal)?;
    let (mut chart, plot, ymax) = window_chart(&root, pal, (a.start_s, a.end_s), a.totals.iter().copied().max().unwrap_or(0), 14)?;
    let (t0, t1) = plot.x;
    let columns = a.totals.len();
    let mapping = ActiveMapping { plot, ymax, columns };
    if columns == 0 {
        return Ok(mapping);
    }
    let width = (t1 - t0) / columns as f64;
    let x = |c: usize| t0 + c as f64 * width;
    // A band over columns first.. with the given bottoms and height, as one polygon of steps:
    // a corner where the top or the bottom moves, none between equal columns (a band's
    // bottom only moves when one below it is freed).
    let outline = |first: usize, bottoms: &[u64], height: &dyn Fn(usize) -> u64| -> Vec<(f64, f64)> {
        let mut pts = Vec::new();
        let n = bottoms.len();
        let mut k = 0;
        while k < n {
            let top = bottoms[k] + height(k);
            let end = (k + 1..n).find(|&j| bottoms[j] + height(j) != top).unwrap_or(n);
            pts.push((x(first + k), top as f64));
            pts.push((x(first + end), top as f64));
            k = end;
        }
        let mut k = n;
        while k > 0 {
            let b = bottoms[k - 1];
            let start = (0..k - 1).rev().find(|&j| bottoms[j] != b).map_or(0, |j| j + 1);
            pts.push((x(first + k), b as f64));
            pts.push((x(first + start), b as f64));
            k = start;
        }
        pts
    };
    let zeros = vec![0u64; columns];
    let summary = outline(0, &zeros, &|k| a.summary[k]);
    chart.draw_series(std::iter::once(Polygon::new(summary, pal.grid.mix(0.9).filled()))).map_err(err)?;
    let lit = pinned.and_then(|p| a.bands.get(p)).map(|p| (p.stack, p.layer.clone(), p.size_bytes));
    // A search's matches stay lit, the rest dimmed.
    let unmatched = |b: &ActiveBand| found.is_some_and(|f| f.binary_search(&b.event_index).is_err());
    let shares = |b: &ActiveBand| match &lit {
        Some((Some(stack), _, _)) => b.stack == Some(*stack),
        Some((None, layer, size)) => b.stack.is_none() && &b.layer == layer && b.size_bytes == *size,
        None => false,
    };
    chart
        .draw_series(a.bands.iter().map(|b| {
            let colour = by.colour(b);
            let style = if (lit.is_some() && !shares(b)) || unmatched(b) { colour.mix(0.2).filled() } else { colour.filled() };
            Polygon::new(outline(b.first_column as usize, &b.bottoms, &|_| b.size_bytes), style)
        }))
        .map_err(err)?;
    if let Some(b) = pinned.and_then(|p| a.bands.get(p)) {
        let mut pts = outline(b.first_column as usize, &b.bottoms, &|_| b.size_bytes);
        if let Some(&first) = pts.first() {
            pts.push(first);
        }
        chart.draw_series(std::iter::once(PathElement::new(pts, pal.highlight.stroke_width(2)))).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(mapping)
}
