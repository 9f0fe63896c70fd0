//! The backend conformance suite (`braid_tests::conformance`): the same cases on the software
//! transport in every run and, with `BRAID_TEST_VERBS=1` (build with `--features verbs`), on
//! the rdma-core backend's devices named in `BRAID_VERBS_DEVICES`.
use braid_tests::conformance::{self, CASES};

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                conformance::run(stringify!($name));
            }
        )*

        /// Every case of the suite has a test here.
        #[test]
        fn every_case_has_a_test() {
            let here = [$(stringify!($name)),*];
            let all: Vec<&str> = CASES.iter().map(|(n, _)| *n).collect();
            assert_eq!(here.as_slice(), all.as_slice());
        }
    };
}

cases!(
    send_recv,
    send_imm,
    write,
    write_imm,
    read_scatter,
    atomics,
    gather_scatter,
    unsignaled,
    bad_rkey,
    out_of_bounds,
    no_read_right,
    no_write_right,
    no_atomic_right,
    set_error_flushes,
    recv_too_short,
    rnr_retry_exceeded,
    rnr_late_recv,
    handshake_connects,
);
