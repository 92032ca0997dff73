//! The Active Memory Timeline: every allocation a band, coloured by what the user picks.

use super::{area, err, window_chart, Mapping, Palette, Res};
use plotters::prelude::*;
use shared::analysis::active::{ActiveBand, ActiveTimeline};
use web_sys::HtmlCanvasElement;

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
