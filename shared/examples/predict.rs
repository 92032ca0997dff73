//! Predicted peaks of a trace under checkpointing and autocast, against measured ones:
//!
//!     cargo run --release -p shared --example predict -- TRACE AMP_MEASURED BOTH_MEASURED LAYERS
//!
//! LAYERS are comma-separated module paths; the measured peaks come from the runs with
//! `--amp` and with `--checkpoint LAYERS --amp` (`collector advise --verify` prints them).

use shared::analysis::advice::predict_peak;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path, amp, both, layers] = args.as_slice() else {
        return Err("usage: predict TRACE AMP_MEASURED BOTH_MEASURED LAYERS".into());
    };
    let trace = shared::import(&std::fs::read(path)?, &shared::ImportOptions::default())?;
    let layers: Vec<String> = layers.split(',').map(str::to_owned).collect();
    let pct = |p: u64, m: &str| -> Result<String, Box<dyn std::error::Error>> {
        let m: f64 = m.parse()?;
        Ok(format!("{p} vs {m} ({:+.1} %)", (m - p as f64) / m * 100.0))
    };
    let a = predict_peak(&trace, &[], true).ok_or("no prediction")?;
    let b = predict_peak(&trace, &layers, true).ok_or("no prediction")?;
    println!("{path}: amp {}; checkpoint + amp {}", pct(a, amp)?, pct(b, both)?);
    Ok(())
}
