//! Charts of graph profiles and batch sweeps, drawn with plotters into PNG and SVG files.
//!
//! One drawing function per chart, generic over the backend, is called once per format so the
//! PNG and the SVG show the same thing. Text uses DejaVu Sans embedded in the binary (ab_glyph),
//! so charts render the same on machines without fonts.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use shared::analysis::profile::{BreakdownRow, GraphProfile};
use shared::Phase;
use std::path::{Path, PathBuf};

const SIZE: (u32, u32) = (1200, 650);
const FONT: &[u8] = include_bytes!("../../static/fonts/DejaVuSans.ttf");

fn register_font() -> anyhow::Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE.get_or_init(|| plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok());
    anyhow::ensure!(ok, "the embedded chart font could not be loaded");
    Ok(())
}

/// A byte axis unit that keeps tick labels short.
#[derive(Clone, Copy)]
struct ByteUnit {
    name: &'static str,
    div: f64,
}

fn byte_unit(max_bytes: u64) -> ByteUnit {
    const K: f64 = 1024.0;
    match max_bytes as f64 {
        b if b >= K * K * K => ByteUnit { name: "GiB", div: K * K * K },
        b if b >= K * K => ByteUnit { name: "MiB", div: K * K },
        _ => ByteUnit { name: "KiB", div: K },
    }
}

/// A named series of (x, bytes) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, u64)>,
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Writes `<stem>.png` and `<stem>.svg`; returns both paths.
fn both(
    stem: &Path,
    draw: impl for<'a> Fn(&DrawingArea<SVGBackend<'a>, Shift>) -> DrawResult<SVGBackend<'a>>,
    draw_png: impl for<'a> Fn(&DrawingArea<BitMapBackend<'a>, Shift>) -> DrawResult<BitMapBackend<'a>>,
) -> anyhow::Result<Vec<PathBuf>> {
    register_font()?;
    let svg = stem.with_extension("svg");
    let png = stem.with_extension("png");
    {
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        draw(&root).map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", svg.display()))?;
        root.present().map_err(|e| anyhow::anyhow!("cannot write {}: {e}", svg.display()))?;
    }
    {
        let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
        draw_png(&root).map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", png.display()))?;
        root.present().map_err(|e| anyhow::anyhow!("cannot write {}: {e}", png.display()))?;
    }
    Ok(vec![png, svg])
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn phase_color(p: Phase) -> RGBAColor {
    match p {
        Phase::Forward => RGBColor(31, 119, 180).mix(0.10),
        Phase::Backward => RGBColor(214, 39, 40).mix(0.10),
        Phase::Optimizer => RGBColor(44, 160, 44).mix(0.14),
        Phase::Other => RGBColor(128, 128, 128).mix(0.06),
    }
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>>;

/// The series legend, in the upper right corner (charts leave headroom for it).
fn legend<'a, DB: DrawingBackend + 'a>(chart: &mut Chart<'a, DB>) -> DrawResult<DB> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .label_font(("sans-serif", 15))
        .draw()
}

/// Red crosses with a label at height `y` for x positions that have no value.
fn cross_out<'a, 'l, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    failed: impl Iterator<Item = (f64, &'l str)>,
    y: f64,
) -> DrawResult<DB> {
    for (x, label) in failed {
        chart.draw_series(std::iter::once(Cross::new((x, y), 8, RED.stroke_width(3))))?;
        chart.draw_series(std::iter::once(Text::new(label.to_owned(), (x, y * 0.96), ("sans-serif", 15).into_font().color(&RED))))?;
    }
    Ok(())
}

/// Runs of equal phase over ranks: (first rank, last rank, phase).
fn phase_bands(gtypes: &[Phase]) -> Vec<(usize, usize, Phase)> {
    let mut bands: Vec<(usize, usize, Phase)> = Vec::new();
    for (r, &p) in gtypes.iter().enumerate() {
        match bands.last_mut() {
            Some(b) if b.2 == p => b.1 = r,
            _ => bands.push((r, r, p)),
        }
    }
    bands
}

/// Lines over ranks (or any x), with phase bands behind them and an optional marked point.
pub struct LineChart<'a> {
    pub title: String,
    pub x_label: &'a str,
    pub series: Vec<Series>,
    pub bands: Vec<(usize, usize, Phase)>,
    /// (x, bytes, label) of the point to mark.
    pub marker: Option<(f64, u64, String)>,
    /// Points drawn as circles as well as lines (few points, e.g. batch sizes).
    pub dots: bool,
    /// (x, label) of points that have no value (a batch size that ran out of memory).
    pub failed: Vec<(f64, String)>,
    /// Draw x on a log2 axis (batch sizes), with ticks at powers of two.
    pub log2_x: bool,
}

impl LineChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        root.fill(&WHITE)?;
        let max_y = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).max().unwrap_or(1).max(1);
        let unit = byte_unit(max_y);
        let xs = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).chain(self.failed.iter().map(|f| f.0));
        let (min_x, max_x) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
        let fx = |x: f64| if self.log2_x { x.max(1e-9).log2() } else { x };
        let (min_x, max_x) = if !min_x.is_finite() {
            (0.0, 1.0)
        } else if self.log2_x {
            (fx(min_x).floor() - 0.5, fx(max_x).ceil() + 0.5)
        } else {
            (min_x, max_x.max(min_x + 1.0))
        };
        // Headroom above the data for the legend in the upper right corner.
        let top = max_y as f64 / unit.div * 1.35;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(80)
            .build_cartesian_2d(min_x..max_x, 0.0..top)?;
        let step = log2_label_step(max_x - min_x);
        let log2_label = |x: &f64| log2_label(*x, step);
        let plain_label = |x: &f64| format!("{x:.0}");
        let ticks = if self.log2_x { (max_x - min_x).round() as usize + 1 } else { 10 };
        chart
            .configure_mesh()
            .x_desc(self.x_label)
            .x_labels(ticks)
            .x_label_formatter(if self.log2_x { &log2_label } else { &plain_label })
            .y_desc(format!("memory ({})", unit.name))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 17))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()?;
        for &(a, b, p) in &self.bands {
            let band = Rectangle::new([(a as f64 - 0.5, 0.0), (b as f64 + 0.5, top)], phase_color(p).filled());
            chart
                .draw_series(std::iter::once(band))?
                .label(p.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], phase_color(p).filled()));
        }
        for (k, s) in self.series.iter().enumerate() {
            let color = PALETTE[k % PALETTE.len()];
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (fx(x), y as f64 / unit.div)).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(s.name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
            if self.dots {
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
            }
        }
        cross_out(&mut chart, self.failed.iter().map(|(x, l)| (fx(*x), l.as_str())), top / 1.35)?;
        if let Some((x, y, label)) = &self.marker {
            let p = (*x, *y as f64 / unit.div);
            chart.draw_series(std::iter::once(Circle::new(p, 7, BLACK.stroke_width(2))))?;
            // Right of the point in the left part of the chart, left of it in the right part.
            let h = if p.0 > min_x + (max_x - min_x) * 0.6 { HPos::Right } else { HPos::Left };
            let style = TextStyle::from(("sans-serif", 16).into_font()).pos(Pos::new(h, VPos::Bottom));
            chart.draw_series(std::iter::once(Text::new(label.clone(), (p.0, p.1 * 1.03), style)))?;
        }
        legend(&mut chart)
    }

    pub fn write(&self, stem: &Path) -> anyhow::Result<Vec<PathBuf>> {
        both(stem, |r| self.draw(r), |r| self.draw(r))
    }
}

/// The memory-vs-rank chart of a profile: allocated before each node and peak during it, the
/// forward/backward/optimizer sections shaded and the peak rank marked.
pub fn memory_vs_rank(profile: &GraphProfile, title: &str) -> LineChart<'static> {
    let gtypes: Vec<Phase> = profile.nodes.iter().map(|n| n.gtype).collect();
    let peak = profile.nodes.get(profile.peak_rank);
    LineChart {
        title: title.to_owned(),
        x_label: "operator rank",
        series: vec![
            Series {
                name: "allocated before the op".into(),
                points: profile.nodes.iter().map(|n| (n.rank as f64, n.median_active_mem_bytes)).collect(),
            },
            Series {
                name: "peak during the op".into(),
                points: profile.nodes.iter().map(|n| (n.rank as f64, n.median_peak_mem_bytes)).collect(),
            },
        ],
        bands: phase_bands(&gtypes),
        marker: peak.map(|n| {
            (
                n.rank as f64,
                n.median_peak_mem_bytes,
                format!("peak {} at rank {} ({})", shared::units::format_bytes(n.median_peak_mem_bytes), n.rank, n.node_name),
            )
        }),
        dots: false,
        failed: Vec::new(),
        log2_x: false,
    }
}

/// Stacked areas of the breakdown per rank (weights at the bottom).
pub fn breakdown(rows: &[BreakdownRow], gtypes: &[Phase], title: &str, stem: &Path) -> anyhow::Result<Vec<PathBuf>> {
    both(stem, |r| draw_breakdown(r, rows, gtypes, title), |r| draw_breakdown(r, rows, gtypes, title))
}

fn draw_breakdown<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    rows: &[BreakdownRow],
    gtypes: &[Phase],
    title: &str,
) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let max = rows.iter().map(|r| r.total_allocated).max().unwrap_or(1).max(1);
    let unit = byte_unit(max);
    // Headroom above the data for the legend in the upper right corner.
    let top = max as f64 / unit.div * 1.35;
    let n = rows.len().max(2) as f64;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..n - 1.0, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("operator rank")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc(format!("allocated ({})", unit.name))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    type Part = (&'static str, fn(&BreakdownRow) -> u64, RGBColor);
    let parts: [Part; 5] = [
        ("weights", |r| r.weights, RGBColor(107, 160, 207)),
        ("gradients", |r| r.gradients, RGBColor(226, 112, 112)),
        ("optimizer state", |r| r.optimizer_state, RGBColor(122, 194, 122)),
        ("activations", |r| r.activations, RGBColor(255, 170, 90)),
        ("other", |r| r.other, RGBColor(190, 190, 190)),
    ];
    // Draw cumulative sums from the top part down so each area covers the ones below it.
    for k in (0..parts.len()).rev() {
        let color = parts[k].2;
        let pts: Vec<(f64, f64)> =
            rows.iter().map(|r| (r.rank as f64, parts[..=k].iter().map(|p| (p.1)(r)).sum::<u64>() as f64 / unit.div)).collect();
        chart
            .draw_series(AreaSeries::new(pts, 0.0, color.filled()).border_style(color))?
            .label(parts[k].0)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
    }
    // Section boundaries as thin vertical lines.
    for (a, _, p) in phase_bands(gtypes).into_iter().skip(1) {
        let x = a as f64 - 0.5;
        chart.draw_series(std::iter::once(PathElement::new(vec![(x, 0.0), (x, top)], BLACK.mix(0.5).stroke_width(1))))?;
        chart.draw_series(std::iter::once(Text::new(p.as_str(), (x + 1.0, top * 0.97), ("sans-serif", 14))))?;
    }
    legend(&mut chart)
}

/// One line of plain numbers (not bytes) over batch sizes (a log2 axis), with failed points
/// crossed out.
pub fn seconds_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    pts: &[(f64, f64)],
    failed: &[(f64, String)],
    stem: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    both(stem, |r| draw_plain(r, title, x_label, y_label, pts, failed), |r| draw_plain(r, title, x_label, y_label, pts, failed))
}

fn draw_plain<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    pts: &[(f64, f64)],
    failed: &[(f64, String)],
) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let fx = |x: f64| x.max(1e-9).log2();
    let pts: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (fx(x), y)).collect();
    let xs = pts.iter().map(|p| p.0).chain(failed.iter().map(|f| fx(f.0)));
    let (min_x, max_x) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
    let (min_x, max_x) = if min_x.is_finite() { (min_x.floor() - 0.5, max_x.ceil() + 0.5) } else { (0.0, 1.0) };
    let top = pts.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.12;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(min_x..max_x, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .x_labels((max_x - min_x).round() as usize + 1)
        .x_label_formatter(&|x| log2_label(*x, log2_label_step(max_x - min_x)))
        .y_desc(y_label)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let color = PALETTE[0];
    chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?;
    chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    cross_out(&mut chart, failed.iter().map(|(x, l)| (fx(*x), l.as_str())), top / 1.12)
}

/// Every how many powers of two a log2 axis spanning `span` gets a label (at most about 12).
fn log2_label_step(span: f64) -> i64 {
    ((span / 12.0).ceil() as i64).max(1)
}

/// `2^x` at integral `x` that falls on the step, else no label.
fn log2_label(x: f64, step: i64) -> String {
    if x.fract().abs() < 1e-6 && (x.round() as i64).rem_euclid(step) == 0 {
        format!("{}", 2f64.powf(x).round())
    } else {
        String::new()
    }
}
