//! Small pieces several views share, below them all (`xtask/src/layers.rs`).

use leptos::html::Canvas;
use leptos::prelude::*;
use plotters::style::RGBColor;

/// A button that saves `canvas` as `{name}.png`.
pub(crate) fn png_button(canvas: NodeRef<Canvas>, name: &'static str) -> impl IntoView {
    view! {
        <button class="small" title="Save this chart as PNG" on:click=move |_| {
            if let Some(c) = canvas.get() {
                if let Ok(url) = c.to_data_url() {
                    crate::dom::download_url(&format!("{name}.png"), &url);
                }
            }
        }>"PNG"</button>
    }
}

/// A ratio as a percentage with one decimal: `12.5 %`.
pub(crate) fn percent(ratio: f64) -> String {
    format!("{:.1} %", ratio * 100.0)
}

/// One entry of a chart's legend: a swatch of `colour` at `alpha` (as the chart blends it over
/// its background) and `label`; `key` names it for the tests (`data-key`), `title` says more.
pub(crate) fn legend_chip(key: String, colour: RGBColor, alpha: f64, label: String, title: String) -> impl IntoView {
    let RGBColor(r, g, b) = colour;
    view! {
        <span class="chip" data-key=key title=title>
            <span class="swatch" style=format!("background:rgba({r},{g},{b},{alpha})")></span>
            {label}
        </span>
    }
}
