//! Human-readable units for sizes and durations (binary prefixes: KiB, MiB, GiB).

/// `1536` → `1.50 KiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

/// Ticks of a byte axis that starts at 0: round multiples of one binary unit.
#[derive(Clone, Debug, PartialEq)]
pub struct ByteTicks {
    /// Tick values in bytes, from 0 to `end`.
    pub ticks: Vec<f64>,
    /// The axis end: the last tick, at or above the largest value.
    pub end: f64,
    /// The unit every label is written in (1024^k bytes) and its name.
    pub unit: f64,
    pub unit_name: &'static str,
}

impl ByteTicks {
    /// `0`, `256 MiB`, `0.5 GiB`: the value in the axis unit, without trailing zeros.
    pub fn label(&self, bytes: f64) -> String {
        if bytes == 0.0 {
            return "0".to_owned();
        }
        let v = format!("{:.3}", bytes / self.unit);
        format!("{} {}", v.trim_end_matches('0').trim_end_matches('.'), self.unit_name)
    }
}

/// Ticks for an axis from 0 to `max_bytes`, at most `max_ticks` past zero, at round values of
/// one binary unit (0, 256 MiB, 512 MiB, 768 MiB, …; or 0, 0.5 GiB, 1 GiB, …): the unit is the
/// largest power of 1024 not above `max_bytes`, the step the smallest of 1/8, 1/4, 1/2, 1, 2,
/// 4, … 512 units that needs no more than `max_ticks` ticks.
pub fn byte_ticks(max_bytes: f64, max_ticks: usize) -> ByteTicks {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let max = if max_bytes.is_finite() && max_bytes > 0.0 { max_bytes } else { 1.0 };
    let max_ticks = max_ticks.max(1) as f64;
    let mut k = 0;
    while k + 1 < UNITS.len() && max >= 1024f64.powi(k as i32 + 1) {
        k += 1;
    }
    let unit = 1024f64.powi(k as i32);
    let in_units = max / unit;
    let first = if k == 0 { 0 } else { -3 };
    let step = (first..=10).map(|e| 2f64.powi(e)).find(|s| (in_units / s).ceil() <= max_ticks).unwrap_or(1024.0);
    let n = (in_units / step).ceil().max(1.0) as usize;
    let ticks: Vec<f64> = (0..=n).map(|i| i as f64 * step * unit).collect();
    ByteTicks { end: n as f64 * step * unit, ticks, unit, unit_name: UNITS[k] }
}

/// Seconds to `12.3 µs`, `4.56 ms`, `7.89 s`.
pub fn format_seconds(s: f64) -> String {
    let a = s.abs();
    if a == 0.0 {
        "0 s".to_owned()
    } else if a < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if a < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

/// A size that [`parse_size`] could not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected a size such as 6GiB, 512MiB, 1.5GB or 1073741824 (bytes), got `{input}`: {why}")]
pub struct ParseSizeError {
    pub input: String,
    pub why: &'static str,
}

/// `6GiB`, `512 MiB`, `1.5GB`, `2g`, `1073741824` → bytes. Binary units (KiB, MiB, GiB, TiB,
/// and K, M, G, T as `ls -h` writes them) are powers of 1024; KB, MB, GB, TB are powers of
/// 1000; case does not matter; fractions are rounded to the nearest byte.
pub fn parse_size(text: &str) -> Result<u64, ParseSizeError> {
    let err = |why| ParseSizeError { input: text.to_owned(), why };
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    if number.is_empty() {
        return Err(err(if t.starts_with('-') { "sizes cannot be negative" } else { "no number" }));
    }
    let value: f64 = number.parse().map_err(|_| err("not a number"))?;
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(err("unknown unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    let bytes = (value * scale).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err("too large"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_binary_units_and_times() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(110_388_224), "105.27 MiB");
        assert_eq!(format_seconds(0.0000123), "12.3 µs");
        assert_eq!(format_seconds(0.00456), "4.56 ms");
        assert_eq!(format_seconds(7.891), "7.891 s");
    }

    #[test]
    fn byte_ticks_are_round_in_one_binary_unit() {
        // 1e9 bytes: not 476.84 MiB, 953.67 MiB (decimal steps), but quarter-GiB steps in MiB.
        let t = byte_ticks(1e9, 6);
        let labels: Vec<String> = t.ticks.iter().map(|&v| t.label(v)).collect();
        assert_eq!(labels, ["0", "256 MiB", "512 MiB", "768 MiB", "1024 MiB"]);
        assert!(t.end >= 1e9);
        let t = byte_ticks(1.5 * 1024f64.powi(3), 6);
        let labels: Vec<String> = t.ticks.iter().map(|&v| t.label(v)).collect();
        assert_eq!(labels, ["0", "0.25 GiB", "0.5 GiB", "0.75 GiB", "1 GiB", "1.25 GiB", "1.5 GiB"]);
        let t = byte_ticks(700.0, 5);
        assert_eq!(t.ticks, [0.0, 256.0, 512.0, 768.0]);
        assert_eq!(t.label(256.0), "256 B");
        // Every size from bytes to terabytes: at most max_ticks steps, each a power of two of
        // the unit, ending at or above the value.
        let mut v = 1.0;
        while v < 1e13 {
            let t = byte_ticks(v, 6);
            let step = t.ticks[1] / t.unit;
            assert!(t.ticks.len() <= 7 && t.end >= v, "{v}: {t:?}");
            assert_eq!(step.log2().fract(), 0.0, "{v}: step {step} of {}", t.unit_name);
            v *= 1.37;
        }
        assert_eq!(byte_ticks(0.0, 6).ticks, [0.0, 1.0]);
    }
}
