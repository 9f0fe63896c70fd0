//! The hasher of the simulated networks' address tables.
//!
//! Why not the standard `HashMap` hasher: SipHash is there to resist hash flooding by
//! whoever chooses the keys, and it costs a couple of hundred instructions per lookup. The
//! keys here are the simulated hosts' own addresses, fixed when the topology is built, and a
//! lookup happens on every datagram sent; a multiply-and-rotate hash of the address words
//! (the scheme of rustc's FxHash), finished with the splitmix64 mixer so that hashbrown's
//! high control bits are well spread, costs a few. Lookups give the same answers either way:
//! the tables are only ever read by key, never iterated.
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;

use super::rng::mix64;

/// A map keyed by socket address with [`AddrHasher`].
pub(crate) type AddrMap<V> = HashMap<SocketAddr, V, BuildHasherDefault<AddrHasher>>;

/// A fast, non-cryptographic hasher for small keys; see the [module docs](self).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct AddrHasher(u64);

const K: u64 = 0xf135_7aea_2e62_a9c5;

impl AddrHasher {
    fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(K);
    }
}

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ (rest.len() as u64) << 59);
        }
    }

    fn write_u8(&mut self, x: u8) {
        self.add(u64::from(x));
    }

    fn write_u16(&mut self, x: u16) {
        self.add(u64::from(x));
    }

    fn write_u32(&mut self, x: u32) {
        self.add(u64::from(x));
    }

    fn write_u64(&mut self, x: u64) {
        self.add(x);
    }

    fn write_usize(&mut self, x: usize) {
        self.add(x as u64);
    }

    fn finish(&self) -> u64 {
        mix64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_address_and_nothing_else() {
        let mut m = AddrMap::default();
        let addr = |i: u32, port: u16| {
            SocketAddr::new(std::net::Ipv4Addr::from(0x0a00_0001 + i).into(), port)
        };
        for i in 0..4096u32 {
            assert!(m.insert(addr(i, 4791), i).is_none());
        }
        let v6: SocketAddr = "[fd00::1]:4791".parse().unwrap();
        m.insert(v6, u32::MAX);
        for i in 0..4096u32 {
            assert_eq!(m.get(&addr(i, 4791)), Some(&i));
            assert_eq!(m.get(&addr(i, 4792)), None);
        }
        assert_eq!(m.get(&v6), Some(&u32::MAX));
        assert_eq!(m.get(&"[fd00::2]:4791".parse().unwrap()), None);
    }

    #[test]
    fn nearby_addresses_spread() {
        // Consecutive host addresses land in distinct buckets of a small table.
        let mut seen = std::collections::HashSet::new();
        for i in 0..64u32 {
            let a = SocketAddr::new(std::net::Ipv4Addr::from(0x0a00_0001 + i).into(), 4791);
            let mut h = AddrHasher::default();
            std::hash::Hash::hash(&a, &mut h);
            seen.insert(h.finish() >> 57);
        }
        assert!(seen.len() > 32, "{}", seen.len());
    }
}
