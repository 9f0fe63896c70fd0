//! Runs Braid's backend conformance suite (`braid_tests::conformance`) outside the test
//! harness: on the software transport by default, on the rdma-core backend with
//! `BRAID_TEST_VERBS=1` (devices from `BRAID_VERBS_DEVICES`, default `rxe0,rxe1`; build with
//! `--features verbs`). Arguments name cases to run (default: all). Prints one line per case
//! and exits 0 only if every case passed; a missing verbs device fails every case.
use braid_tests::conformance::{CASES, backend_name, run};

fn main() {
    let want: Vec<String> = std::env::args().skip(1).collect();
    let cases: Vec<&str> = CASES
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| want.is_empty() || want.iter().any(|w| w == n))
        .collect();
    if cases.is_empty() {
        eprintln!(
            "no such case; cases: {:?}",
            CASES.iter().map(|c| c.0).collect::<Vec<_>>()
        );
        std::process::exit(2);
    }
    println!("braid conformance on {}", backend_name());
    let mut failed = Vec::new();
    for name in &cases {
        match std::panic::catch_unwind(|| run(name)) {
            Ok(()) => println!("ok     {name}"),
            Err(_) => {
                println!("FAILED {name}");
                failed.push(*name);
            }
        }
    }
    println!(
        "{} passed, {} failed{}",
        cases.len() - failed.len(),
        failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(": {}", failed.join(", "))
        }
    );
    std::process::exit(i32::from(!failed.is_empty()));
}
