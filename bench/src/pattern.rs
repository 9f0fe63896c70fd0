//! Data patterns that differ per message, so a stale or misplaced byte is caught.

/// One step of SplitMix64.
fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `out` with the pattern of message `tag`: a pseudo-random stream seeded by the tag.
/// Two different tags give different bytes (with overwhelming probability) at every offset.
pub fn fill(tag: u64, out: &mut [u8]) {
    let mut state = tag ^ 0xD1B5_4A32_D192_ED03;
    let mut chunks = out.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&splitmix(&mut state).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let w = splitmix(&mut state).to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&w[..n]);
    }
}

/// The pattern of message `tag`, `len` bytes long.
pub fn make(tag: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(tag, &mut v);
    v
}

/// Index of the first byte where `got` differs from `want`, if any.
pub fn first_mismatch(got: &[u8], want: &[u8]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    if got == want {
        return None;
    }
    got.iter().zip(want).position(|(a, b)| a != b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_per_tag_and_are_stable() {
        let a = make(1, 37);
        assert_eq!(a, make(1, 37));
        assert_ne!(a, make(2, 37));
        assert_eq!(first_mismatch(&a, &a), None);
        let mut b = a.clone();
        b[20] ^= 1;
        assert_eq!(first_mismatch(&b, &a), Some(20));
    }
}
