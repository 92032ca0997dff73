//! Every chart the page draws, with plotters on a `<canvas>`. Drawing functions take the data
//! and a [`Palette`] and return where the plot landed in pixels ([`Mapping`]) so mouse handlers
//! can turn a pixel back into a time or a rank. Where things lie that is not plotters' to say
//! (the flame graph's boxes, a zoomed window) comes from `shared::analysis::view_math`.
//!
//! One file per kind of chart: [`timeline`], [`live`], [`curves`], [`blocks`], [`active`]; what
//! they share (the palette, the pixel mapping, the axes) is here.

mod active;
mod active_gl;
mod blocks;
mod curves;
mod live;
mod timeline;

pub use active::*;
pub use active_gl::*;
pub use blocks::*;
pub use curves::*;
pub use live::*;
pub use timeline::*;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters_canvas::CanvasBackend;
use shared::analysis::TimelinePoint;
use shared::units::{byte_ticks, format_seconds};
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
