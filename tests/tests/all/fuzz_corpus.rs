//! The fuzz corpora, replayed on stable through the same checks the fuzz targets run
//! (`braid_tests::fuzz_checks`): every file of `fuzz/corpus/<target>/` (seeds, merged inputs,
//! and `regression-*` inputs of fixed bugs), every crash file left in the git-ignored
//! `fuzz/artifacts/<target>/`, the reproductions of known engine bugs in
//! `fuzz/regressions/<target>/` (with the bug tolerated; `known_engine_bugs_are_fixed` runs
//! them strictly), and the seeds as `fuzz_checks::seeds` builds them now.
//!
//! Regenerate the checked-in seeds after changing a decoder or the seeds:
//!
//! ```text
//! BRAID_WRITE_SEEDS=1 cargo test -p braid-tests --test all \
//!     fuzz_corpus::write_seed_corpora -- --ignored
//! ```
use std::path::{Path, PathBuf};
use std::time::Instant;

use braid_tests::fuzz_checks::{self, TARGETS, seeds};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files of `dir`, sorted by name (none if it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

/// Runs `target`'s checks on `data`, naming the input if they fail.
fn replay_one(target: &str, name: &str, data: &[u8]) {
    replay_with(fuzz_checks::run, target, name, data);
}

fn replay_with(run: fn(&str, &[u8]), target: &str, name: &str, data: &[u8]) {
    let r = std::panic::catch_unwind(|| run(target, data));
    if let Err(e) = r {
        eprintln!(
            "fuzz target {target}: input {name} ({} bytes) failed",
            data.len()
        );
        std::panic::resume_unwind(e);
    }
}

/// Replays the corpus, the artifacts and the fresh seeds of `target`; returns inputs run.
fn replay(target: &str) -> usize {
    let started = Instant::now();
    let mut n = 0;
    for sub in ["corpus", "artifacts", "regressions"] {
        for path in files(&fuzz_dir().join(sub).join(target)) {
            let data = std::fs::read(&path).expect("readable corpus file");
            replay_one(target, &path.display().to_string(), &data);
            n += 1;
        }
    }
    for (name, data) in seeds::for_target(target) {
        replay_one(target, &format!("seed {name}"), &data);
        n += 1;
    }
    eprintln!("{target}: {n} inputs in {:?}", started.elapsed());
    n
}

#[test]
fn packet_corpus_replays() {
    assert!(replay("packet") > 0);
}

#[test]
fn engine_datagrams_corpus_replays() {
    assert!(replay("engine_datagrams") > 0);
}

#[test]
fn sim_ops_corpus_replays() {
    assert!(replay("sim_ops") > 0);
}

#[test]
fn ack_sack_corpus_replays() {
    assert!(replay("ack_sack") > 0);
}

#[test]
fn every_target_has_a_checked_in_corpus() {
    for target in TARGETS {
        let n = files(&fuzz_dir().join("corpus").join(target)).len();
        assert!(n > 0, "fuzz/corpus/{target} is empty");
    }
}

/// The inputs in `fuzz/regressions/` (none at the moment) reproduce engine bugs the checks
/// tolerate elsewhere; this runs them, and everything else, with nothing tolerated.
#[test]
fn known_engine_bugs_are_fixed() {
    let mut failing = Vec::new();
    for target in TARGETS {
        for path in files(&fuzz_dir().join("regressions").join(target)) {
            let data = std::fs::read(&path).expect("readable regression file");
            let name = path.display().to_string();
            let r = std::panic::catch_unwind(|| {
                replay_with(fuzz_checks::run_strict, target, &name, &data)
            });
            if r.is_err() {
                failing.push(name);
            }
        }
    }
    assert!(failing.is_empty(), "still failing: {failing:#?}");
}

/// Writes `fuzz_checks::seeds` into `fuzz/corpus/<target>/seed-<name>` (with
/// `BRAID_WRITE_SEEDS=1`; files the fuzzer added are left alone).
#[test]
#[ignore = "writes the seed corpora; run by hand with BRAID_WRITE_SEEDS=1"]
fn write_seed_corpora() {
    if std::env::var_os("BRAID_WRITE_SEEDS").is_none() {
        eprintln!("set BRAID_WRITE_SEEDS=1 to write the seed corpora");
        return;
    }
    for target in TARGETS {
        let dir = fuzz_dir().join("corpus").join(target);
        std::fs::create_dir_all(&dir).expect("corpus directory");
        for (name, data) in seeds::for_target(target) {
            std::fs::write(dir.join(format!("seed-{name}")), data).expect("corpus file");
        }
    }
}
