//! Boxes: the allocator's segments and their blocks, and the flame graph.

use super::{area, err, font, Palette, Res};
use plotters::prelude::*;
use shared::analysis::flame::{FlameGraph, FlameKind};
use shared::analysis::view_math::FlameBox;
use shared::model::{BlockState, SegmentInfo};
use shared::units::format_bytes;
use web_sys::HtmlCanvasElement;

/// The allocator's segments, one row each in address order, blocks coloured by state, a
/// segment of `full_width_bytes` as wide as the plot (maps drawn side by side are given the
/// same, so that their bars compare). Returns how many segments did not fit.
pub fn draw_segments(
    canvas: &HtmlCanvasElement,
    pal: &Palette,
    segments: &[SegmentInfo],
    row_height: u32,
    full_width_bytes: u64,
) -> Res<usize> {
    let root = area(canvas, pal)?;
    let (w, h) = root.dim_in_pixel();
    let rows = ((h.saturating_sub(4)) / row_height) as usize;
    let largest = segments.iter().map(|s| s.size_bytes).max().unwrap_or(1).max(full_width_bytes).max(1) as f64;
    let width = (w as f64 - 110.0).max(10.0);
    let scale = width / largest;
    for (r, seg) in segments.iter().take(rows).enumerate() {
        let y = 2 + r as i32 * row_height as i32;
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
