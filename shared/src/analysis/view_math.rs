//! The viewer's arithmetic, here so that it is tested natively: where a time window lies after
//! a zoom, a pan or a drag ([`zoomed`], [`panned`], [`dragged`], [`around`]), and where the
//! flame graph's boxes lie ([`flame_layout`]), which box is under a pixel ([`flame_box_at`]) and
//! what a search of the graph matches ([`flame_search`]). The viewer only draws what these give.

use super::flame::{FlameGraph, FlameNode};

/// A time window: (start, end) in seconds since the trace's start.
pub type Window = (f64, f64);

/// The narrowest window a zoom gives, in seconds (a tenth of a microsecond), or the whole
/// trace when it is shorter.
pub const MIN_SPAN_S: f64 = 1e-7;

/// Where a window of `span_s` seconds starting near `start_s` may start inside `full`. Not
/// `clamp`: rounding can make `span_s` a hair wider than `full`, and `clamp` panics when its
/// bounds cross.
pub fn window_start(start_s: f64, span_s: f64, full: Window) -> f64 {
    start_s.min(full.1 - span_s).max(full.0)
}

/// `w` zoomed by `factor` (below 1 zooms in) around `centre_s`, which keeps its place in the
/// window (under the pointer), inside `full`: never narrower than [`MIN_SPAN_S`] nor wider
/// than `full`.
pub fn zoomed(w: Window, factor: f64, centre_s: f64, full: Window) -> Window {
    let whole = full.1 - full.0;
    let span = ((w.1 - w.0) * factor).max(MIN_SPAN_S.min(whole)).min(whole);
    let f = (centre_s - w.0) / (w.1 - w.0).max(1e-12);
    let a = window_start(centre_s - span * f, span, full);
    (a, a + span)
}

/// `w` moved by `fraction` of its span (negative: earlier), inside `full`.
pub fn panned(w: Window, fraction: f64, full: Window) -> Window {
    let span = w.1 - w.0;
    let a = window_start(w.0 + span * fraction, span, full);
    (a, a + span)
}

/// The window a drag leaves: `w0`, the window when the drag began, moved with the pointer
/// (`dx_px` pixels on a plot `plot_px` wide, so the time grabbed stays under it), inside
/// `full`. `None` while the drag has moved no time.
pub fn dragged(w0: Window, dx_px: f64, plot_px: f64, full: Window) -> Option<Window> {
    let span = w0.1 - w0.0;
    let dt = dx_px / plot_px.max(1.0) * span;
    if dt == 0.0 {
        return None;
    }
    let a = window_start(w0.0 - dt, span, full);
    Some((a, a + span))
}

/// The window `share` of `full` wide on either side of `t_s`, cut at `full`'s ends ("zoom to
/// the peak").
pub fn around(t_s: f64, share: f64, full: Window) -> Window {
    let half = (full.1 - full.0) * share;
    ((t_s - half).max(full.0), (t_s + half).min(full.1))
}

/// Which weight the flame graph's widths show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlameMetric {
    /// Bytes still live at the allocated peak.
    LiveAtPeak,
    /// Bytes allocated over the whole trace.
    TotalAllocated,
}

impl FlameMetric {
    /// `n`'s weight.
    pub fn of(self, n: &FlameNode) -> u64 {
        match self {
            FlameMetric::LiveAtPeak => n.live_at_peak_bytes,
            FlameMetric::TotalAllocated => n.total_allocated_bytes,
        }
    }
}

/// Height of a flame-graph row in pixels (a box is one less, leaving a gap between rows).
pub const FLAME_ROW_PX: f64 = 18.0;

/// Boxes narrower than this many pixels are not laid out (their width still counts).
const NARROWEST_BOX_PX: f64 = 0.5;

/// A flame-graph box in pixels: node `node` of the graph, drawn at (`x`, `y`), `w` by `h`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlameBox {
    pub node: u32,
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

/// Lays the icicle out `width` pixels wide: `focus` spans the width on the row below its
/// ancestors (each full width too), and each node below it is as wide as its share of the
/// focus's `metric`, its children side by side from its left edge in the graph's order.
pub fn flame_layout(flame: &FlameGraph, focus: u32, metric: FlameMetric, width: f64) -> Vec<FlameBox> {
    let nodes = &flame.nodes;
    let Some(f) = nodes.get(focus as usize) else { return Vec::new() };
    let row = |r: f64, node: u32, x: f64, w: f64| FlameBox { node, x, y: r * FLAME_ROW_PX, w, h: FLAME_ROW_PX - 1.0 };
    // Ancestors, outermost first, full width above the focus.
    let mut chain = Vec::new();
    let mut p = f.parent;
    while let Some(a) = p {
        chain.push(a);
        p = nodes[a as usize].parent;
    }
    chain.reverse();
    let top = chain.len() as f64;
    let mut out: Vec<FlameBox> = chain.iter().enumerate().map(|(r, &a)| row(r as f64, a, 0.0, width)).collect();
    out.push(row(top, focus, 0.0, width));
    let scale = width / metric.of(f).max(1) as f64;
    // The next free x inside each node laid out, by index.
    let mut next_x: Vec<Option<f64>> = vec![None; nodes.len()];
    next_x[focus as usize] = Some(0.0);
    for (i, n) in nodes.iter().enumerate().skip(focus as usize + 1) {
        if n.depth <= f.depth {
            break; // left the focus's subtree (pre-order)
        }
        let Some(parent) = n.parent else { continue };
        let Some(x) = next_x[parent as usize] else { continue };
        let w = metric.of(n) as f64 * scale;
        next_x[parent as usize] = Some(x + w);
        if w < NARROWEST_BOX_PX {
            continue;
        }
        next_x[i] = Some(x);
        out.push(row(top + f64::from(n.depth - f.depth), i as u32, x, w));
    }
    out
}

/// The height in pixels that the rows of `boxes` take.
pub fn flame_height_px(boxes: &[FlameBox]) -> f64 {
    let rows = boxes.iter().map(|b| b.y).fold(0.0f64, f64::max) / FLAME_ROW_PX + 1.0;
    rows * FLAME_ROW_PX
}

/// The node whose box is under pixel (`x`, `y`); the gaps between rows hold none.
pub fn flame_box_at(boxes: &[FlameBox], x: f64, y: f64) -> Option<u32> {
    boxes.iter().rev().find(|b| x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + b.h).map(|b| b.node)
}

/// What a search of the flame graph matches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlameMatches {
    /// Nodes whose name contains the query.
    pub count: usize,
    /// The matching nodes' weight, a match inside another counted once (in the outer one).
    pub bytes: u64,
    /// `bytes` as a percentage of the root's weight.
    pub percent_of_root: f64,
}

/// The nodes whose name contains `query` (ignoring case), weighed by `metric`; `None` for an
/// empty query.
pub fn flame_search(flame: &FlameGraph, query: &str, metric: FlameMetric) -> Option<FlameMatches> {
    let q = query.to_lowercase();
    if q.is_empty() {
        return None;
    }
    let (mut count, mut bytes) = (0, 0u64);
    // Whether each node is, or is inside, a match.
    let mut inside: Vec<bool> = vec![false; flame.nodes.len()];
    for (i, n) in flame.nodes.iter().enumerate() {
        let parent_inside = n.parent.is_some_and(|p| inside[p as usize]);
        let is = n.name.to_lowercase().contains(&q);
        inside[i] = parent_inside || is;
        if is {
            count += 1;
            if !parent_inside {
                bytes += metric.of(n);
            }
        }
    }
    let root = flame.nodes.first().map_or(0, |r| metric.of(r)).max(1);
    Some(FlameMatches { count, bytes, percent_of_root: bytes as f64 * 100.0 / root as f64 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::flame::FlameKind;

    const FULL: Window = (0.0, 10.0);

    fn close(a: Window, b: Window) -> bool {
        (a.0 - b.0).abs() < 1e-9 && (a.1 - b.1).abs() < 1e-9
    }

    #[test]
    fn zoom_keeps_the_point_under_the_pointer_where_it_was() {
        let w = (2.0, 6.0);
        let z = zoomed(w, 0.5, 3.0, FULL);
        assert!(close(z, (2.5, 4.5)), "{z:?}");
        // 3 s was a quarter into the window, and still is.
        assert!(((3.0 - z.0) / (z.1 - z.0) - 0.25).abs() < 1e-12);
        // Zooming back out by the inverse factor returns the window.
        assert!(close(zoomed(z, 2.0, 3.0, FULL), w));
    }

    #[test]
    fn zoom_stays_inside_the_trace_and_never_wider_than_it() {
        assert!(close(zoomed(FULL, 4.0, 5.0, FULL), FULL));
        // Out near the end: the window slides back inside rather than past the end.
        assert!(close(zoomed((8.0, 10.0), 2.0, 9.9, FULL), (6.0, 10.0)));
        assert!(close(zoomed((0.0, 2.0), 2.0, 0.1, FULL), (0.0, 4.0)));
    }

    #[test]
    fn zoom_in_stops_at_the_narrowest_span() {
        let mut w = FULL;
        for _ in 0..100 {
            w = zoomed(w, 0.5, 5.0, FULL);
        }
        assert!((w.1 - w.0 - MIN_SPAN_S).abs() < 1e-15, "{w:?}");
        assert!(w.0 <= 5.0 && w.1 >= 5.0);
        // A trace shorter than the narrowest span is shown whole.
        let tiny = (0.0, MIN_SPAN_S / 2.0);
        assert_eq!(zoomed(tiny, 0.5, 0.0, tiny), tiny);
    }

    #[test]
    fn a_window_a_hair_wider_than_the_trace_starts_at_its_start() {
        let span = 10.0 + 1e-12;
        assert_eq!(window_start(3.0, span, FULL), 0.0);
        assert_eq!(window_start(-1.0, 2.0, FULL), 0.0);
        assert_eq!(window_start(9.0, 2.0, FULL), 8.0);
        assert_eq!(window_start(4.0, 2.0, FULL), 4.0);
    }

    #[test]
    fn pan_moves_by_a_share_of_the_span_and_stops_at_the_ends() {
        assert!(close(panned((2.0, 4.0), 0.2, FULL), (2.4, 4.4)));
        assert!(close(panned((2.0, 4.0), -0.2, FULL), (1.6, 3.6)));
        assert!(close(panned((2.0, 4.0), -10.0, FULL), (0.0, 2.0)));
        assert!(close(panned((2.0, 4.0), 10.0, FULL), (8.0, 10.0)));
    }

    #[test]
    fn drag_follows_the_pointer_and_stops_at_the_ends() {
        // 100 px of a 200 px plot showing 2 s: one second, earlier (the content moves right).
        assert!(close(dragged((2.0, 4.0), 100.0, 200.0, FULL).unwrap(), (1.0, 3.0)));
        assert!(close(dragged((2.0, 4.0), -100.0, 200.0, FULL).unwrap(), (3.0, 5.0)));
        assert!(close(dragged((2.0, 4.0), 1000.0, 200.0, FULL).unwrap(), (0.0, 2.0)));
        assert_eq!(dragged((2.0, 4.0), 0.0, 200.0, FULL), None);
        // A plot of no width is taken as one pixel.
        assert!(close(dragged((2.0, 4.0), 0.5, 0.0, FULL).unwrap(), (1.0, 3.0)));
    }

    #[test]
    fn around_a_moment_is_cut_at_the_trace_ends() {
        assert!(close(around(5.0, 0.02, FULL), (4.8, 5.2)));
        assert!(close(around(0.1, 0.02, FULL), (0.0, 0.3)));
        assert!(close(around(9.9, 0.02, FULL), (9.7, 10.0)));
    }

    fn node(name: &str, parent: Option<u32>, depth: u16, live: u64, total: u64) -> FlameNode {
        let kind = if parent.is_none() { FlameKind::Root } else { FlameKind::Module };
        FlameNode { name: name.into(), kind, parent, depth, live_at_peak_bytes: live, total_allocated_bytes: total }
    }

    /// root (1000 live) → a (600) → a.x (300); root → tiny (4: under half a pixel at 100 px);
    /// root → b (396) → b.conv (396), in pre-order.
    fn graph() -> FlameGraph {
        FlameGraph {
            nodes: vec![
                node("root", None, 0, 1000, 4000),
                node("a", Some(0), 1, 600, 1000),
                node("a.x", Some(1), 2, 300, 500),
                node("tiny", Some(0), 1, 4, 1000),
                node("b", Some(0), 1, 396, 2000),
                node("b.conv", Some(4), 2, 396, 2000),
            ],
            min_share: 0.0,
            nodes_left_out: 0,
        }
    }

    /// Checks each box's (node, x, width, row), and that each is a row high less the gap.
    fn assert_boxes(boxes: &[FlameBox], want: &[(u32, f64, f64, f64)]) {
        let got: Vec<(u32, f64, f64, f64)> = boxes.iter().map(|b| (b.node, b.x, b.w, b.y / FLAME_ROW_PX)).collect();
        let same = |g: &(u32, f64, f64, f64), w: &(u32, f64, f64, f64)| {
            g.0 == w.0 && (g.1 - w.1).abs() < 1e-9 && (g.2 - w.2).abs() < 1e-9 && g.3 == w.3
        };
        assert!(got.len() == want.len() && got.iter().zip(want).all(|(g, w)| same(g, w)), "{got:?}");
        assert!(boxes.iter().all(|b| b.h == FLAME_ROW_PX - 1.0));
    }

    #[test]
    fn flame_boxes_of_a_small_tree() {
        let boxes = flame_layout(&graph(), 0, FlameMetric::LiveAtPeak, 100.0);
        // The tiny node is left out, but its width pushes its right sibling over.
        assert_boxes(&boxes, &[(0, 0.0, 100.0, 0.0), (1, 0.0, 60.0, 1.0), (2, 0.0, 30.0, 2.0), (4, 60.4, 39.6, 1.0), (5, 60.4, 39.6, 2.0)]);
        assert_eq!(flame_height_px(&boxes), 3.0 * FLAME_ROW_PX);
    }

    #[test]
    fn flame_boxes_by_total_allocated() {
        let boxes = flame_layout(&graph(), 0, FlameMetric::TotalAllocated, 400.0);
        assert_boxes(
            &boxes,
            &[
                (0, 0.0, 400.0, 0.0),
                (1, 0.0, 100.0, 1.0),
                (2, 0.0, 50.0, 2.0),
                (3, 100.0, 100.0, 1.0),
                (4, 200.0, 200.0, 1.0),
                (5, 200.0, 200.0, 2.0),
            ],
        );
    }

    #[test]
    fn a_focused_node_spans_the_width_below_its_ancestors() {
        let boxes = flame_layout(&graph(), 1, FlameMetric::LiveAtPeak, 100.0);
        // The root above it, full width; a's child at half of it; b's subtree is not shown.
        assert_boxes(&boxes, &[(0, 0.0, 100.0, 0.0), (1, 0.0, 100.0, 1.0), (2, 0.0, 50.0, 2.0)]);
        assert!(flame_layout(&graph(), 99, FlameMetric::LiveAtPeak, 100.0).is_empty());
    }

    #[test]
    fn the_box_under_a_pixel() {
        let boxes = flame_layout(&graph(), 0, FlameMetric::LiveAtPeak, 100.0);
        assert_eq!(flame_box_at(&boxes, 10.0, 2.0 * FLAME_ROW_PX + 5.0), Some(2));
        assert_eq!(flame_box_at(&boxes, 70.0, FLAME_ROW_PX + 5.0), Some(4));
        assert_eq!(flame_box_at(&boxes, 99.0, 1.0), Some(0));
        // The gap under a row, the room right of a.x, and below the last row hold nothing.
        assert_eq!(flame_box_at(&boxes, 10.0, FLAME_ROW_PX - 0.5), None);
        assert_eq!(flame_box_at(&boxes, 45.0, 2.0 * FLAME_ROW_PX + 5.0), None);
        assert_eq!(flame_box_at(&boxes, 10.0, 3.0 * FLAME_ROW_PX + 5.0), None);
    }

    #[test]
    fn a_search_counts_a_match_inside_a_match_once() {
        let g = graph();
        // "A" matches a and a.x (inside a), and nothing else: a's bytes only.
        let m = flame_search(&g, "A", FlameMetric::LiveAtPeak).unwrap();
        assert_eq!((m.count, m.bytes), (2, 600));
        assert!((m.percent_of_root - 60.0).abs() < 1e-9);
        let m = flame_search(&g, "conv", FlameMetric::TotalAllocated).unwrap();
        assert_eq!((m.count, m.bytes), (1, 2000));
        assert!((m.percent_of_root - 50.0).abs() < 1e-9);
        assert_eq!(flame_search(&g, "", FlameMetric::LiveAtPeak), None);
        assert_eq!(flame_search(&g, "nothing", FlameMetric::LiveAtPeak).map(|m| (m.count, m.bytes)), Some((0, 0)));
    }
}
