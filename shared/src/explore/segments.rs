//! The allocator's segment map at a moment as PyTorch's caching allocator would have had it
//! under another `PYTORCH_CUDA_ALLOC_CONF` (the Segments view's what-if).

use super::{ExploreError, Session};
use crate::model::SegmentInfo;

impl Session {
    /// The shown device's segments after `event_index` replayed under `alloc_conf` on top of
    /// the run's own settings, with no device capacity (so no out-of-memory changes the map).
    pub(super) fn simulated_segments(&mut self, event_index: Option<usize>, alloc_conf: &str) -> Result<Vec<SegmentInfo>, ExploreError> {
        use crate::whatif::{requests, segments_after, AllocConf, SimOptions};
        if self.whatif.is_none() {
            self.whatif = Some(requests(self.trace()));
        }
        let Some(reqs) = &self.whatif else { return Err(ExploreError::NoRequests) };
        // Read as `collector whatif` reads it: the newest release's rules.
        let user = AllocConf::parse(alloc_conf)?;
        let conf = reqs.own_conf.overridden_by(&user);
        let device = self.device;
        let Some(dev) = reqs.devices.iter().find(|d| d.device == device) else {
            let device = self.trace().devices.get(device as usize).map_or_else(|| format!("device {device}"), |d| d.to_string());
            return Err(ExploreError::NotCaching { device });
        };
        let event = event_index.map(|i| u32::try_from(i).unwrap_or(u32::MAX));
        Ok(segments_after(dev, &conf, &SimOptions::default(), event)?)
    }
}
