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

/// An allocation's stack as the program's frames (`shown`, positions in `stack`, innermost
/// first), the runtime's folded behind a switch of their own; `open`: unfolded at first.
pub(crate) fn stack_view(stack: &[String], shown: &[u32], open: bool) -> impl IntoView {
    if stack.is_empty() {
        return view! { <span class="hint">"no stack recorded"</span> }.into_any();
    }
    let mine: Vec<String> = shown.iter().filter_map(|&i| stack.get(i as usize).cloned()).collect();
    let folded = stack.len() - mine.len();
    let first = mine.first().cloned().unwrap_or_else(|| format!("{folded} frames of torch and Python"));
    let full = stack.join("\n");
    view! {
        <details class="stack" open=open>
            <summary>{first}</summary>
            {(!mine.is_empty()).then(|| view! { <pre class="stack-shown">{mine.join("\n")}</pre> })}
            {(folded > 0).then(|| view! {
                <details class="stack-folded">
                    <summary class="hint">{format!("{folded} frames of torch and Python folded: show every frame")}</summary>
                    <pre>{full}</pre>
                </details>
            })}
        </details>
    }
    .into_any()
}
