//! What a data packet costs besides the engine's bookkeeping: copying its payload (gather at
//! the sender, placement at the receiver) and its CRC32C integrity check, next to a plain
//! memcpy of the same bytes, for a 1408-byte (1500 MTU) and a 4 KiB payload.
//!
//! - `memcpy`: `copy_from_slice`, the memory-speed reference.
//! - `crc32c`: the `crc32c` crate over the bytes (its SSE4.2 path on x86-64, picked at run
//!   time; `hw_crc` below says whether this CPU has it).
//! - `braid_crc`: what the engine uses, `braid_crc::crc32c` (at these lengths carry-less
//!   folding: its own 512-bit VPCLMULQDQ fold where the CPU has AVX-512, else `crc-fast`'s).
//! - `copy_then_crc`: what the engine does today, two passes (copy, then CRC of the copy).
//! - `copy_crc_chunked`: one pass in 256-byte steps, each copied and then checksummed while
//!   it is still in L1 (the fused form safe code can write).
//! - `region_read` / `region_write`: the engine's own copies out of (gather at the sender)
//!   and into (placement at the receiver) a registered [`Region`], whose bytes are atomic
//!   words; at an 8-aligned and at an unaligned (offset 3) region offset.
//! - `region_read_then_crc`: the sender's gather and the CRC32C of the packet it fills
//!   (with `braid_crc`, as the engine did until it folded the CRC into the copy).
//! - `region_read_crc`: the sender's gather as the engine does it now, `Region::read_crc`:
//!   one pass that copies and folds the CRC32C from the loaded values (AVX-512 VPCLMULQDQ
//!   where the CPU has it, else `region_read_then_crc`).
//!
//! `cargo bench -p braid-bench --bench copy_crc`
use std::hint::black_box;
use std::time::Duration;

use braid::Region;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// Bytes per step of the one-pass variant: small enough to stay in L1 between copy and CRC.
const CHUNK: usize = 256;

fn copy_crc_chunked(src: &[u8], dst: &mut [u8]) -> u32 {
    let mut crc = 0;
    for (s, d) in src.chunks(CHUNK).zip(dst.chunks_mut(CHUNK)) {
        d.copy_from_slice(s);
        crc = crc32c::crc32c_append(crc, d);
    }
    crc
}

fn bench_copy_crc(c: &mut Criterion) {
    #[cfg(target_arch = "x86_64")]
    eprintln!(
        "hw_crc (SSE4.2 crc32 instruction): {}",
        std::arch::is_x86_feature_detected!("sse4.2")
    );
    let mut g = c.benchmark_group("copy_crc");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for len in [1408usize, 4096] {
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = vec![0u8; len];
        assert_eq!(
            copy_crc_chunked(&src, &mut dst),
            crc32c::crc32c(&src),
            "the chunked CRC is the CRC of the whole"
        );
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("memcpy", len), &len, |b, _| {
            b.iter(|| {
                dst.copy_from_slice(black_box(&src));
                black_box(&dst);
            })
        });
        g.bench_with_input(BenchmarkId::new("crc32c", len), &len, |b, _| {
            b.iter(|| black_box(crc32c::crc32c(black_box(&src))))
        });
        g.bench_with_input(BenchmarkId::new("braid_crc", len), &len, |b, _| {
            b.iter(|| black_box(braid_crc::crc32c(black_box(&src))))
        });
        g.bench_with_input(BenchmarkId::new("copy_then_crc", len), &len, |b, _| {
            b.iter(|| {
                dst.copy_from_slice(black_box(&src));
                black_box(crc32c::crc32c(&dst))
            })
        });
        g.bench_with_input(BenchmarkId::new("copy_crc_chunked", len), &len, |b, _| {
            b.iter(|| black_box(copy_crc_chunked(black_box(&src), &mut dst)))
        });
        let region = Region::new(len + 8);
        region.write(0, &src).unwrap();
        for off in [0u64, 3] {
            let tag = format!("{len}@{off}");
            g.bench_with_input(BenchmarkId::new("region_read", &tag), &len, |b, _| {
                b.iter(|| {
                    region.read(black_box(off), &mut dst).unwrap();
                    black_box(&dst);
                })
            });
            g.bench_with_input(BenchmarkId::new("region_write", &tag), &len, |b, _| {
                b.iter(|| region.write(black_box(off), black_box(&src)).unwrap())
            });
        }
        g.bench_with_input(
            BenchmarkId::new("region_read_then_crc", len),
            &len,
            |b, _| {
                b.iter(|| {
                    region.read(black_box(0), &mut dst).unwrap();
                    black_box(braid_crc::crc32c(&dst))
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("region_read_crc", len), &len, |b, _| {
            b.iter(|| black_box(region.read_crc(black_box(0), &mut dst, 0).unwrap()))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_copy_crc);
criterion_main!(benches);
