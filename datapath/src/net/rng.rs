//! The seeded randomness both topologies build on: splitmix64 to expand seeds and mix hashes,
//! and uniform draws from raw 64-bit values.

/// A strong 64-bit mixer (the splitmix64 finalizer).
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One step of splitmix64.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    mix64(*state)
}

/// A uniform float in `[0, 1)` from 53 random bits.
pub(crate) fn unit(r: u64) -> f64 {
    (r >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Whether an event of probability `p` fires, given a uniform draw `u` in `[0, 1)`: never
/// for `p` at or below 0 (or NaN), always for `p` at or above 1.
pub(crate) fn fires(u: f64, p: f64) -> bool {
    u < p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_its_reference_sequence() {
        // The first outputs of splitmix64 seeded with 0 (Vigna's reference implementation).
        let mut s = 0;
        assert_eq!(splitmix64(&mut s), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(&mut s), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn unit_spans_zero_to_one() {
        assert_eq!(unit(0), 0.0);
        assert!(unit(u64::MAX) < 1.0 && unit(u64::MAX) > 0.999_999);
        assert!(!fires(unit(0), 0.0) && fires(unit(u64::MAX), 1.0) && !fires(0.5, f64::NAN));
    }
}
