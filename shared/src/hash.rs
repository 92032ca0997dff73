//! A fast, non-cryptographic hasher for the importers' and analyses' maps (FxHash, as in rustc
//! and rust-analyzer). Keys come from trace files read locally, where SipHash's resistance to
//! crafted collisions costs more (a third of a snapshot import) than it protects.
//!
//! FxHash's state alone leaves low bits that the keys leave zero at zero (addresses `k << 32`
//! all hash to multiples of 2^32, one bucket chain in a map that indexes by low bits, which a
//! hostile file could use to make an import quadratic), so `finish` mixes every bit of the
//! state into the low ones (MurmurHash3's 64-bit finaliser).

use std::hash::{BuildHasherDefault, Hasher};

#[derive(Clone, Copy, Default)]
pub struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(buf) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(i as u64);
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        let mut h = self.hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

pub type FastMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FxHasher>>;
pub type FastSet<K> = std::collections::HashSet<K, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::FxHasher;
    use std::hash::Hasher;

    /// Keys that differ only in their high bits (addresses `k << 32`) spread over a map's
    /// low-bit buckets instead of landing in one.
    #[test]
    fn high_bit_keys_spread_over_low_bits() {
        let buckets: std::collections::HashSet<u64> = (0..1024u64)
            .map(|k| {
                let mut h = FxHasher::default();
                h.write_u64(k << 32);
                h.finish() & 1023
            })
            .collect();
        assert!(buckets.len() > 600, "{} of 1024 buckets used", buckets.len());
    }
}
