//! A completion queue's file descriptor, for applications that wait in epoll, poll or select
//! (the C API's `braid_cq_fd`).
//!
//! The descriptor is an eventfd. The engine side signals it when it publishes new completions
//! to the CQ's ring, right after it notifies blocked [`CompletionQueue::wait`] callers. To
//! keep the datapath from making one `write` per batch, a flag records that the eventfd is
//! already signalled and not yet cleared; only the first publication after a clear writes.
//!
//! # Using it without losing a wake-up
//!
//! 1. Wait until the descriptor is readable.
//! 2. Call [`CompletionQueue::clear_event_fd`].
//! 3. Poll the CQ until it returns fewer completions than asked for (it is empty).
//! 4. Go back to 1.
//!
//! A completion published before step 2 is seen by step 3; one published after step 2 signals
//! the descriptor again. Reading the descriptor directly instead of step 2 loses wake-ups (the
//! flag would stay set), and stopping step 3 early leaves completions that signal nothing.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use super::CompletionQueue;

/// The eventfd of one completion queue and whether it is signalled.
pub(super) struct CqFd {
    fd: OwnedFd,
    /// Set by the signal that wrote the eventfd, cleared by `clear` before it reads it.
    signaled: AtomicBool,
}

impl CqFd {
    fn new() -> io::Result<CqFd> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor that
        // nothing else owns.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(CqFd {
            fd,
            signaled: AtomicBool::new(false),
        })
    }

    /// Makes the descriptor readable, unless it already is and has not been cleared since.
    /// Called by the engine side after it publishes completions.
    pub(super) fn signal(&self) {
        // A read-modify-write: it reads the latest value, so a `clear` ordered before it is
        // seen (and this one writes), and one ordered after it reads this `true` and so
        // synchronises with it (and its poll sees the completions published before).
        if !self.signaled.swap(true, Ordering::AcqRel) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live local buffer to a descriptor this struct
            // owns. It fails only if the counter would overflow, which one write per clear
            // cannot reach.
            let _ = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }

    /// Makes the descriptor not readable until the next signal.
    fn clear(&self) {
        self.clear_with(|| {});
    }

    /// [`clear`](Self::clear), running `between` after the read and before the flag is
    /// dropped: where a concurrent [`signal`](Self::signal) may land (the tests put one
    /// there).
    ///
    /// The read comes first. A signal before the flag is dropped sees it still set and writes
    /// nothing, but its completions were published before it, so the caller's poll after this
    /// clear sees them; every signal after the drop writes again. The other order (drop, then
    /// read) lost wake-ups: a signal between the two wrote, the read took its write, and the
    /// flag stayed set over an empty counter, so no later signal wrote.
    fn clear_with(&self, between: impl FnOnce()) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local buffer from a descriptor this
        // struct owns; it is non-blocking, so an empty counter returns EAGAIN at once.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        between();
        self.signaled.swap(false, Ordering::AcqRel);
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl CompletionQueue {
    /// A file descriptor that becomes readable when completions are ready, for epoll, poll or
    /// select. Made on the first call (later calls return the same one); it is readable at
    /// once if completions are already waiting. It belongs to the CQ: do not close or read
    /// it; it stays open until the device is closed. See the module documentation for the
    /// wait, [`clear_event_fd`](Self::clear_event_fd), poll-until-empty loop that loses no
    /// wake-up.
    ///
    /// On the verbs backend it fails with `ErrorKind::Unsupported` (poll the CQ instead).
    pub fn event_fd(&self) -> io::Result<RawFd> {
        let Some(shared) = self.shared() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no CQ file descriptor on the verbs backend",
            ));
        };
        if let Some(fd) = shared.fd.get() {
            return Ok(fd.raw());
        }
        // Made under every shard's engine lock, one of which every publication holds: a
        // publication either finishes before (and its completions are in a ring, checked
        // below) or sees the descriptor and signals it.
        let _cores = self.dev.owner().lock_all();
        if shared.fd.get().is_none() {
            let _ = shared.fd.set(CqFd::new()?);
        }
        let fd = shared
            .fd
            .get()
            .ok_or_else(|| io::Error::other("no CQ fd"))?;
        if !shared.is_empty() {
            fd.signal();
        }
        Ok(fd.raw())
    }

    /// Makes the descriptor from [`event_fd`](Self::event_fd) not readable until new
    /// completions are published. Call it after the descriptor was seen readable and before
    /// polling the CQ until it is empty. Does nothing if no descriptor was made.
    pub fn clear_event_fd(&self) {
        if let Some(fd) = self.shared().and_then(|s| s.fd.get()) {
            fd.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Device, DeviceConfig};
    use braid_proto::{Access, SendOp, SendWr, WcStatus};
    use std::time::Duration;

    /// Whether `fd` is readable within `timeout_ms`.
    fn readable(fd: i32, timeout_ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack, count 1.
        let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        n == 1 && p.revents & libc::POLLIN != 0
    }

    fn open() -> Device {
        Device::open(DeviceConfig::udp("127.0.0.1:0".parse().unwrap()).paths(2)).unwrap()
    }

    /// A signal that lands inside a clear (a completion published while the application
    /// clears) must not swallow the wake-up of the next one.
    #[test]
    fn a_signal_during_a_clear_leaves_the_next_signal_working() {
        let fd = super::CqFd::new().unwrap();
        for round in 0..3 {
            fd.signal();
            assert!(readable(fd.raw(), 0), "round {round}: signalled");
            fd.clear_with(|| fd.signal());
            // The caller now polls the CQ dry (seeing what the middle signal announced) and
            // waits again; the next completion must wake it.
            assert!(!readable(fd.raw(), 0), "round {round}: cleared");
            fd.signal();
            assert!(
                readable(fd.raw(), 0),
                "round {round}: the next signal wakes"
            );
            fd.clear();
        }
    }

    #[test]
    fn the_fd_wakes_for_every_completion_after_a_clear() {
        let (a, b) = (open(), open());
        let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
        let (cq_a, cq_b) = (a.create_cq(), b.create_cq());
        let qp_a = pd_a.create_qp(&cq_a, &cq_a).unwrap();
        let qp_b = pd_b.create_qp(&cq_b, &cq_b).unwrap();
        qp_a.connect(qp_b.info()).unwrap();
        qp_b.connect(qp_a.info()).unwrap();
        let src = pd_a.alloc_mr(64, Access::NONE).unwrap();
        let dst = pd_b.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
        let fd = cq_a.event_fd().unwrap();
        assert_eq!(cq_a.event_fd().unwrap(), fd, "one descriptor per CQ");
        assert!(!readable(fd, 0), "nothing completed yet");
        for i in 0..50u64 {
            let wr = SendWr {
                wr_id: i,
                op: SendOp::Write(dst.remote(0)),
                sges: vec![src.sge(0, 8)],
                signaled: true,
            };
            qp_a.post_send(wr).unwrap();
            assert!(readable(fd, 20_000), "completion {i} makes the fd readable");
            cq_a.clear_event_fd();
            // The signal comes after the publication, so the completion is in the ring.
            let c = cq_a.poll_one().expect("the completion that signalled");
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
            assert!(cq_a.poll_one().is_none());
            assert!(!readable(fd, 0), "cleared and drained: not readable");
        }
    }

    #[test]
    fn an_fd_made_after_completions_arrived_is_readable_at_once() {
        let (a, b) = (open(), open());
        let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
        let (cq_a, cq_b) = (a.create_cq(), b.create_cq());
        let qp_a = pd_a.create_qp(&cq_a, &cq_a).unwrap();
        let qp_b = pd_b.create_qp(&cq_b, &cq_b).unwrap();
        qp_a.connect(qp_b.info()).unwrap();
        qp_b.connect(qp_a.info()).unwrap();
        let src = pd_a.alloc_mr(8, Access::NONE).unwrap();
        let dst = pd_b.alloc_mr(8, Access::REMOTE_WRITE).unwrap();
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::Write(dst.remote(0)),
            sges: vec![src.sge(0, 8)],
            signaled: true,
        };
        qp_a.post_send(wr).unwrap();
        let shared = cq_a.shared().unwrap();
        assert!(
            shared
                .ready
                .wait_until(|| !shared.is_empty(), Some(Duration::from_secs(20)))
        );
        let fd = cq_a.event_fd().unwrap();
        assert!(readable(fd, 0));
        cq_a.clear_event_fd();
        assert_eq!(cq_a.poll_one().map(|c| c.wr_id), Some(1));
        assert!(!readable(fd, 0));
    }
}
