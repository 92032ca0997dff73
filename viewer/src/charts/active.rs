//! The Active Memory Timeline: every allocation a band, coloured by what the user picks; what
//! both paths share (colours, styles, outlines, where the pointer is) and the 2D canvas path
//! with plotters. The WebGL2 path draws the same bands as quads (`active_gl.rs`).

use super::{area, err, window_chart, Mapping, Palette, Res};
use plotters::prelude::*;
use shared::analysis::active::{ActiveBands, ActiveTimeline, NONE};
use web_sys::HtmlCanvasElement;

/// Where the Active Memory Timeline was drawn, to find the band under the pointer: the plot
/// shows `plot.x` (the window on screen, which a zoom moves before the worker answers).
#[derive(Clone, Copy, Debug)]
pub struct ActiveMapping {
    pub plot: Mapping,
    /// The bytes at the plot's top edge.
    pub ymax: f64,
}

impl ActiveMapping {
    /// The (seconds, bytes) under pixel (px, py), inside the plot.
    pub fn at(&self, px: f64, py: f64) -> Option<(f64, f64)> {
        if !self.plot.contains(px, py) {
            return None;
        }
        let bytes = self.ymax * (self.plot.py.1 - py) / (self.plot.py.1 - self.plot.py.0).max(1.0);
        Some((self.plot.x_at(px), bytes))
    }
}

/// The column of `a` that shows time `t_s`, if its window holds it.
pub fn column_at(a: &ActiveTimeline, t_s: f64) -> Option<usize> {
    let n = a.totals.len();
    let f = (t_s - a.start_s) / (a.end_s - a.start_s);
    (n > 0 && (0.0..=1.0).contains(&f)).then(|| ((f * n as f64) as usize).min(n - 1))
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
    /// Each band's colour: fixed per category, else from the hash of its key (a layer's or an
    /// operator's name, a stack), each name hashed once.
    pub fn colours(self, bands: &ActiveBands) -> Vec<RGBColor> {
        use std::hash::{Hash, Hasher};
        let hash = |key: &dyn Fn(&mut std::collections::hash_map::DefaultHasher)| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            key(&mut h);
            h.finish()
        };
        let by_name: Vec<RGBColor> = bands.names.iter().map(|n| hashed_colour(hash(&|h| Some(n.as_str()).hash(h)))).collect();
        let unnamed = hashed_colour(hash(&|h| None::<&str>.hash(h)));
        let named = |id: u32| if id == NONE { unnamed } else { by_name.get(id as usize).copied().unwrap_or(unnamed) };
        (0..bands.len())
            .map(|b| match self {
                ColourBy::Layer => named(bands.layer[b]),
                ColourBy::Operator => named(bands.op[b]),
                ColourBy::Stack => hashed_colour(hash(&|h| Some(bands.stack[b]).filter(|&s| s != NONE).hash(h))),
                ColourBy::Category => category_colour(bands.category_of(b)),
            })
            .collect()
    }
}

/// One entry of a colouring's legend: what a colour stands for, its colour, and the bytes of
/// the bands in the answer that have it.
#[derive(Clone, Debug, PartialEq)]
pub struct LegendEntry {
    pub label: String,
    pub colour: RGBColor,
    pub bytes: u64,
}

impl ColourBy {
    /// The name the colour menu gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            ColourBy::Layer => "layer",
            ColourBy::Operator => "operator",
            ColourBy::Stack => "stack",
            ColourBy::Category => "category",
        }
    }

    /// What the colours of `bands` (`colours`, as [`ColourBy::colours`] gives them) stand
    /// for, most bytes first: at most `most` categories, layers or operators, and how many more
    /// have colours of their own. A stack has no name to show: no entries, and the number of
    /// stacks.
    pub fn legend(self, bands: &ActiveBands, colours: &[RGBColor], most: usize) -> (Vec<LegendEntry>, usize) {
        let key = |b: usize| match self {
            ColourBy::Layer => bands.layer[b],
            ColourBy::Operator => bands.op[b],
            ColourBy::Stack => bands.stack[b],
            ColourBy::Category => u32::from(bands.category[b]),
        };
        // Each key's bytes and its first band (whose colour and category are the key's).
        let mut by_key: std::collections::HashMap<u32, (u64, usize)> = std::collections::HashMap::new();
        for b in 0..bands.len().min(colours.len()) {
            by_key.entry(key(b)).or_insert((0, b)).0 += bands.size_bytes[b];
        }
        if self == ColourBy::Stack {
            return (Vec::new(), by_key.len());
        }
        let mut keys: Vec<(u32, (u64, usize))> = by_key.into_iter().collect();
        keys.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
        let label = |k: u32, b: usize| match self {
            ColourBy::Category => bands.category_of(b).map_or_else(|| "unknown".to_owned(), |c| c.as_str().replace('_', " ")),
            _ if k == NONE => format!("(no {})", self.as_str()),
            _ => bands.names.get(k as usize).cloned().unwrap_or_default(),
        };
        let more = keys.len().saturating_sub(most);
        let entries = keys.into_iter().take(most).map(|(k, (bytes, b))| LegendEntry { label: label(k, b), colour: colours[b], bytes });
        (entries.collect(), more)
    }
}

/// How each band is shown: its colour, and whether it is dimmed (`pinned` lights the bands that
/// share its stack, or without stacks its layer and size; with `found`, a search's allocation
/// events, sorted, the others are dimmed).
pub fn band_styles(bands: &ActiveBands, colours: &[RGBColor], pinned: Option<usize>, found: Option<&[u32]>) -> Vec<(RGBColor, bool)> {
    let lit = pinned.filter(|&p| p < bands.len()).map(|p| (bands.stack[p], bands.layer[p], bands.size_bytes[p]));
    let shares = |b: usize| match lit {
        Some((stack, _, _)) if stack != NONE => bands.stack[b] == stack,
        Some((_, layer, size)) => bands.stack[b] == NONE && bands.layer[b] == layer && bands.size_bytes[b] == size,
        None => true,
    };
    let matched = |b: usize| found.is_none_or(|f| f.binary_search(&bands.event_index[b]).is_ok());
    colours.iter().enumerate().map(|(b, &c)| (c, !(shares(b) && matched(b)))).collect()
}

/// A band's outline over its runs, in (column, bytes): along its top, then back along its
/// bottom (a band's height never changes, its bottom steps where one below it was freed).
pub fn band_outline(bands: &ActiveBands, b: usize) -> Vec<(f64, f64)> {
    let size = bands.size_bytes[b] as f64;
    let mut pts = Vec::new();
    for r in bands.runs(b) {
        let top = bands.run_bottom[r] as f64 + size;
        pts.extend([(bands.run_column[r] as f64, top), (bands.run_end(r) as f64, top)]);
    }
    for r in bands.runs(b).rev() {
        let bottom = bands.run_bottom[r] as f64;
        pts.extend([(bands.run_end(r) as f64, bottom), (bands.run_column[r] as f64, bottom)]);
    }
    pts
}

/// The memory from before the trace as quads in (first column, columns after it, bytes): one
/// per run of columns holding the same.
pub fn before_trace_runs(a: &ActiveTimeline) -> Vec<(usize, usize, u64)> {
    let mut runs = Vec::new();
    let mut c = 0;
    while c < a.before_trace.len() {
        let v = a.before_trace[c];
        let end = (c..a.before_trace.len()).find(|&k| a.before_trace[k] != v).unwrap_or(a.before_trace.len());
        if v > 0 {
            runs.push((c, end, v));
        }
        c = end;
    }
    runs
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

/// The axes of the Active Memory Timeline over `window` (seconds) up to `top_bytes`: the
/// WebGL path draws its bands over them.
pub fn draw_active_axes(canvas: &HtmlCanvasElement, pal: &Palette, window: (f64, f64), top_bytes: u64) -> Res<ActiveMapping> {
    let root = area(canvas, pal)?;
    let (_, plot, ymax) = window_chart(&root, pal, window, top_bytes, 14)?;
    root.present().map_err(err)?;
    Ok(ActiveMapping { plot, ymax })
}

/// The Active Memory Timeline on a 2D canvas (the path where the browser has no WebGL2): the
/// memory from before the trace at the bottom, then every band over the columns it is drawn
/// in, in its style ([`band_styles`]); `pinned` is outlined.
pub fn draw_active(
    canvas: &HtmlCanvasElement,
    pal: &Palette,
    a: &ActiveTimeline,
    styles: &[(RGBColor, bool)],
    pinned: Option<usize>,
) -> Res<ActiveMapping> {
    let root = area(canvas, pal)?;
    let (mut chart, plot, ymax) = window_chart(&root, pal, (a.start_s, a.end_s), a.totals.iter().copied().max().unwrap_or(0), 14)?;
    let (t0, t1) = plot.x;
    let columns = a.totals.len();
    let mapping = ActiveMapping { plot, ymax };
    if columns == 0 {
        return Ok(mapping);
    }
    let width = (t1 - t0) / columns as f64;
    let at = |(c, y): (f64, f64)| (t0 + c * width, y);
    let grey = pal.grid.mix(0.9).filled();
    chart
        .draw_series(
            before_trace_runs(a).into_iter().map(|(c0, c1, v)| Rectangle::new([at((c0 as f64, 0.0)), at((c1 as f64, v as f64))], grey)),
        )
        .map_err(err)?;
    let bands = &a.bands;
    chart
        .draw_series(styles.iter().enumerate().map(|(b, &(colour, dim))| {
            let style = if dim { colour.mix(0.2).filled() } else { colour.filled() };
            Polygon::new(band_outline(bands, b).into_iter().map(at).collect::<Vec<_>>(), style)
        }))
        .map_err(err)?;
    if let Some(b) = pinned.filter(|&p| p < bands.len()) {
        let mut pts: Vec<(f64, f64)> = band_outline(bands, b).into_iter().map(at).collect();
        if let Some(&first) = pts.first() {
            pts.push(first);
        }
        chart.draw_series(std::iter::once(PathElement::new(pts, pal.highlight.stroke_width(2)))).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(mapping)
}
