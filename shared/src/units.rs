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
}
