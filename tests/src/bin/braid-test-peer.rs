//! The far end of the two-process loopback test: opens a UDP device on 127.0.0.1, prints its
//! QP and region on stdout, reads the test's QP from stdin, and serves commands until `QUIT`
//! or end of input (see `braid_tests` for the protocol).
//!
//! Two additions for the namespace fault tests (`netns_faults`): an optional first argument,
//! the address to bind (default `127.0.0.1:0`), so the peer can run in another namespace
//! (`ip netns exec NS braid-test-peer 10.X.Y.2:4791`); and a `STATS` command, answered with
//! `STATS <rx_unknown_qp> <rx_wrong_peer> <rx_duplicates> <rx_out_of_window> <rx_bad_crc>`,
//! the device's counters of datagrams it dropped.
use std::io::{BufRead, Write};
use std::time::Duration;

use braid::{Access, Device, DeviceConfig, RecvWr};
use braid_tests::{PEER_RECV_LEN, PEER_REGION_LEN, fnv1a, format_info, parse_info, pattern_byte};

fn main() {
    if let Err(e) = serve() {
        eprintln!("braid-test-peer: {e}");
        std::process::exit(1);
    }
}

fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let bind = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".to_string());
    let dev = Device::open(DeviceConfig::udp(bind.parse()?).paths(16))?;
    let pd = dev.alloc_pd();
    let cq = dev.create_cq();
    let qp = pd.create_qp(&cq, &cq)?;
    let mr = pd.alloc_mr(PEER_REGION_LEN as usize, Access::ALL)?;
    let half: Vec<u8> = (0..PEER_REGION_LEN / 2).map(pattern_byte).collect();
    mr.write(0, &half)?;
    let rbuf = pd.alloc_mr(PEER_RECV_LEN as usize, Access::LOCAL_WRITE)?;
    let mut next_recv = 1;
    qp.post_recv(RecvWr {
        wr_id: next_recv,
        sges: vec![rbuf.sge(0, PEER_RECV_LEN)],
    })?;

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}",
        format_info(&qp.info(), mr.rkey(), PEER_REGION_LEN)
    )?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["QP", ..] => {
                let (peer, _, _) = parse_info(&line).ok_or("bad QP line")?;
                qp.connect(peer)?;
                writeln!(out, "READY")?;
            }
            ["SUM", off, len] => {
                let mut buf = vec![0u8; len.parse()?];
                mr.read(off.parse()?, &mut buf)?;
                writeln!(out, "SUM {}", fnv1a(&buf))?;
            }
            ["RECV"] => {
                let wc = cq
                    .wait(Duration::from_secs(20))
                    .ok_or("no receive completion")?;
                let mut buf = vec![0u8; wc.byte_len.min(PEER_RECV_LEN) as usize];
                rbuf.read(0, &mut buf)?;
                let imm = wc.imm.map_or("-".to_string(), |i| i.to_string());
                writeln!(
                    out,
                    "RECV {} {:?} {} {} {}",
                    wc.wr_id,
                    wc.status,
                    wc.byte_len,
                    imm,
                    fnv1a(&buf)
                )?;
                next_recv += 1;
                qp.post_recv(RecvWr {
                    wr_id: next_recv,
                    sges: vec![rbuf.sge(0, PEER_RECV_LEN)],
                })?;
            }
            ["STATS"] => {
                let s = dev.stats();
                writeln!(
                    out,
                    "STATS {} {} {} {} {}",
                    s.rx_unknown_qp,
                    s.rx_wrong_peer,
                    s.rx_duplicates,
                    s.rx_out_of_window,
                    s.rx_bad_crc
                )?;
            }
            ["QUIT"] => break,
            _ => return Err(format!("unknown command {line:?}").into()),
        }
        out.flush()?;
    }
    Ok(())
}
