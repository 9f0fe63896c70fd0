//! Completion queues: poll, blocking wait, and a file descriptor for epoll.
use std::time::Duration;

use braid_rt::{Completion, WcOpcode, WcStatus};

use crate::device::{clear_out, put};
use crate::error::*;
use crate::handle::{self, CqObj};
use crate::types::*;

/// Completions taken from the queue per batch (on the stack).
const POLL_BATCH: usize = 32;
/// The longest single sleep of an infinite `braid_cq_wait` (it loops).
const FOREVER_STEP: Duration = Duration::from_secs(3600);

pub(crate) fn wc(c: &Completion) -> braid_wc {
    let status = match c.status {
        WcStatus::Success => BRAID_WC_SUCCESS,
        WcStatus::LocalLengthError => BRAID_WC_LOC_LEN_ERR,
        WcStatus::LocalProtectionError => BRAID_WC_LOC_PROT_ERR,
        WcStatus::RemoteAccessError => BRAID_WC_REM_ACCESS_ERR,
        WcStatus::RemoteInvalidRequest => BRAID_WC_REM_INV_REQ_ERR,
        WcStatus::RemoteOperationError => BRAID_WC_REM_OP_ERR,
        WcStatus::RetryExceeded => BRAID_WC_RETRY_EXC_ERR,
        WcStatus::RnrRetryExceeded => BRAID_WC_RNR_RETRY_EXC_ERR,
        WcStatus::Flushed => BRAID_WC_WR_FLUSH_ERR,
        _ => BRAID_WC_GENERAL_ERR,
    };
    let opcode = match c.opcode {
        WcOpcode::Send => BRAID_WC_SEND,
        WcOpcode::Write => BRAID_WC_RDMA_WRITE,
        WcOpcode::Read => BRAID_WC_RDMA_READ,
        WcOpcode::FetchAdd => BRAID_WC_FETCH_ADD,
        WcOpcode::CompareSwap => BRAID_WC_COMP_SWAP,
        WcOpcode::Recv => BRAID_WC_RECV,
        WcOpcode::RecvRdmaWithImm => BRAID_WC_RECV_RDMA_WITH_IMM,
        _ => BRAID_WC_UNKNOWN,
    };
    braid_wc {
        wr_id: c.wr_id,
        status,
        opcode,
        byte_len: c.byte_len,
        imm_data: c.imm.unwrap_or(0),
        qp_num: c.qpn,
        wc_flags: if c.imm.is_some() {
            BRAID_WC_WITH_IMM
        } else {
            0
        },
    }
}

fn blank() -> Completion {
    Completion {
        wr_id: 0,
        status: WcStatus::Flushed,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qpn: 0,
    }
}

/// Checks a caller's completion array.
fn out_array(wcs: *mut braid_wc, max: u32) -> Result<usize> {
    non_null(wcs, "wc")?;
    if !wcs.is_aligned() {
        return Err(Error::new(BRAID_EINVAL, "wc is misaligned"));
    }
    if max == 0 || max > i32::MAX as u32 {
        return Err(Error::new(
            BRAID_EINVAL,
            format!("num_entries {max} is outside 1 to INT_MAX"),
        ));
    }
    Ok(max as usize)
}

/// Polls up to `max` completions into `wcs`.
///
/// # Safety
/// `wcs` is non-null, aligned and writable for `max` entries.
unsafe fn poll_into(cq: &CqObj, wcs: *mut braid_wc, max: usize) -> usize {
    let mut buf = [blank(); POLL_BATCH];
    let mut done = 0;
    while done < max {
        let want = (max - done).min(POLL_BATCH);
        let n = cq.cq.poll(&mut buf[..want]);
        for (i, c) in buf[..n].iter().enumerate() {
            // SAFETY: done + i < max, inside the caller's array (see the function contract).
            unsafe { wcs.add(done + i).write(wc(c)) };
        }
        done += n;
        if n < want {
            break;
        }
    }
    done
}

/// Creates a completion queue on `dev`. It holds any number of completions (those beyond
/// its ring of 4096 wait inside the engine).
///
/// # Safety
/// `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_cq_create(dev: *const braid_device, out: *mut *mut braid_cq) -> i32 {
    call("braid_cq_create", || {
        // SAFETY: the caller's contract.
        unsafe { clear_out(out, "out")? };
        let d = handle::get(dev)?;
        let cq = d.dev.create_cq();
        let device = handle::token(dev);
        let h = handle::insert::<braid_cq>(CqObj { cq, device }, &[device])?;
        // SAFETY: the caller's contract.
        unsafe { put(out, h, "out")? };
        Ok(BRAID_OK)
    })
}

/// Destroys a completion queue handle. Every QP that reports to it must be destroyed first
/// (else `BRAID_EBUSY`). Its file descriptor, if one was made, must not be used afterwards.
#[unsafe(no_mangle)]
pub extern "C" fn braid_cq_destroy(cq: *mut braid_cq) -> i32 {
    call("braid_cq_destroy", || {
        drop(handle::remove(cq)?);
        Ok(BRAID_OK)
    })
}

/// Takes up to `num_entries` completions without waiting, oldest first, into `wc`. Returns
/// how many (0 when the queue is empty). Completions of one QP come in posting order.
///
/// # Safety
/// `wc` must be NULL or writable for `num_entries` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_cq_poll(
    cq: *const braid_cq,
    wc: *mut braid_wc,
    num_entries: u32,
) -> i32 {
    call("braid_cq_poll", || {
        let c = handle::get(cq)?;
        let max = out_array(wc, num_entries)?;
        // SAFETY: checked by out_array; writable by the caller's contract.
        Ok(unsafe { poll_into(&c, wc, max) } as i32)
    })
}

/// Waits up to `timeout_ms` milliseconds (a negative value waits forever) for at least one
/// completion, then takes up to `num_entries` into `wc`. Returns how many; 0 means the time
/// ran out. Several threads may wait on one queue; each completion goes to one of them.
///
/// # Safety
/// `wc` must be NULL or writable for `num_entries` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_cq_wait(
    cq: *const braid_cq,
    wc: *mut braid_wc,
    num_entries: u32,
    timeout_ms: i32,
) -> i32 {
    call("braid_cq_wait", || {
        let c = handle::get(cq)?;
        let max = out_array(wc, num_entries)?;
        let first = if timeout_ms < 0 {
            loop {
                if let Some(first) = c.cq.wait(FOREVER_STEP) {
                    break first;
                }
            }
        } else {
            match c.cq.wait(Duration::from_millis(timeout_ms as u64)) {
                Some(first) => first,
                None => return Ok(0),
            }
        };
        // SAFETY: max >= 1 (out_array), so index 0 is inside the caller's array.
        unsafe { wc.write(self::wc(&first)) };
        // SAFETY: the rest of the array, max - 1 entries from index 1.
        let more = unsafe { poll_into(&c, wc.add(1), max - 1) };
        Ok(1 + more as i32)
    })
}

/// A file descriptor that becomes readable when completions are ready, for epoll, poll or
/// select (level-triggered or edge-triggered). Made on the first call, the same one after;
/// readable at once if completions are already waiting. The library owns it: do not close
/// or read it.
///
/// The loop that loses no wake-up:
/// 1. wait until the descriptor is readable;
/// 2. call `braid_cq_clear_fd`;
/// 3. call `braid_cq_poll` until it returns fewer than asked for (the queue is empty);
/// 4. go back to 1.
///
/// A completion that arrives before step 2 is taken in step 3; one after step 2 makes the
/// descriptor readable again. Returns the descriptor (0 or more) or a negative code.
#[unsafe(no_mangle)]
pub extern "C" fn braid_cq_fd(cq: *const braid_cq) -> i32 {
    call("braid_cq_fd", || {
        let c = handle::get(cq)?;
        c.cq.event_fd()
            .map_err(|e| Error::new(BRAID_EIO, format!("eventfd: {e}")))
    })
}

/// Makes the descriptor from `braid_cq_fd` not readable until new completions arrive. Call
/// it after seeing the descriptor readable, before polling the queue empty (see
/// `braid_cq_fd`). Does nothing if no descriptor was made.
#[unsafe(no_mangle)]
pub extern "C" fn braid_cq_clear_fd(cq: *const braid_cq) -> i32 {
    call("braid_cq_clear_fd", || {
        handle::get(cq)?.cq.clear_event_fd();
        Ok(BRAID_OK)
    })
}
