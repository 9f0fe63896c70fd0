//! Queue pairs: create, connection information, connect, post, counters.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use braid_rt::{QpInfo, QpState, RecvWr, RemoteAddr, SendOp, SendWr, Sge};

use crate::device::{clear_out, get_sized, put};
use crate::error::*;
use crate::handle::{self, QpObj};
use crate::types::*;

/// The first bytes of every QP information blob.
const INFO_MAGIC: [u8; 4] = *b"BRQP";
/// Its layout version.
const INFO_VERSION: u8 = 1;
const INFO_HAS_SEAL_KEY: u8 = 1;

/// Serialises `info` into the blob `braid_qp_info` hands out. The layout (big-endian):
///
/// ```text
///  0      4   5   6   7    8     10    12       16              32    36    40         72
///  +------+---+---+---+----+-----+-----+--------+---------------+-----+-----+----------+
///  |"BRQP"|ver|fam|flg| 0  |port |  0  |scope id| address (v4 in| qpn | psn | X25519   |
///  |      | 1 |4/6|   |    |     |     | (v6)   | first 4 bytes)|     |     | key or 0 |
///  +------+---+---+---+----+-----+-----+--------+---------------+-----+-----+----------+
/// ```
pub(crate) fn encode_info(info: &QpInfo) -> [u8; BRAID_QP_INFO_SIZE] {
    let mut b = [0u8; BRAID_QP_INFO_SIZE];
    b[0..4].copy_from_slice(&INFO_MAGIC);
    b[4] = INFO_VERSION;
    match info.addr {
        SocketAddr::V4(a) => {
            b[5] = 4;
            b[16..20].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            b[5] = 6;
            b[12..16].copy_from_slice(&a.scope_id().to_be_bytes());
            b[16..32].copy_from_slice(&a.ip().octets());
        }
    }
    b[8..10].copy_from_slice(&info.addr.port().to_be_bytes());
    b[32..36].copy_from_slice(&info.qpn.to_be_bytes());
    b[36..40].copy_from_slice(&info.psn.to_be_bytes());
    if let Some(key) = info.seal_key {
        b[6] = INFO_HAS_SEAL_KEY;
        b[40..72].copy_from_slice(&key);
    }
    b
}

fn bad_blob(why: &str) -> Error {
    Error::new(BRAID_EPROTO, format!("not valid QP information: {why}"))
}

/// Parses and validates a blob made by [`encode_info`]. Every byte is checked: reserved and
/// unused bytes must be zero.
pub(crate) fn decode_info(b: &[u8]) -> Result<QpInfo> {
    let b: &[u8; BRAID_QP_INFO_SIZE] = b.try_into().map_err(|_| {
        Error::new(
            BRAID_EINVAL,
            format!(
                "blob is {} bytes, BRAID_QP_INFO_SIZE is {BRAID_QP_INFO_SIZE}",
                b.len()
            ),
        )
    })?;
    let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
    let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if b[0..4] != INFO_MAGIC {
        return Err(bad_blob("wrong magic"));
    }
    if b[4] != INFO_VERSION {
        return Err(bad_blob(&format!(
            "version {} (this library reads {INFO_VERSION})",
            b[4]
        )));
    }
    if b[6] & !INFO_HAS_SEAL_KEY != 0 || b[7] != 0 || u16_at(10) != 0 {
        return Err(bad_blob("unknown flags or non-zero reserved bytes"));
    }
    let port = u16_at(8);
    if port == 0 {
        return Err(bad_blob("port 0"));
    }
    let addr = match b[5] {
        4 => {
            if u32_at(12) != 0 || b[20..32].iter().any(|&x| x != 0) {
                return Err(bad_blob("bytes after an IPv4 address are not zero"));
            }
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(b[16], b[17], b[18], b[19])), port)
        }
        6 => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[16..32]);
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, u32_at(12)))
        }
        f => return Err(bad_blob(&format!("address family {f}"))),
    };
    if addr.ip().is_unspecified() || addr.ip().is_multicast() {
        return Err(bad_blob("not a unicast address"));
    }
    let seal_key = if b[6] & INFO_HAS_SEAL_KEY != 0 {
        let mut k = [0u8; 32];
        k.copy_from_slice(&b[40..72]);
        Some(k)
    } else {
        if b[40..72].iter().any(|&x| x != 0) {
            return Err(bad_blob("key bytes without the key flag"));
        }
        None
    };
    Ok(QpInfo {
        addr,
        qpn: u32_at(32),
        psn: u32_at(36),
        seal_key,
    })
}

/// Reads a caller's scatter/gather list.
///
/// # Safety
/// A non-null `list` must be readable for `n` entries.
unsafe fn sges(list: *const braid_sge, n: u32) -> Result<Vec<Sge>> {
    if n > BRAID_MAX_SGE {
        return Err(Error::new(
            BRAID_EINVAL,
            format!("num_sge {n} is above BRAID_MAX_SGE ({BRAID_MAX_SGE})"),
        ));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    non_null(list, "sg_list")?;
    if !list.is_aligned() {
        return Err(Error::new(BRAID_EINVAL, "sg_list is misaligned"));
    }
    // SAFETY: non-null and aligned (checked), readable for n entries by the contract.
    let list = unsafe { core::slice::from_raw_parts(list, n as usize) };
    Ok(list
        .iter()
        .map(|s| Sge {
            lkey: s.lkey,
            offset: s.offset,
            len: s.length,
        })
        .collect())
}

/// Converts a caller's send work request.
///
/// # Safety
/// As [`sges`] for `w.sg_list`.
unsafe fn send_wr(w: &braid_send_wr) -> Result<SendWr> {
    if w.reserved != 0 {
        return Err(Error::new(BRAID_EINVAL, "reserved is not 0"));
    }
    if w.send_flags & !BRAID_SEND_SIGNALED != 0 {
        return Err(Error::new(
            BRAID_EINVAL,
            format!(
                "unknown send_flags {:#x}",
                w.send_flags & !BRAID_SEND_SIGNALED
            ),
        ));
    }
    let remote = RemoteAddr {
        rkey: w.rkey,
        offset: w.remote_offset,
    };
    let op = match w.opcode {
        BRAID_WR_SEND => SendOp::Send,
        BRAID_WR_SEND_WITH_IMM => SendOp::SendImm(w.imm_data),
        BRAID_WR_RDMA_WRITE => SendOp::Write(remote),
        BRAID_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteImm(remote, w.imm_data),
        BRAID_WR_RDMA_READ => SendOp::Read(remote),
        BRAID_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd(remote, w.compare_add),
        BRAID_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote,
            compare: w.compare_add,
            swap: w.swap,
        },
        other => {
            return Err(Error::new(BRAID_EINVAL, format!("unknown opcode {other}")));
        }
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        op,
        // SAFETY: forwarded.
        sges: unsafe { sges(w.sg_list, w.num_sge)? },
        signaled: w.send_flags & BRAID_SEND_SIGNALED != 0,
    })
}

/// Checks a caller's array of `count` work requests.
fn wr_array<T>(wrs: *const T, count: usize) -> Result<()> {
    non_null(wrs, "wr")?;
    if !wrs.is_aligned() {
        return Err(Error::new(BRAID_EINVAL, "wr is misaligned"));
    }
    if count > isize::MAX as usize / size_of::<T>() {
        return Err(Error::new(
            BRAID_EINVAL,
            format!("count {count} is too large"),
        ));
    }
    Ok(())
}

/// Runs `post` over each request; on a refusal records its index in `bad_index`.
fn post_each<T>(
    wrs: *const T,
    count: usize,
    bad_index: *mut usize,
    mut post: impl FnMut(&T) -> Result<()>,
) -> Result<i32> {
    if count == 0 {
        return Ok(BRAID_OK);
    }
    wr_array(wrs, count)?;
    // SAFETY: checked non-null, aligned and not too long; readable for count entries by the
    // exported function's contract.
    let list = unsafe { core::slice::from_raw_parts(wrs, count) };
    for (i, w) in list.iter().enumerate() {
        if let Err(mut e) = post(w) {
            if !bad_index.is_null() && bad_index.is_aligned() {
                // SAFETY: non-null and aligned; writable by the exported function's contract.
                unsafe { bad_index.write(i) };
            }
            e.msg = format!("work request {i}: {}", e.msg);
            return Err(e);
        }
    }
    Ok(BRAID_OK)
}

/// Creates a reliable QP in `pd` that reports sends to `send_cq` and receives to `recv_cq`
/// (they may be the same; both must be on the PD's device). `flags`: `BRAID_QP_*`.
///
/// # Safety
/// `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_qp_create(
    pd: *const braid_pd,
    send_cq: *const braid_cq,
    recv_cq: *const braid_cq,
    flags: u32,
    out: *mut *mut braid_qp,
) -> i32 {
    call("braid_qp_create", || {
        // SAFETY: the caller's contract.
        unsafe { clear_out(out, "out")? };
        let p = handle::get(pd)?;
        let s = handle::get(send_cq)?;
        let r = handle::get(recv_cq)?;
        if s.device != p.device || r.device != p.device {
            return Err(Error::new(
                BRAID_EACCES,
                "the completion queues and the protection domain are on different devices",
            ));
        }
        if flags & !BRAID_QP_ENCRYPTED != 0 {
            return Err(Error::new(
                BRAID_EINVAL,
                format!("unknown QP flags {:#x}", flags & !BRAID_QP_ENCRYPTED),
            ));
        }
        let qp = if flags & BRAID_QP_ENCRYPTED != 0 {
            p.pd.create_encrypted_qp(&s.cq, &r.cq)?
        } else {
            p.pd.create_qp(&s.cq, &r.cq)?
        };
        let parents = [
            handle::token(pd),
            handle::token(send_cq),
            handle::token(recv_cq),
        ];
        let h = handle::insert::<braid_qp>(QpObj { qp }, &parents)?;
        // SAFETY: the caller's contract.
        unsafe { put(out, h, "out")? };
        Ok(BRAID_OK)
    })
}

/// Destroys a QP: its outstanding work is dropped without completions; the peer's
/// operations on it fail.
#[unsafe(no_mangle)]
pub extern "C" fn braid_qp_destroy(qp: *mut braid_qp) -> i32 {
    call("braid_qp_destroy", || {
        drop(handle::remove(qp)?);
        Ok(BRAID_OK)
    })
}

/// Writes the QP's connection information (device address, QP number, first PSN, public key
/// of an encrypted QP) into `buf` as a `BRAID_QP_INFO_SIZE`-byte blob, for the peer's
/// `braid_qp_connect`. Send it over any out-of-band channel as it is. Returns the number of
/// bytes written, or `BRAID_ENOSPC` if `len` is smaller.
///
/// # Safety
/// `buf` must be NULL or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_qp_info(qp: *const braid_qp, buf: *mut u8, len: usize) -> i32 {
    call("braid_qp_info", || {
        let q = handle::get(qp)?;
        non_null(buf, "buf")?;
        if len < BRAID_QP_INFO_SIZE {
            return Err(Error::new(
                BRAID_ENOSPC,
                format!("len {len} is below BRAID_QP_INFO_SIZE ({BRAID_QP_INFO_SIZE})"),
            ));
        }
        let blob = encode_info(&q.qp.info());
        // SAFETY: buf is non-null and writable for len >= BRAID_QP_INFO_SIZE bytes (the
        // caller's contract); the source is a local array.
        unsafe { core::ptr::copy_nonoverlapping(blob.as_ptr(), buf, blob.len()) };
        Ok(BRAID_QP_INFO_SIZE as i32)
    })
}

/// Connects the QP to the peer QP whose `braid_qp_info` blob is `info` (exactly
/// `BRAID_QP_INFO_SIZE` bytes). A blob that is not valid QP information returns
/// `BRAID_EPROTO`; connecting twice `BRAID_EBADFD`; an encrypted QP and a plain one
/// `BRAID_EPROTO`.
///
/// # Safety
/// `info` must be NULL or readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_qp_connect(qp: *const braid_qp, info: *const u8, len: usize) -> i32 {
    call("braid_qp_connect", || {
        let q = handle::get(qp)?;
        non_null(info, "info")?;
        if len != BRAID_QP_INFO_SIZE {
            return Err(Error::new(
                BRAID_EINVAL,
                format!("len {len} is not BRAID_QP_INFO_SIZE ({BRAID_QP_INFO_SIZE})"),
            ));
        }
        // SAFETY: non-null and readable for len bytes (the caller's contract).
        let blob = unsafe { core::slice::from_raw_parts(info, len) };
        let peer = decode_info(blob)?;
        q.qp.connect(peer)?;
        Ok(BRAID_OK)
    })
}

/// Writes the QP's number to `*qp_num`.
///
/// # Safety
/// `qp_num` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_qp_num(qp: *const braid_qp, qp_num: *mut u32) -> i32 {
    call("braid_qp_num", || {
        let q = handle::get(qp)?;
        // SAFETY: the caller's contract.
        unsafe { put(qp_num, q.qp.info().qpn, "qp_num")? };
        Ok(BRAID_OK)
    })
}

/// Moves the QP to the error state: its outstanding work completes as
/// `BRAID_WC_WR_FLUSH_ERR`.
#[unsafe(no_mangle)]
pub extern "C" fn braid_qp_set_error(qp: *const braid_qp) -> i32 {
    call("braid_qp_set_error", || {
        handle::get(qp)?.qp.set_error()?;
        Ok(BRAID_OK)
    })
}

/// Fills `stats` with the QP's state and counters. Set `stats->struct_size` first.
///
/// # Safety
/// `stats` must be NULL or point to a writable `braid_qp_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_qp_query_stats(
    qp: *const braid_qp,
    stats: *mut braid_qp_stats,
) -> i32 {
    call("braid_qp_query_stats", || {
        let q = handle::get(qp)?;
        // SAFETY: the caller's contract.
        unsafe { get_sized(stats, "stats")? };
        let s =
            q.qp.stats()
                .ok_or_else(|| Error::new(BRAID_EBADF, "the engine has no such QP"))?;
        let v = braid_qp_stats {
            struct_size: size_of::<braid_qp_stats>() as u32,
            state: match s.state {
                QpState::Init => BRAID_QPS_INIT,
                QpState::Connected => BRAID_QPS_CONNECTED,
                QpState::Error => BRAID_QPS_ERROR,
            },
            qp_num: q.qp.info().qpn,
            reserved: 0,
            srtt_ns: s.srtt_ns,
            min_rtt_ns: s.min_rtt_ns,
            rto_ns: s.rto_ns,
            cwnd_bytes: s.cwnd_bytes,
            in_flight_bytes: s.in_flight_bytes,
            packets_sent: s.packets_sent,
            retransmits: s.retransmits,
            rtos: s.rtos,
            ce_marks: s.ce_marks,
            repaths: s.repaths,
        };
        // SAFETY: the caller's contract.
        unsafe { put(stats, v, "stats")? };
        Ok(BRAID_OK)
    })
}

/// Posts `count` send work requests, in order. Returns 0 when all were posted. On a refusal
/// it returns the code, stores the refused request's index in `*bad_index` (if not NULL) and
/// posts none after it; the ones before it were posted. When another thread holds the
/// engine, a request may be accepted here and refused later: it then completes with an error
/// status (`BRAID_WC_LOC_PROT_ERR` or `BRAID_WC_LOC_LEN_ERR`), in posting order, and the QP
/// goes to the error state, as verbs reports a bad buffer.
///
/// # Safety
/// `wr` must be NULL or readable for `count` requests whose `sg_list`s are NULL or readable
/// for `num_sge` entries; `bad_index` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_post_send(
    qp: *const braid_qp,
    wr: *const braid_send_wr,
    count: usize,
    bad_index: *mut usize,
) -> i32 {
    call("braid_post_send", || {
        let q = handle::get(qp)?;
        post_each(wr, count, bad_index, |w| {
            // SAFETY: the caller's contract covers each request's sg_list.
            let w = unsafe { send_wr(w)? };
            Ok(q.qp.post_send(w)?)
        })
    })
}

/// Posts `count` receive work requests, in order; refusals as for `braid_post_send`.
///
/// # Safety
/// `wr` must be NULL or readable for `count` requests whose `sg_list`s are NULL or readable
/// for `num_sge` entries; `bad_index` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_post_recv(
    qp: *const braid_qp,
    wr: *const braid_recv_wr,
    count: usize,
    bad_index: *mut usize,
) -> i32 {
    call("braid_post_recv", || {
        let q = handle::get(qp)?;
        post_each(wr, count, bad_index, |w| {
            if w.reserved != 0 {
                return Err(Error::new(BRAID_EINVAL, "reserved is not 0"));
            }
            // SAFETY: the caller's contract covers each request's sg_list.
            let sges = unsafe { sges(w.sg_list, w.num_sge)? };
            Ok(q.qp.post_recv(RecvWr {
                wr_id: w.wr_id,
                sges,
            })?)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4() -> QpInfo {
        QpInfo {
            addr: "10.1.2.3:4791".parse().unwrap(),
            qpn: 0x0102_0304,
            psn: 0x00ab_cdef,
            seal_key: None,
        }
    }

    #[test]
    fn qp_information_round_trips() {
        let v6 = QpInfo {
            addr: "[fe80::1%7]:9000".parse().unwrap(),
            qpn: 9,
            psn: 10,
            seal_key: Some([0x5a; 32]),
        };
        for info in [v4(), v6] {
            assert_eq!(decode_info(&encode_info(&info)).unwrap(), info);
        }
    }

    #[test]
    fn every_corrupted_field_of_a_blob_is_refused() {
        let good = encode_info(&v4());
        let refused = |b: &[u8]| decode_info(b).map(|_| ()).unwrap_err().code;
        assert_eq!(refused(&good[..71]), BRAID_EINVAL);
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(refused(&long), BRAID_EINVAL);
        // Every byte outside the address, port, qpn and psn, set to a non-zero value that
        // does not form another valid blob, is refused.
        for i in (0..8).chain(10..16).chain(20..32).chain(40..72) {
            let mut b = good;
            b[i] ^= if i == 5 { 0x0f } else { 0x80 };
            assert_eq!(refused(&b), BRAID_EPROTO, "byte {i}");
        }
        let mut port0 = good;
        port0[8..10].fill(0);
        assert_eq!(refused(&port0), BRAID_EPROTO);
        let mut any = good;
        any[16..20].fill(0);
        assert_eq!(refused(&any), BRAID_EPROTO);
    }
}
