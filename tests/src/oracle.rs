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
//!
//! [`Memory`] is the expected-memory model of one region the tests share: what every byte
//! must hold, updated as work requests land (or are left unfinished), and compared with the
//! region in one call.
use braid::proto::{Completion, Sge, WcOpcode, WcStatus};

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

/// What one region must hold: its bytes before a workload, updated with every work request
/// that lands in it. The model the simulator and testbed tests compare a region against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Memory {
    want: Vec<u8>,
}

impl Memory {
    /// A region that must hold `init`.
    pub fn new(init: Vec<u8>) -> Memory {
        Memory { want: init }
    }

    /// The bytes it must hold.
    pub fn bytes(&self) -> &[u8] {
        &self.want
    }

    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.want.len()
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.want.is_empty()
    }

    /// The bytes a gather list over this region reads (its offsets count from its start).
    pub fn gather(&self, sges: &[Sge]) -> Vec<u8> {
        sges.iter()
            .flat_map(|s| {
                let at = s.offset as usize;
                self.want[at..at + s.len as usize].iter().copied()
            })
            .collect()
    }

    /// Records `data` landed over the scatter list `sges` (filled in order; the last entries
    /// may be left short or untouched when `data` is shorter than the list). Returns where
    /// each piece went, as (offset, length).
    pub fn scatter(&mut self, sges: &[Sge], data: &[u8]) -> Vec<(usize, usize)> {
        let mut at = 0;
        let mut pieces = Vec::new();
        for s in sges {
            let n = (s.len as usize).min(data.len() - at);
            self.write(s.offset as usize, &data[at..at + n]);
            pieces.push((s.offset as usize, n));
            at += n;
        }
        assert_eq!(at, data.len(), "test bug: scatter list too short");
        pieces
    }

    /// Records `data` landed at `off`.
    pub fn write(&mut self, off: usize, data: &[u8]) {
        self.want[off..off + data.len()].copy_from_slice(data);
    }

    /// Records a work request that did not finish where it writes `new` at `off`: checks
    /// that the region's bytes there (`got`, the whole region) are each the model's old
    /// byte or the new one ([`unfinished`]), then takes what is there as expected.
    pub fn unfinished(&mut self, tag: &str, what: &str, got: &[u8], off: usize, new: &[u8]) {
        let end = off + new.len();
        unfinished(tag, what, &got[off..end], &self.want[off..end], new);
        self.want[off..end].copy_from_slice(&got[off..end]);
    }

    /// Checks that the region holds `got` byte for byte; panics naming `tag`, `name`, how
    /// many bytes differ and the first and last of them.
    pub fn check(&self, tag: &str, name: &str, got: &[u8]) {
        assert_eq!(got.len(), self.want.len(), "{tag}: region {name}: length");
        if got == self.want.as_slice() {
            return;
        }
        let differs = |(a, b): (&u8, &u8)| a != b;
        let pairs = || got.iter().zip(&self.want);
        let first = pairs().position(differs).unwrap_or(0);
        let last = pairs().rposition(differs).unwrap_or(0);
        let diff = pairs().filter(|&p| differs(p)).count();
        panic!(
            "{tag}: region {name}: {diff} bytes differ from the model, first at {first}, last \
             at {last}"
        );
    }
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

    fn sge_at(offset: u64, len: u32) -> Sge {
        Sge {
            lkey: 1,
            offset,
            len,
        }
    }

    #[test]
    fn the_memory_model_scatters_gathers_and_checks() {
        let mut m = Memory::new(vec![0; 16]);
        let pieces = m.scatter(&[sge_at(2, 3), sge_at(10, 4)], &[1, 2, 3, 4, 5]);
        assert_eq!(pieces, vec![(2, 3), (10, 2)]);
        let region = [0, 0, 1, 2, 3, 0, 0, 0, 0, 0, 4, 5, 0, 0, 0, 0];
        assert_eq!(m.bytes(), &region);
        assert_eq!(m.gather(&[sge_at(10, 2), sge_at(2, 1)]), vec![4, 5, 1]);
        m.check("t", "r", &region);
    }

    #[test]
    #[should_panic(expected = "2 bytes differ from the model, first at 3, last at 9")]
    fn a_region_that_differs_from_the_model_is_refused() {
        let m = Memory::new(vec![0; 12]);
        let mut got = vec![0; 12];
        (got[3], got[9]) = (1, 1);
        m.check("t", "r", &got);
    }

    #[test]
    fn an_unfinished_write_is_taken_as_it_was_left() {
        let mut m = Memory::new(vec![1; 4]);
        let got = [1, 2, 1, 1];
        m.unfinished("t", "w", &got, 1, &[2, 2]);
        assert_eq!(m.bytes(), &got);
    }

    #[test]
    #[should_panic(expected = "neither old nor new")]
    fn an_unfinished_write_leaving_a_third_value_is_refused_by_the_model() {
        let mut m = Memory::new(vec![1; 4]);
        m.unfinished("t", "w", &[1, 7, 1, 1], 1, &[2, 2]);
    }
}
