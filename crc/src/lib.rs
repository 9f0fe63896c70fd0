//! CRC32C (Castagnoli) of a datagram.
//!
//! Datagrams of `FOLD_MIN` bytes and more are folded with carry-less multiplies, several
//! times the `crc32` instruction's own throughput at these lengths
//! (bench/results/crc-2026-12-03.md): by our own 512-bit fold where the CPU has AVX-512 with
//! VPCLMULQDQ (the one [`copy_append`] runs, without its stores; at datagram lengths it
//! costs about 0.6 of the crate's call, bench/results/engine-cost-2026-12-05.md), else by
//! the `crc-fast` crate (PCLMULQDQ). Below that the set-up costs more than it saves, and
//! the bytes run through the `crc32` instruction here:
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
//! [`copy_append`] copies and checksums in one pass, folding the values it loads for the
//! copy (AVX-512 VPCLMULQDQ): the sender's gather out of a registered region, where a
//! separate CRC would reload bytes just stored.
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
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if b.len() >= FOLD_MIN && fold_cpu() {
        // SAFETY: `b` is readable for its length, at least 64; the CPU has the features
        // (checked above).
        return unsafe { fold_only(crc, b.as_ptr(), b.len()) };
    }
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
/// datagram whose field at `zero` may change in flight. When the field holds zeros already
/// (a sender's own datagram, or one no switch stamped) that is the plain CRC, in one call;
/// else the bytes before, the zeros and the bytes after are three appends, each short one a
/// single chain of our own (the crate's entry cost more than a short datagram's bytes;
/// copying the head to mask it in place cost a store-forwarding stall per datagram).
pub fn crc32c_masked(b: &[u8], zero: core::ops::Range<usize>) -> u32 {
    const ZEROS: [u8; 64] = [0; 64];
    let end = zero.end.min(b.len());
    let start = zero.start.min(end);
    if b[start..end].iter().all(|&x| x == 0) {
        return crc32c(b);
    }
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

/// Shortest copy [`copy_append`] folds (below it the plain copy and a separate CRC cost less
/// than setting up the fold).
pub const COPY_FOLD_MIN: usize = 256;

/// `x^n` modulo the polynomial, reflected (bit 31 is `x^0`).
const fn x_pow(n: u32) -> u32 {
    let mut v = 0x8000_0000u32;
    let mut i = 0;
    while i < n {
        v = times_x(v);
        i += 1;
    }
    v
}

/// The two 64-bit multipliers that carry a 16-byte lane `d` bits forward: the lane's first 8
/// bytes by `x^(d + 63)`, its last 8 by `x^(d - 1)`, each remainder in the high half (the
/// carry-less product of two reflected operands is one power of `x` short, which the `- 1`
/// makes up).
const fn fold_keys(d: u32) -> (u64, u64) {
    ((x_pow(d + 63) as u64) << 32, (x_pow(d - 1) as u64) << 32)
}

const FOLD_2048: (u64, u64) = fold_keys(2048);
const FOLD_1536: (u64, u64) = fold_keys(1536);
const FOLD_1024: (u64, u64) = fold_keys(1024);
const FOLD_512: (u64, u64) = fold_keys(512);
const FOLD_384: (u64, u64) = fold_keys(384);
const FOLD_256: (u64, u64) = fold_keys(256);
const FOLD_128: (u64, u64) = fold_keys(128);

/// Copies `len` bytes (a multiple of 8) from `src` to `dst` and returns the CRC32C of the
/// bytes `crc` was the CRC of followed by the copied bytes, computed from the very values
/// loaded for the copy (one pass: the CRC never reloads the bytes just stored, which costs
/// more than the copy and the CRC apart, bench/results/copy-crc-fold-2026-12-03.md).
/// Returns `None`, copying nothing, when this CPU lacks AVX-512 with VPCLMULQDQ or `len` is
/// below [`COPY_FOLD_MIN`]: the caller copies and checksums its own way.
///
/// `src` is read only by inline assembly, 64-byte vector loads then 8-byte loads, so it may
/// be memory that others access atomically (a registered region's words): assembly is
/// opaque to the Rust abstract machine, and each aligned 8-byte part of such a load is one
/// untorn relaxed load.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `len` bytes, not overlapping.
pub unsafe fn copy_append(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> Option<u32> {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if len >= COPY_FOLD_MIN && len.is_multiple_of(8) && fold_cpu() {
        // SAFETY: the caller's contract; the CPU has the features (checked above).
        return Some(unsafe { copy_fold(crc, dst, src, len) });
    }
    let _ = (crc, dst, src, len);
    None
}

/// [`crc32c_append`] of the `len` bytes at `src` (a multiple of 8), read only by inline
/// assembly, 64-byte vector loads then 8-byte loads, as [`copy_append`] reads its source: so
/// `src` may be memory that others access atomically (a registered region's words). Returns
/// `None`, reading nothing, when this CPU lacks AVX-512 with VPCLMULQDQ or `len` is below
/// [`COPY_FOLD_MIN`]: the caller reads the words its own way.
///
/// # Safety
/// `src` valid for reads of `len` bytes.
pub unsafe fn append_words(crc: u32, src: *const u8, len: usize) -> Option<u32> {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if len >= COPY_FOLD_MIN && len.is_multiple_of(8) && fold_cpu() {
        // SAFETY: the caller's contract; the CPU has the features (checked above); `len`
        // is a multiple of 8, so `fold` never reaches its byte loop (plain loads).
        return Some(unsafe { fold_only(crc, src, len) });
    }
    let _ = (crc, src, len);
    None
}

/// Whether the CPU has what [`copy_fold`] is compiled for (probed once).
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn fold_cpu() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    static LEVEL: AtomicU8 = AtomicU8::new(0);
    match LEVEL.load(Relaxed) {
        0 => {
            let ok = std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("vpclmulqdq")
                && std::arch::is_x86_feature_detected!("pclmulqdq")
                && std::arch::is_x86_feature_detected!("sse4.2");
            LEVEL.store(if ok { 2 } else { 1 }, Relaxed);
            ok
        }
        l => l == 2,
    }
}

/// [`copy_append`] for `len >= 64`, a multiple of 8: each 64-byte block is loaded into one
/// register, stored, and folded into a 512-bit accumulator (four 16-byte lanes, each carried
/// 512 bits forward by carry-less multiplies and XORed with the next block's); the four
/// lanes are then folded into one, which the `crc32` instruction reduces as if it were 16
/// message bytes (it is congruent to all the bytes before it), and the last words go
/// through the instruction as they are copied. The initial register is XORed into the first
/// four bytes, as the instruction itself does.
///
/// # Safety
/// As [`copy_append`], and the CPU has AVX-512F, VPCLMULQDQ, PCLMULQDQ and SSE4.2.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
unsafe fn copy_fold(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    debug_assert!(len >= 64 && len.is_multiple_of(8));
    // SAFETY: the caller's contract, which is `fold`'s with `COPY`.
    unsafe { fold::<true>(crc, dst, src, len) }
}

/// [`crc32c_append`] of the `len >= 64` bytes at `src` by the same folding as
/// [`copy_fold`], without the copy: the receiver's check of a whole datagram. At 1408 bytes
/// it costs about half of `crc-fast`'s call on this CPU, whose set-up and final reduction
/// are a large share at datagram lengths (bench/results/engine-cost-2026-12-05.md).
///
/// # Safety
/// `src` readable for `len` bytes; the CPU has AVX-512F, VPCLMULQDQ, PCLMULQDQ and SSE4.2.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
unsafe fn fold_only(crc: u32, src: *const u8, len: usize) -> u32 {
    debug_assert!(len >= 64);
    // SAFETY: the caller's contract; without `COPY`, `dst` is never used.
    unsafe { fold::<false>(crc, core::ptr::null_mut(), src, len) }
}

/// The folding of [`copy_fold`] (`COPY`: each loaded value is stored at `dst` too, and
/// `len` is a multiple of 8) and [`fold_only`] (any `len >= 64`; the bytes after the last
/// whole word go through the `crc32` instruction one at a time).
///
/// # Safety
/// As [`copy_fold`] when `COPY`, as [`fold_only`] otherwise.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
#[inline]
unsafe fn fold<const COPY: bool>(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    use core::arch::asm;
    use std::arch::x86_64::*;
    let block = |i: usize| -> __m512i {
        let v: __m512i;
        // SAFETY: `i * 64 + 64 <= len`, so the 64 bytes at `src + i*64` are readable and,
        // when `COPY`, at `dst + i*64` writable (the caller's contract, `i < blocks`); the
        // source is read by one vector load, as braid-proto's region copies read it.
        unsafe {
            if COPY {
                asm!(
                    "vmovdqu64 {v}, zmmword ptr [{s}]",
                    "vmovdqu64 zmmword ptr [{d}], {v}",
                    s = in(reg) src.add(i * 64),
                    d = in(reg) dst.add(i * 64),
                    v = out(zmm_reg) v,
                    options(nostack, preserves_flags),
                );
            } else {
                asm!(
                    "vmovdqu64 {v}, zmmword ptr [{s}]",
                    s = in(reg) src.add(i * 64),
                    v = out(zmm_reg) v,
                    options(nostack, preserves_flags, readonly),
                );
            }
        }
        v
    };
    let blocks = len / 64;
    let keys = |k: (u64, u64)| {
        _mm512_set_epi64(
            k.1 as i64, k.0 as i64, k.1 as i64, k.0 as i64, k.1 as i64, k.0 as i64, k.1 as i64,
            k.0 as i64,
        )
    };
    // `v` carried forward by `k`'s distance, XOR `b`.
    let fold = |v: __m512i, k: __m512i, b: __m512i| {
        let lo = _mm512_clmulepi64_epi128::<0x00>(v, k);
        let hi = _mm512_clmulepi64_epi128::<0x11>(v, k);
        _mm512_ternarylogic_epi64::<0x96>(lo, hi, b)
    };
    let init = _mm512_zextsi128_si512(_mm_cvtsi32_si128(!crc as i32));
    let k512 = keys(FOLD_512);
    let (mut x, mut next) = if blocks >= 8 {
        // Four accumulators over blocks 4i..4i+3, each carried 2048 bits at a step, so the
        // multiplies of one step do not wait for each other; then joined into one.
        let k2048 = keys(FOLD_2048);
        let mut a = [
            _mm512_xor_si512(block(0), init),
            block(1),
            block(2),
            block(3),
        ];
        let mut i = 4;
        while i + 4 <= blocks {
            for (j, acc) in a.iter_mut().enumerate() {
                *acc = fold(*acc, k2048, block(i + j));
            }
            i += 4;
        }
        let x = fold(a[0], keys(FOLD_1536), fold(a[1], keys(FOLD_1024), a[3]));
        (
            _mm512_xor_si512(x, fold(a[2], k512, _mm512_setzero_si512())),
            i,
        )
    } else {
        (_mm512_xor_si512(block(0), init), 1)
    };
    while next < blocks {
        x = fold(x, k512, block(next));
        next += 1;
    }
    let lane = |v: __m128i, k: (u64, u64)| -> __m128i {
        let k = _mm_set_epi64x(k.1 as i64, k.0 as i64);
        _mm_xor_si128(
            _mm_clmulepi64_si128::<0x00>(v, k),
            _mm_clmulepi64_si128::<0x11>(v, k),
        )
    };
    let r = _mm_xor_si128(
        _mm_xor_si128(
            lane(_mm512_extracti32x4_epi32::<0>(x), FOLD_384),
            lane(_mm512_extracti32x4_epi32::<1>(x), FOLD_256),
        ),
        _mm_xor_si128(
            lane(_mm512_extracti32x4_epi32::<2>(x), FOLD_128),
            _mm512_extracti32x4_epi32::<3>(x),
        ),
    );
    let mut c = _mm_crc32_u64(0, _mm_cvtsi128_si64(r) as u64);
    c = _mm_crc32_u64(c, _mm_extract_epi64::<1>(r) as u64);
    let mut at = blocks * 64;
    while at + 8 <= len {
        let w: u64;
        // SAFETY: `at + 8 <= len`: readable at `src + at` and, when `COPY`, writable at
        // `dst + at`; one 8-byte load, as braid-proto's region copies do.
        unsafe {
            if COPY {
                asm!(
                    "mov {w}, qword ptr [{s}]",
                    "mov qword ptr [{d}], {w}",
                    s = in(reg) src.add(at),
                    d = in(reg) dst.add(at),
                    w = out(reg) w,
                    options(nostack, preserves_flags),
                );
            } else {
                asm!(
                    "mov {w}, qword ptr [{s}]",
                    s = in(reg) src.add(at),
                    w = out(reg) w,
                    options(nostack, preserves_flags, readonly),
                );
            }
        }
        c = _mm_crc32_u64(c, w);
        at += 8;
    }
    let mut c = c as u32;
    while at < len {
        // SAFETY: `at < len`: readable (only without `COPY`, whose `len` is a multiple of 8).
        c = _mm_crc32_u8(c, unsafe { *src.add(at) });
        at += 1;
    }
    !c
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
                // A field that holds zeros already (the plain CRC's shortcut).
                assert_eq!(
                    crc32c_masked(&z, zero.clone()),
                    crc32c::crc32c(&z),
                    "length {len}, zeros {zero:?} already zero"
                );
            }
        }
    }

    #[test]
    fn the_fold_without_copy_agrees_with_the_crate_at_every_length_it_takes() {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if fold_cpu() {
            let data: Vec<u8> = (0..10_000u32)
                .map(|i| (i.wrapping_mul(2_246_822_519) >> 9) as u8)
                .collect();
            for len in (64..2100).chain([4095, 4096, 9000, 9001]) {
                for (start, init) in [(0usize, 0u32), (5, 0xdead_beef)] {
                    let b = &data[start..start + len];
                    // SAFETY: `b` is readable for `len >= 64` bytes; the CPU folds.
                    let got = unsafe { fold_only(init, b.as_ptr(), len) };
                    assert_eq!(got, crc32c::crc32c_append(init, b), "length {len}");
                }
            }
            return;
        }
        eprintln!("this CPU lacks AVX-512 VPCLMULQDQ: the fold is not run here");
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

    #[test]
    fn copy_append_copies_and_agrees_with_the_crate() {
        let data: Vec<u8> = (0..10_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut folded = 0;
        for len in (0..2100).step_by(8).chain([4096, 8192, 9000]) {
            for (start, init) in [(0usize, 0u32), (8, 0xdead_beef), (24, 7)] {
                let src = &data[start..start + len];
                let mut dst = vec![0u8; len];
                // SAFETY: two distinct live buffers of `len` bytes.
                let got = unsafe { copy_append(init, dst.as_mut_ptr(), src.as_ptr(), len) };
                match got {
                    Some(c) => {
                        folded += 1;
                        assert_eq!(c, crc32c::crc32c_append(init, src), "length {len}");
                        assert_eq!(dst, src, "length {len}");
                    }
                    None => assert!(dst.iter().all(|&b| b == 0), "copied nothing"),
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
        {
            assert!(folded > 0, "this CPU folds: the fused path ran");
        }
    }
}
