//! What path scoring costs per acknowledged packet: `PathSet::on_ack`, the controller's
//! delay sample (`cc_delay_ns`) and one path choice (`pick`), as the engine calls them for
//! every ACKed packet and every packet sent, with 1, 16 (the default of a software
//! connection) and 256 paths (the fabric simulator's). Delays vary from ACK to ACK, so
//! every refresh of the shares recomputes them and re-orders the medians.
//!
//! `cargo bench -p braid-bench --bench paths`
use std::hint::black_box;
use std::time::Duration;

use braid::proto::Timestamp;
use braid::proto::cc::AckSample;
use braid::proto::cc::paths::PathSet;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// One ACK on a pseudo-random path with a delay of 8-10 µs, then one path choice.
fn ack_and_pick(set: &mut PathSet, n: u16, i: u64, x: &mut u64) -> u16 {
    *x = x
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    let path = ((*x >> 33) % u64::from(n)) as u16;
    let now = Timestamp::from_nanos(1_000_000 + i * 10_000);
    let mut s = AckSample::new(Timestamp::from_nanos(now.as_nanos() - 8_000), 1000);
    s.path = path;
    s.fabric_delay_ns = Some(8_000 + (*x >> 50) % 2_000);
    s.ecn_ce = Some(false);
    set.on_ack(now, &s);
    black_box(set.cc_delay_ns(now, path, 8_000));
    set.pick((*x >> 20) as u32)
}

fn bench_paths(c: &mut Criterion) {
    let mut g = c.benchmark_group("paths_ack_and_pick");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1));
    for n in [1u16, 16, 256] {
        let mut set = PathSet::new(n);
        let (mut i, mut x) = (0u64, 1u64);
        g.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                i += 1;
                black_box(ack_and_pick(&mut set, n, i, &mut x))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_paths);
criterion_main!(benches);
