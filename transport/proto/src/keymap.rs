//! Hash maps keyed by the engine's own 32-bit identifiers (QP numbers, local and remote
//! keys, completion queue ids), looked up for every received packet and every post (the
//! runtime's tables of regions and completion queues use them too).
//!
//! The standard library's SipHash costs about a hundred instructions per lookup, which is a
//! noticeable share of a packet; it buys resistance to keys an attacker chooses. Here the
//! attacker chooses none: every key in these maps was drawn by the endpoint from its seeded
//! RNG (`Shared::random_nonzero`), so the keys are uniformly spread whatever the peer sends,
//! and a lookup of a hostile key probes as few buckets as any other. A multiplicative hash
//! (Fibonacci hashing) that spreads the key over all 64 bits is then enough, at a few
//! instructions. Written here rather than taken from a crate because it is ten lines and
//! the argument for its safety is this module's, not a general one.
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from an engine-drawn 32-bit identifier to `V`.
pub type KeyMap<V> = HashMap<u32, V, BuildHasherDefault<KeyHasher>>;

/// A new, empty [`KeyMap`].
pub(crate) fn key_map<V>() -> KeyMap<V> {
    HashMap::default()
}

/// Fibonacci hashing of one `u32` (see the module documentation for why it is enough).
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

/// 2^64 divided by the golden ratio, odd: multiplying by it spreads every input bit upward.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        // The product's high bits mix every key bit; fold them down too, since the table
        // picks buckets by the low bits and its tags by the top seven.
        let h = self.0.wrapping_mul(GOLDEN);
        h ^ (h >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u32` is used by `KeyMap`; any other input still hashes, byte by byte.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(GOLDEN);
        }
    }

    fn write_u32(&mut self, k: u32) {
        self.0 = (self.0 << 32) | u64::from(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn map_finds_what_it_holds_and_nothing_else() {
        let mut m = key_map();
        for k in 0..10_000u32 {
            m.insert(k.wrapping_mul(2_654_435_761), k);
        }
        for k in 0..10_000u32 {
            assert_eq!(m.get(&k.wrapping_mul(2_654_435_761)), Some(&k));
        }
        assert_eq!(m.get(&1), None);
    }

    #[test]
    fn consecutive_keys_land_in_different_buckets_and_tags() {
        // The low bits (bucket) and the top seven (tag) both vary across small keys.
        let b = BuildHasherDefault::<KeyHasher>::default();
        let hashes: Vec<u64> = (0..128u32).map(|k| b.hash_one(k)).collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 127).collect();
        let top: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(low.len() > 64, "low bits spread: {}", low.len());
        assert!(top.len() > 64, "top bits spread: {}", top.len());
    }
}
