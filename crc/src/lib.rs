//! CRC32C (Castagnoli) of a datagram.
//!
//! Datagrams of `FOLD_MIN` bytes and more go to the `crc-fast` crate, which folds the bytes
//! with carry-less multiplies (VPCLMULQDQ over 512-bit registers where the CPU has it,
//! PCLMULQDQ otherwise), several times the `crc32` instruction's own throughput at these
//! lengths (bench/results/crc-2026-12-03.md). Below that its set-up costs more than it
//! saves, and the bytes run through the `crc32` instruction here:
//!
//! - under 192 bytes as one chain of 8-byte steps;
//! - from 192 bytes as three interleaved chains. The instruction has a latency of 3 cycles
//!   and a throughput of one per cycle, so one dependent chain runs at a third of what the
//!   unit does. The datagram is split into three equal blocks and the chains are joined
//!   with a carry-less multiply (PCLMULQDQ) by a per-length constant from a table built at
//!   compile time.
//!
//! Without SSE4.2 (and PCLMULQDQ for three chains) every length goes to `crc-fast`, which
//! picks its own code for the CPU.
//!
//! A crate of its own because it needs `unsafe` (the CPU-feature-gated intrinsics), which
//! the engine's crate denies.
//!
//! The joining: the CRC register after block `A` then block `B` is the register after `A`,
//! multiplied by `x^(8|B|)` modulo the polynomial, XOR the register of `B` alone from zero
//! (the CRC is linear). With reflected 32-bit operands, the carry-less product of `r` and
//! `k` reduced by the `crc32` instruction from a zero register is `r k x^33`, so the
//! constant for a block of `8n` bytes is `x^(64n - 33)` modulo the polynomial.
#![warn(missing_docs, unreachable_pub)]

/// The reflected CRC32C polynomial.
const POLY: u32 = 0x82F6_3B78;

/// Datagrams this short go through one chain: joining costs more than it saves.
const THREE_WAY_MIN: usize = 192;

/// Datagrams this long go to `crc-fast`'s folding.
const FOLD_MIN: usize = 512;

/// Most 8-byte words per block of the three chains: a `FOLD_MIN - 1`-byte datagram's.
const MAX_BLOCK_WORDS: usize = (FOLD_MIN - 1) / 24;

/// `SHIFT[n]` is `x^(64n - 33)` modulo the polynomial, reflected, for `n` in
/// `1..=MAX_BLOCK_WORDS` (`SHIFT[0]` is unused).
static SHIFT: [u32; MAX_BLOCK_WORDS + 1] = shift_table();

/// `r x` modulo the polynomial, reflected.
const fn times_x(r: u32) -> u32 {
    if r & 1 != 0 { (r >> 1) ^ POLY } else { r >> 1 }
}

const fn shift_table() -> [u32; MAX_BLOCK_WORDS + 1] {
    let mut t = [0u32; MAX_BLOCK_WORDS + 1];
    // x^31 is the reflected value 1.
    let mut v = 1u32;
    let mut n = 1;
    while n <= MAX_BLOCK_WORDS {
        t[n] = v;
        let mut i = 0;
        while i < 64 {
            v = times_x(v);
            i += 1;
        }
        n += 1;
    }
    t
}

/// The CRC32C of `b`.
pub fn crc32c(b: &[u8]) -> u32 {
    crc32c_append(0, b)
}

/// The CRC32C of the bytes `crc` was the CRC of, followed by `b`.
pub fn crc32c_append(crc: u32, b: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if b.len() < FOLD_MIN && std::arch::is_x86_feature_detected!("sse4.2") {
        if b.len() < THREE_WAY_MIN {
            // SAFETY: the CPU has the feature the function is compiled for (checked above).
            return unsafe { one_chain(crc, b) };
        }
        if std::arch::is_x86_feature_detected!("pclmulqdq") {
            // SAFETY: the CPU has both features the function is compiled for (checked
            // above), and `THREE_WAY_MIN <= b.len() < FOLD_MIN` is the table's range.
            return unsafe { three_way(crc, b) };
        }
    }
    folded(crc, b)
}

/// [`crc32c_append`] by `crc-fast`. Its state is the CRC register before the final
/// inversion, as the `crc32` instruction's.
fn folded(crc: u32, b: &[u8]) -> u32 {
    let mut d =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(b);
    d.finalize() as u32
}

/// The CRC32C of `b` with the bytes at `zero` (clamped to `b`) taken as zeros: the CRC of a
/// datagram whose field at `zero` may change in flight. The bytes before, the zeros and the
/// bytes after are three appends, each short one a single chain of our own (the crate's
/// entry cost more than a short datagram's bytes; copying the head to mask it in place
/// cost a store-forwarding stall per datagram).
pub fn crc32c_masked(b: &[u8], zero: core::ops::Range<usize>) -> u32 {
    const ZEROS: [u8; 64] = [0; 64];
    let end = zero.end.min(b.len());
    let start = zero.start.min(end);
    let mut c = crc32c(&b[..start]);
    let mut left = end - start;
    while left > 0 {
        let n = left.min(ZEROS.len());
        c = crc32c_append(c, &ZEROS[..n]);
        left -= n;
    }
    crc32c_append(c, &b[end..])
}

/// [`crc32c_append`] as one chain of 8-byte steps (short datagrams: joining three chains
/// would cost more than it saves).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn one_chain(crc: u32, b: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u64};
    let mut c = u64::from(!crc);
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        c = _mm_crc32_u64(
            c,
            u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]),
        );
    }
    let mut c = c as u32;
    for &byte in words.remainder() {
        c = _mm_crc32_u8(c, byte);
    }
    !c
}

/// [`crc32c_append`] for `24 <= b.len() < 24 * (MAX_BLOCK_WORDS + 1)`, three chains.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn three_way(crc: u32, b: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u64};
    let words = b.len() / 24;
    let block = 8 * words;
    let (b0, rest) = b.split_at(block);
    let (b1, rest) = rest.split_at(block);
    let (b2, tail) = rest.split_at(block);
    let (mut c0, mut c1, mut c2) = (u64::from(!crc), 0u64, 0u64);
    for ((w0, w1), w2) in b0
        .chunks_exact(8)
        .zip(b1.chunks_exact(8))
        .zip(b2.chunks_exact(8))
    {
        c0 = _mm_crc32_u64(c0, word(w0));
        c1 = _mm_crc32_u64(c1, word(w1));
        c2 = _mm_crc32_u64(c2, word(w2));
    }
    let k = SHIFT[words];
    let c = shift(c0 as u32, k) ^ c1 as u32;
    let mut c = u64::from(shift(c, k) ^ c2 as u32);
    let mut words = tail.chunks_exact(8);
    for w in &mut words {
        c = _mm_crc32_u64(c, word(w));
    }
    let mut c = c as u32;
    for &byte in words.remainder() {
        c = _mm_crc32_u8(c, byte);
    }
    !c
}

/// The first 8 bytes of `c`, little-endian. Always inlined: as a closure, the compiler once
/// left it a call per word.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn word(c: &[u8]) -> u64 {
    u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
}

/// The CRC register `r` carried over a block whose constant is `k` (`SHIFT[words]`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn shift(r: u32, k: u32) -> u32 {
    use std::arch::x86_64::{
        _mm_clmulepi64_si128, _mm_crc32_u64, _mm_cvtsi32_si128, _mm_cvtsi128_si64,
    };
    let p = _mm_clmulepi64_si128::<0>(_mm_cvtsi32_si128(r as i32), _mm_cvtsi32_si128(k as i32));
    _mm_crc32_u64(0, _mm_cvtsi128_si64(p) as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_the_crate_at_every_length_and_start() {
        let data: Vec<u8> = (0..70_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let lens = (0..600).chain((600..70_000).step_by(97)).chain([
            1408,
            1472,
            4096,
            9000,
            FOLD_MIN - 1,
            FOLD_MIN,
            65_535,
        ]);
        for len in lens {
            for (start, init) in [(0usize, 0u32), (3, 0xdead_beef)] {
                let b = &data[start..start + len];
                assert_eq!(
                    crc32c_append(init, b),
                    crc32c::crc32c_append(init, b),
                    "length {len}, start {start}"
                );
            }
        }
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn a_masked_field_reads_as_zeros_wherever_it_lies() {
        let data: Vec<u8> = (0..3000u32)
            .map(|i| (i.wrapping_mul(2_246_822_519) >> 11) as u8)
            .collect();
        for len in [
            0usize, 1, 7, 27, 28, 29, 63, 64, 65, 100, 191, 192, 200, 1472, 3000,
        ] {
            let b = &data[..len];
            for zero in [
                26..28,
                0..2,
                0..64,
                60..70,
                62..64,
                63..65,
                100..300,
                5..5,
                2990..4000,
            ] {
                let mut z = b.to_vec();
                let (s, e) = (zero.start.min(len), zero.end.min(len));
                z[s..e.max(s)].fill(0);
                assert_eq!(
                    crc32c_masked(b, zero.clone()),
                    crc32c::crc32c(&z),
                    "length {len}, zeros {zero:?}"
                );
            }
        }
    }

    #[test]
    fn the_table_starts_at_x31_and_steps_by_x64() {
        assert_eq!(SHIFT[1], 1);
        let mut v = SHIFT[1];
        for _ in 0..64 {
            v = times_x(v);
        }
        assert_eq!(SHIFT[2], v);
    }
}
