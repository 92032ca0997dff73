//! The allocator's segment map at a moment as PyTorch's caching allocator would have had it
//! under another `PYTORCH_CUDA_ALLOC_CONF` (the Segments view's what-if).

use super::Session;
use crate::model::SegmentInfo;

impl Session {
    /// The shown device's segments after `event_index` replayed under `alloc_conf` on top of
    /// the run's own settings, with no device capacity (so no out-of-memory changes the map).
    pub(super) fn simulated_segments(&mut self, event_index: Option<usize>, alloc_conf: &str) -> Result<Vec<SegmentInfo>, String> {
        use crate::whatif::{requests, segments_after, AllocConf, SimOptions};
        if self.whatif.is_none() {
            self.whatif = Some(requests(self.trace()));
        }
        let Some(reqs) = &self.whatif else { return Err("no requests".into()) };
        // Read as `collector whatif` reads it: the newest release's rules.
        let user = AllocConf::parse(alloc_conf).map_err(|e| e.to_string())?;
        let conf = reqs.own_conf.overridden_by(&user);
        let device = self.device;
        let Some(dev) = reqs.devices.iter().find(|d| d.device == device) else {
            let name = self.trace().devices.get(device as usize).map_or_else(|| format!("device {device}"), |d| d.to_string());
            return Err(format!("{name} is not a CUDA device's caching allocator: nothing to replay"));
        };
        let event = event_index.map(|i| u32::try_from(i).unwrap_or(u32::MAX));
        segments_after(dev, &conf, &SimOptions::default(), event).map_err(|e| e.to_string())
    }
}
