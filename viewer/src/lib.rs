//! Memory Tracer's viewer: a single page that opens a trace (drop, file picker, `?trace=URL`,
//! or the trace a static report carries), imports and analyses it in a Web Worker with `shared`
//! compiled to WebAssembly, and draws every view. Nothing is uploaded anywhere.
//!
//! The page never holds the trace: the worker does, and answers small questions ("the
//! timeline between these times at this many pixels", "what is live here") as the user zooms,
//! hovers and clicks ([`shared::explore`]).
//!
//! Several files dropped or chosen at once are the ranks of one job: the worker merges them,
//! and the Ranks view shows them side by side. "Compare with…" compares the open trace with
//! another.
//!
//! Every view is a component in [`components`]; [`state`] says who gets which signals;
//! [`bridge`] talks to the worker (messages in [`messages`]) and to `collector serve`
//! ([`server`]).

pub mod bridge;
pub mod charts;
pub mod components;
mod dom;
mod http;
pub mod messages;
pub mod perf;
pub mod ring;
pub mod server;
pub mod state;
pub mod tables;
mod widgets;

pub use components::App;
