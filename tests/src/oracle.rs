//! What completions and memory must look like after a workload, written once for the
//! simulator tests (`sim_e2e`, `fault_matrix`) and the testbed tests (`netns_faults`).
//!
//! The rules are RC's (verbs, Linux rxe): every work request completes exactly once and in
//! posting order; on a QP that gives up, a prefix succeeds, one completion says
//! `RetryExceeded` and every later one is `Flushed` (not executed); a RECV completes at most
//! once, in posting order, and is flushed once the QP failed. A work request that did not
//! finish may have left its old bytes or its new ones in memory, byte by byte, but nothing
//! else; a fetch-and-add executes at most once, and the originals the executed ones return
//! are distinct multiples of the addend below the final counter (exactly `0, add, 2 add, ...`
//! when all succeeded). Every check panics with `tag` and the first place that breaks a rule.
use braid::proto::{Completion, WcOpcode, WcStatus};

/// How a workload's QP must end.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Every work request and every RECV succeeds.
    AllSucceed,
    /// A prefix succeeds, then one `RetryExceeded`, then `Flushed` for the rest.
    GivesUp,
}

/// What a successful completion of one work request (or RECV) must say.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// Its work request id.
    pub wr_id: u64,
    /// Its opcode.
    pub opcode: WcOpcode,
    /// Bytes it moved.
    pub byte_len: u32,
    /// The immediate it carries (requester completions carry none).
    pub imm: Option<u32>,
}

/// Checks a requester's completions against its work requests `want`, in posting order, on
/// QP `qpn` (when given). Returns the index of the work request that failed the QP, if any.
pub fn requester(
    tag: &str,
    got: &[Completion],
    want: &[Want],
    qpn: Option<u32>,
    expect: Expect,
) -> Option<usize> {
    assert_eq!(
        got.len(),
        want.len(),
        "{tag}: requester completions (each work request exactly once)"
    );
    let mut failed = None;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            (g.wr_id, qpn.map(|_| g.qpn)),
            (w.wr_id, qpn),
            "{tag}: requester completion #{i} (completions come in posting order)"
        );
        match g.status {
            WcStatus::Success => {
                assert!(failed.is_none(), "{tag}: #{i} succeeded after a failure");
                assert_eq!(
                    (g.opcode, g.byte_len, g.imm),
                    (w.opcode, w.byte_len, w.imm),
                    "{tag}: requester completion #{i}"
                );
            }
            WcStatus::RetryExceeded if expect == Expect::GivesUp && failed.is_none() => {
                failed = Some(i);
            }
            WcStatus::Flushed if failed.is_some() => {}
            s => panic!("{tag}: requester completion #{i}: {s:?} (first failure {failed:?})"),
        }
    }
    if expect == Expect::GivesUp {
        assert!(failed.is_some(), "{tag}: the requester never gave up");
    }
    failed
}

/// Checks a responder's receive completions against its posted RECVs `want`, in posting
/// order, on QP `qpn` (when given): all of them when everything succeeds, else a prefix that
/// succeeded and flushed ones after. Returns which RECVs succeeded.
pub fn responder(
    tag: &str,
    got: &[Completion],
    want: &[Want],
    qpn: Option<u32>,
    expect: Expect,
) -> Vec<bool> {
    assert!(
        got.len() <= want.len(),
        "{tag}: {} responder completions for {} RECVs",
        got.len(),
        want.len()
    );
    if expect == Expect::AllSucceed {
        assert_eq!(got.len(), want.len(), "{tag}: responder completions");
    }
    let mut ok = vec![false; want.len()];
    let mut flushed = false;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            (g.wr_id, qpn.map(|_| g.qpn)),
            (w.wr_id, qpn),
            "{tag}: responder completion #{i} (in posting order)"
        );
        match g.status {
            WcStatus::Success if !flushed => {
                assert_eq!(
                    (g.opcode, g.byte_len, g.imm),
                    (w.opcode, w.byte_len, w.imm),
                    "{tag}: responder completion #{i}"
                );
                ok[i] = true;
            }
            WcStatus::Flushed if expect == Expect::GivesUp => flushed = true,
            s => panic!("{tag}: responder completion #{i}: {s:?}"),
        }
    }
    ok
}

/// Checks the bytes `got` a work request that did not finish left where it writes `new`
/// over `old`: each byte old or new, nothing else. `what` names the place.
pub fn unfinished(tag: &str, what: &str, got: &[u8], old: &[u8], new: &[u8]) {
    if let Some(k) = (0..new.len()).find(|&k| got[k] != new[k] && got[k] != old[k]) {
        panic!(
            "{tag}: {what}: byte {k} of {} is neither old nor new",
            new.len()
        );
    }
}

/// Checks the fetch-and-adds of a workload: `counter` (the final value of the word they all
/// add `add` to), `posted` of them, `originals` the values the succeeded ones returned (any
/// order). Returns the originals sorted.
pub fn fetch_adds(
    tag: &str,
    counter: u64,
    add: u64,
    posted: usize,
    mut originals: Vec<u64>,
    expect: Expect,
) -> Vec<u64> {
    assert_eq!(counter % add, 0, "{tag}: fetch-add counter {counter}");
    let executed = (counter / add) as usize;
    let succeeded = originals.len();
    assert!(
        (succeeded..=posted).contains(&executed),
        "{tag}: {executed} fetch-adds executed, {succeeded} succeeded, {posted} posted"
    );
    originals.sort_unstable();
    originals.dedup();
    assert_eq!(
        originals.len(),
        succeeded,
        "{tag}: a fetch-add original came twice"
    );
    assert!(
        originals.iter().all(|&v| v % add == 0 && v < counter),
        "{tag}: fetch-add originals {originals:?}, counter {counter}"
    );
    if expect == Expect::AllSucceed {
        assert_eq!(executed, posted, "{tag}: fetch-adds executed");
        assert_eq!(
            originals,
            (0..posted as u64).map(|i| i * add).collect::<Vec<_>>(),
            "{tag}: fetch-add originals"
        );
    }
    originals
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> Completion {
        Completion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm: None,
            qpn: 7,
        }
    }

    fn want(wr_id: u64) -> Want {
        Want {
            wr_id,
            opcode: WcOpcode::Write,
            byte_len: 64,
            imm: None,
        }
    }

    #[test]
    fn a_failed_prefix_then_flushes_is_a_qp_that_gave_up() {
        let got = [
            done(1, WcStatus::Success, WcOpcode::Write, 64),
            done(2, WcStatus::RetryExceeded, WcOpcode::Write, 0),
            done(3, WcStatus::Flushed, WcOpcode::Write, 0),
        ];
        let w = [want(1), want(2), want(3)];
        assert_eq!(requester("t", &got, &w, Some(7), Expect::GivesUp), Some(1));
    }

    #[test]
    #[should_panic(expected = "posting order")]
    fn completions_out_of_posting_order_are_refused() {
        let got = [
            done(2, WcStatus::Success, WcOpcode::Write, 64),
            done(1, WcStatus::Success, WcOpcode::Write, 64),
        ];
        requester("t", &got, &[want(1), want(2)], None, Expect::AllSucceed);
    }

    #[test]
    #[should_panic(expected = "Flushed")]
    fn a_flush_without_a_failure_is_refused() {
        let got = [done(1, WcStatus::Flushed, WcOpcode::Write, 0)];
        requester("t", &got, &[want(1)], None, Expect::GivesUp);
    }

    #[test]
    #[should_panic(expected = "neither old nor new")]
    fn an_unfinished_write_may_not_leave_a_third_value() {
        unfinished("t", "region 0", &[1, 9, 2], &[1, 1, 1], &[2, 2, 2]);
    }

    #[test]
    #[should_panic(expected = "came twice")]
    fn a_fetch_add_original_returned_twice_is_refused() {
        fetch_adds("t", 24, 8, 3, vec![0, 8, 8], Expect::GivesUp);
    }

    #[test]
    fn fetch_adds_that_all_succeeded_return_every_multiple_once() {
        let o = fetch_adds("t", 24, 8, 3, vec![16, 0, 8], Expect::AllSucceed);
        assert_eq!(o, vec![0, 8, 16]);
    }
}
