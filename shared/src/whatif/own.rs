//! The allocator settings a trace's run had: the settings it started under (a snapshot's
//! `allocator_settings`, or what `collector trace` recorded: the environment's
//! `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF` and the effective values at the end), the
//! program's own changes (`_set_allocator_settings`, `set_per_process_memory_fraction`), and
//! whether they are known at all. Every replay (`whatif`, `advise`, the out-of-memory report)
//! starts from them, and the summary prints them.

use super::conf::{AllocConf, TorchRelease};
use crate::model::{EventType, Trace};
use crate::units::format_seconds;
use serde::{Deserialize, Serialize};

/// What a trace says of its allocator settings.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct OwnSettings {
    /// Whether the trace recorded its settings; else PyTorch's defaults are assumed.
    pub known: bool,
    /// The configuration the run's allocations were made under (its changes before the first
    /// allocation applied).
    pub conf: AllocConf,
    /// Memory fractions the program set: (CUDA device index, fraction, when in ns).
    pub memory_fractions: Vec<(Option<i32>, f64, u64)>,
    /// The first allocation, on the trace's clock: settings changed later are not replayed.
    first_alloc_ns: Option<u64>,
    /// Changes the program made while it ran (`TraceMeta::allocator_changes`).
    pub changes: usize,
    /// What could not be taken as recorded (unknown keys, changes mid-run).
    pub notes: Vec<String>,
}

/// The settings as the summary and `--json` show them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SettingsInfo {
    /// Whether the trace recorded its settings.
    pub known: bool,
    /// The effective `PYTORCH_CUDA_ALLOC_CONF`, canonically (empty: PyTorch's defaults).
    pub settings: String,
    /// The per-process memory fraction set on the peak's device, if any.
    pub memory_fraction: Option<f64>,
    /// Changes the program made while it ran.
    pub changes: usize,
    /// One line: `expandable_segments:True; memory fraction 0.5`, `PyTorch's defaults`, or
    /// `settings unknown, PyTorch's defaults assumed`.
    pub description: String,
    pub notes: Vec<String>,
}

/// Said of a trace that did not record its settings.
pub const UNKNOWN: &str = "settings unknown, PyTorch's defaults assumed";

impl OwnSettings {
    /// The fraction in effect for CUDA device `index` (the first one set for it, or for the
    /// current device when the program named none).
    pub fn fraction_for(&self, index: i32) -> Option<f64> {
        self.memory_fractions.iter().find(|(d, _, _)| d.is_none_or(|d| d == index)).map(|&(_, f, _)| f)
    }

    /// The settings as the summary shows them, for CUDA device `index`.
    pub fn info(&self, index: i32) -> SettingsInfo {
        let settings = self.conf.to_string();
        let fraction = self.fraction_for(index);
        let description = if !self.known {
            UNKNOWN.to_owned()
        } else {
            let mut d = if settings.is_empty() { "PyTorch's defaults".to_owned() } else { settings.clone() };
            if let Some(f) = fraction {
                d.push_str(&format!("; memory fraction {}", (f * 1e4).round() / 1e4));
            }
            d
        };
        SettingsInfo {
            known: self.known,
            settings,
            memory_fraction: fraction,
            changes: self.changes,
            description,
            notes: self.notes.clone(),
        }
    }
}

/// The settings `trace` ran under.
pub fn own_settings(trace: &Trace) -> OwnSettings {
    let release = trace.meta.pytorch_version.as_deref().and_then(TorchRelease::parse).unwrap_or(TorchRelease::NEWEST);
    let ev = &trace.events;
    let first_alloc_ns = (0..ev.len()).find(|&i| ev.event_type(i) == EventType::Alloc).map(|i| ev.ts_ns[i]);
    let mut own = OwnSettings { first_alloc_ns, changes: trace.meta.allocator_changes.len(), ..OwnSettings::default() };
    if let Some(v) = &trace.meta.allocator_settings {
        own.known = true;
        own.conf = match AllocConf::from_settings(v) {
            Ok(c) => c,
            Err(e) => {
                // The string alone, key by key: the keys it knows are still used.
                let text = v.get("PYTORCH_CUDA_ALLOC_CONF").and_then(|s| s.as_str()).unwrap_or("");
                let (conf, mut notes) = lenient(text, release);
                if notes.is_empty() {
                    notes.push(format!("the trace's allocator settings were not all read ({e}): the rest used"));
                }
                own.notes.extend(notes);
                conf
            }
        };
    }
    let start = trace.start_ns();
    for c in &trace.meta.allocator_changes {
        let before = own.first_alloc_ns.is_none_or(|t| c.ts_ns <= t);
        let when = format_seconds(c.ts_ns.saturating_sub(start) as f64 * 1e-9);
        if let Some(s) = &c.settings {
            if before {
                let (conf, notes) = lenient(s, release);
                own.conf = own.conf.overridden_by(&conf);
                own.notes.extend(notes);
            } else {
                own.notes.push(format!(
                    "the program changed the allocator settings to \"{s}\" at {when}, after its first allocation: the replay keeps the settings before it"
                ));
            }
        }
        if let Some(f) = c.memory_fraction {
            if !(0.0..=1.0).contains(&f) {
                // PyTorch refuses these; a file that holds one was not written by a run.
                own.notes.push(format!("a memory fraction of {f} (PyTorch takes 0 to 1) was left out of the replay"));
                continue;
            }
            if !before && own.fraction_for(c.device.unwrap_or(0)).is_some() {
                own.notes
                    .push(format!("the program set a memory fraction of {f} at {when}, after an earlier one: the replay keeps the first"));
            } else if !before {
                own.notes.push(format!(
                    "the program set a memory fraction of {f} at {when}, after its first allocation: the replay applies it from the start"
                ));
            }
            own.memory_fractions.push((c.device, f, c.ts_ns));
        }
    }
    own
}

/// Reads a `PYTORCH_CUDA_ALLOC_CONF` string as `release` does; where it cannot be read whole,
/// each setting alone: those it cannot read are named and left out, the rest used.
pub fn lenient(s: &str, release: TorchRelease) -> (AllocConf, Vec<String>) {
    if let Ok(c) = AllocConf::parse_for(s, release) {
        return (c, Vec::new());
    }
    let mut conf = AllocConf::default();
    let mut notes = Vec::new();
    for piece in top_level_pieces(s) {
        match AllocConf::parse_for(piece, release) {
            Ok(c) => conf = conf.overridden_by(&c),
            Err(e) => notes.push(format!("allocator setting \"{piece}\" left out of the replay ({e}); the others used")),
        }
    }
    (conf, notes)
}

/// `a:1,b:[64:2,>:1]` → `a:1`, `b:[64:2,>:1]`: commas outside brackets split, blanks dropped.
fn top_level_pieces(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().map(str::trim).filter(|p| !p.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AllocatorChange, SourceFormat, TraceMeta};

    #[test]
    fn unknown_keys_are_named_and_the_rest_used() {
        let (c, notes) = lenient("expandable_segments:True,no_such_key:3,roundup_power2_divisions:[256:2,>:1]", TorchRelease::NEWEST);
        assert!(c.expandable());
        assert_eq!(c.to_string(), AllocConf::parse("expandable_segments:True,roundup_power2_divisions:[256:2,>:1]").unwrap().to_string());
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("no_such_key:3"), "{notes:?}");
        assert_eq!(top_level_pieces(" a:1 ,, b:[1:2,>:1]"), ["a:1", "b:[1:2,>:1]"]);
    }

    #[test]
    fn a_trace_without_settings_says_they_are_unknown() {
        let t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        let own = own_settings(&t);
        assert!(!own.known);
        assert_eq!(own.info(0).description, UNKNOWN);
        let mut t = t;
        t.meta.allocator_settings = Some(serde_json::json!({}));
        assert_eq!(own_settings(&t).info(0).description, "PyTorch's defaults");
    }

    #[test]
    fn changes_before_the_first_allocation_apply_later_ones_are_said() {
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        t.meta.allocator_settings = Some(serde_json::json!({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}));
        let change = |ts_ns, settings: Option<&str>, memory_fraction| AllocatorChange {
            ts_ns,
            settings: settings.map(str::to_owned),
            memory_fraction,
            device: Some(0),
        };
        t.meta.allocator_changes =
            vec![change(0, Some("expandable_segments:True"), None), change(0, None, Some(0.5)), change(10, None, Some(0.25))];
        let own = own_settings(&t);
        assert!(own.conf.expandable() && own.conf.max_split_size_bytes == Some(128 << 20), "{}", own.conf);
        assert_eq!(own.fraction_for(0), Some(0.5));
        assert_eq!(own.info(0).description, format!("{}; memory fraction 0.5", own.conf));
        assert!(own.notes.is_empty(), "no allocation yet: every change comes before the first");
        // A fraction PyTorch would refuse (a hand-made or damaged file) is named and left out.
        t.meta.allocator_changes.insert(0, change(0, None, Some(f64::INFINITY)));
        let own = own_settings(&t);
        assert_eq!(own.fraction_for(0), Some(0.5));
        assert!(own.notes[0].contains("memory fraction of inf"), "{:?}", own.notes);
    }
}
