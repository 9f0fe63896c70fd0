//! The test networks' fault injector: an XDP program that, on IPv4/UDP packets (or every
//! IPv4 packet, [`netem_ipv4`]), drops a fraction, marks a fraction of the ECN-capable ones
//! Congestion Experienced (fixing the IP checksum), or drops everything (black hole), and
//! counts what it did in an array map. This machine has no `netem` qdisc, hence a program.
//!
//! It is assembled with the datapath's BPF plumbing ([`braid_datapath::bpf`]), which the
//! AF_XDP datapath uses for its own steering program; only tests need this one, so it lives
//! in the test harness rather than in the production crate.

use std::io;

use braid_datapath::bpf::asm;
use braid_datapath::bpf::{Insn, LoadError, Map, Program, XDP_DROP, XDP_PASS, helper, wire16};

/// Offsets into a frame: Ethernet (14) + IPv4 without options (20) + UDP (8).
const ETH_TYPE: i16 = 12;
const IP_VER_IHL: i16 = 14;
const IP_TOS: i16 = 15;
const IP_PROTO: i16 = 23;
const IP_CSUM: i16 = 24;
const HEADERS: i32 = 42;

/// Counter slots of the [`netem`] program's map.
pub mod netem_counter {
    /// IPv4/UDP packets seen.
    pub const SEEN: u32 = 0;
    /// Packets dropped (loss or black hole).
    pub const DROPPED: u32 = 1;
    /// Packets marked CE.
    pub const MARKED: u32 = 2;
}

/// What a [`netem`] program does to IPv4/UDP packets (other traffic always passes).
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct NetemConfig {
    /// Fraction of packets dropped, 0.0 to 1.0 (resolution 1/65536).
    pub loss: f64,
    /// Fraction of ECN-capable packets marked Congestion Experienced, 0.0 to 1.0.
    pub ce_mark: f64,
    /// Drop every packet.
    pub blackhole: bool,
}

fn per_65536(p: f64) -> i32 {
    if p.is_nan() || p <= 0.0 {
        0
    } else {
        (p.min(1.0) * 65536.0).round() as i32
    }
}

/// A fault-injecting XDP program for test networks, with a counter map
/// ([`netem_counter`]) as its first map and a control map as its second: a nonzero value at
/// index 0 black-holes the path at once, without re-attaching ([`set_netem_blackhole`]).
///
/// ```text
/// if not IPv4/UDP (or too short)          -> pass
/// count SEEN
/// if control[0] != 0                      -> count DROPPED; drop
/// if blackhole or prandom16 < loss        -> count DROPPED; drop
/// if ip.tos & 3 in {1, 2} and prandom16 < ce:
///     ip.tos |= 3; fix ip.csum incrementally (RFC 1624); count MARKED
/// pass
/// ```
pub fn netem(cfg: NetemConfig) -> Result<Program, LoadError> {
    netem_program(cfg, true)
}

/// Like [`netem`], but for every IPv4 packet, whatever its protocol (TCP too), so kernel TCP
/// and MPTCP baselines meet the same loss and marks as Braid. Its counters count IPv4
/// packets.
pub fn netem_ipv4(cfg: NetemConfig) -> Result<Program, LoadError> {
    netem_program(cfg, false)
}

fn netem_program(cfg: NetemConfig, udp_only: bool) -> Result<Program, LoadError> {
    use asm::*;
    let counters = Map::counters(3).map_err(|error| LoadError {
        error,
        log: String::new(),
    })?;
    let control = Map::counters(1).map_err(|error| LoadError {
        error,
        log: String::new(),
    })?;
    let cfd = counters.fd();
    let ctl = control.fd();
    let loss = if cfg.blackhole {
        65536
    } else {
        per_65536(cfg.loss)
    };
    let ce = per_65536(cfg.ce_mark);
    // Counts slot `key` (clobbers r0-r5).
    let count = |key: i32| -> Vec<Insn> {
        let mut v = vec![st_imm(Size::W, 10, -4, key), mov_reg(2, 10), add_imm(2, -4)];
        v.extend(ld_map_fd(1, cfd));
        v.extend([
            call(helper::MAP_LOOKUP_ELEM),
            jeq_imm(0, 0, 2),
            mov_imm(1, 1),
            atomic_add64(0, 0, 1),
        ]);
        v
    };
    // r7 = data, r8 = data_end survive helper calls (callee-saved).
    let mut p = vec![
        ldx(Size::W, 7, 1, 0),
        ldx(Size::W, 8, 1, 4),
        mov_reg(4, 7),
        add_imm(4, HEADERS),
        jgt_reg(4, 8, 0), // patched -> pass
        ldx(Size::H, 5, 7, ETH_TYPE),
        jne_imm(5, wire16(0x0800), 0), // patched -> pass
        ldx(Size::B, 5, 7, IP_VER_IHL),
        jne_imm(5, 0x45, 0), // patched -> pass
        ldx(Size::B, 5, 7, IP_PROTO),
        if udp_only {
            jne_imm(5, 17, 0) // patched -> pass
        } else {
            add_imm(5, 0) // any protocol: a no-op in its place keeps the offsets
        },
    ];
    let to_pass: &[usize] = if udp_only { &[4, 6, 8, 10] } else { &[4, 6, 8] };
    p.extend(count(netem_counter::SEEN as i32));
    // The run-time black hole switch.
    let switch_drop: Vec<Insn> = {
        let mut d = count(netem_counter::DROPPED as i32);
        d.extend([mov_imm(0, XDP_DROP), exit()]);
        d
    };
    p.extend([st_imm(Size::W, 10, -4, 0), mov_reg(2, 10), add_imm(2, -4)]);
    p.extend(ld_map_fd(1, ctl));
    p.extend([
        call(helper::MAP_LOOKUP_ELEM),
        jeq_imm(0, 0, 2 + switch_drop.len() as i16),
        ldx(Size::Dw, 1, 0, 0),
        jeq_imm(1, 0, switch_drop.len() as i16),
    ]);
    p.extend(switch_drop);
    // Loss.
    let mut loss_branch = vec![];
    if loss > 0 {
        loss_branch.push(call(helper::GET_PRANDOM_U32));
        loss_branch.push(rsh_imm(0, 16));
        let drop_block: Vec<Insn> = {
            let mut d = count(netem_counter::DROPPED as i32);
            d.extend([mov_imm(0, XDP_DROP), exit()]);
            d
        };
        if loss < 65536 {
            loss_branch.push(jge_imm(0, loss, drop_block.len() as i16));
        }
        loss_branch.extend(drop_block);
    }
    p.extend(loss_branch);
    // CE marking of ECT(0)/ECT(1) packets.
    if ce > 0 {
        let mut mark = vec![
            // r9 = the 16-bit word holding version/IHL and TOS, as loaded.
            ldx(Size::H, 9, 7, IP_VER_IHL),
            ldx(Size::B, 5, 7, IP_TOS),
            and_imm(5, 3),
            jeq_imm(5, 0, 0), // patched -> pass (not ECT)
            jeq_imm(5, 3, 0), // patched -> pass (already CE)
            call(helper::GET_PRANDOM_U32),
            rsh_imm(0, 16),
            jge_imm(0, ce, 0), // patched -> pass
            // new word: TOS is the second byte, the high byte of the loaded u16.
            mov_reg(4, 9),
            or_imm(4, 0x0300),
            // HC' = ~(~HC + ~m + m'), folded twice.
            ldx(Size::H, 3, 7, IP_CSUM),
            xor_imm(3, 0xffff),
            mov_reg(5, 9),
            xor_imm(5, 0xffff),
            add_reg(3, 5),
            add_reg(3, 4),
            mov_reg(5, 3),
            rsh_imm(5, 16),
            and_imm(3, 0xffff),
            add_reg(3, 5),
            mov_reg(5, 3),
            rsh_imm(5, 16),
            and_imm(3, 0xffff),
            add_reg(3, 5),
            xor_imm(3, 0xffff),
            stx(Size::H, 7, IP_CSUM, 3),
            stx(Size::H, 7, IP_VER_IHL, 4),
        ];
        mark.extend(count(netem_counter::MARKED as i32));
        let base = p.len();
        let end = base + mark.len();
        for i in [3usize, 4, 7] {
            mark[i].off = (end - (base + i) - 1) as i16;
        }
        p.extend(mark);
    }
    // pass:
    let pass = p.len();
    for &i in to_pass {
        p[i].off = (pass - i - 1) as i16;
    }
    p.extend([mov_imm(0, XDP_PASS), exit()]);
    Program::load_xdp(&p, "braid_netem", vec![counters, control])
}

/// Turns the run-time black hole of a [`netem`] program on or off (takes effect at the next
/// packet).
pub fn set_netem_blackhole(prog: &Program, on: bool) -> io::Result<()> {
    let control = prog
        .maps()
        .get(1)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a netem program"))?;
    control.update(&0u32.to_ne_bytes(), &u64::from(on).to_ne_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::require_root;
    use braid_datapath::bpf::{Program, XdpLink, XdpMode, attach_xdp, ifindex};

    #[test]
    fn netem_programs_pass_the_verifier() {
        if !require_root("netem_programs_pass_the_verifier") {
            return;
        }
        for cfg in [
            NetemConfig::default(),
            NetemConfig {
                loss: 0.05,
                ..Default::default()
            },
            NetemConfig {
                ce_mark: 0.2,
                ..Default::default()
            },
            NetemConfig {
                loss: 0.01,
                ce_mark: 1.0,
                blackhole: false,
            },
            NetemConfig {
                blackhole: true,
                ..Default::default()
            },
        ] {
            netem(cfg).unwrap_or_else(|e| panic!("netem {cfg:?}: {e}"));
            netem_ipv4(cfg).unwrap_or_else(|e| panic!("netem_ipv4 {cfg:?}: {e}"));
        }
    }

    /// The UDP-only netem lets TCP through; the IPv4 one drops and counts it too.
    #[test]
    fn netem_ipv4_reaches_tcp_and_netem_does_not() {
        if !require_root("netem_ipv4_reaches_tcp_and_netem_does_not") {
            return;
        }
        in_private_netns(|lo| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let at = listener.local_addr().expect("addr");
            let wait = std::time::Duration::from_millis(300);
            let hole = NetemConfig {
                blackhole: true,
                ..Default::default()
            };
            let prog = netem(hole).expect("load");
            let link = attach(&prog, lo);
            std::net::TcpStream::connect_timeout(&at, wait).expect("TCP passes a UDP netem");
            assert_eq!(
                prog.maps()[0].counter(netem_counter::SEEN).expect("read"),
                0
            );
            drop(link);
            let prog = netem_ipv4(hole).expect("load");
            let _link = attach(&prog, lo);
            assert!(
                std::net::TcpStream::connect_timeout(&at, wait).is_err(),
                "a TCP connection crossed an IPv4 black hole"
            );
            assert!(
                prog.maps()[0]
                    .counter(netem_counter::DROPPED)
                    .expect("read")
                    > 0
            );
        });
    }

    /// In a private network namespace (only `lo`), attach both programs in generic mode and
    /// see a black-holing netem drop and count real UDP packets, then detach on drop.
    #[test]
    fn netem_drops_and_counts_real_packets_then_detaches() {
        if !require_root("netem_drops_and_counts_real_packets_then_detaches") {
            return;
        }
        in_private_netns(|lo| {
            let rx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
            rx.set_read_timeout(Some(std::time::Duration::from_millis(200)))
                .expect("timeout");
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
            let dest = rx.local_addr().expect("addr");
            let prog = netem(NetemConfig {
                blackhole: true,
                ..Default::default()
            })
            .expect("load");
            let link = attach(&prog, lo);
            for _ in 0..20 {
                tx.send_to(b"x", dest).expect("send");
            }
            let mut buf = [0u8; 8];
            assert!(
                rx.recv_from(&mut buf).is_err(),
                "a black hole let a packet through"
            );
            let c = &prog.maps()[0];
            assert_eq!(c.counter(netem_counter::SEEN).expect("read"), 20);
            assert_eq!(c.counter(netem_counter::DROPPED).expect("read"), 20);
            drop(link);
            tx.send_to(b"y", dest).expect("send");
            assert_eq!(rx.recv_from(&mut buf).expect("delivered after detach").0, 1);
            // The run-time switch black-holes a harmless program without re-attaching it.
            let prog = netem(NetemConfig::default()).expect("load");
            let _link = attach(&prog, lo);
            tx.send_to(b"z", dest).expect("send");
            assert_eq!(rx.recv_from(&mut buf).expect("passes").0, 1);
            set_netem_blackhole(&prog, true).expect("switch on");
            tx.send_to(b"z", dest).expect("send");
            assert!(
                rx.recv_from(&mut buf).is_err(),
                "the switch let a packet through"
            );
            assert_eq!(
                prog.maps()[0]
                    .counter(netem_counter::DROPPED)
                    .expect("read"),
                1
            );
            set_netem_blackhole(&prog, false).expect("switch off");
            tx.send_to(b"y", dest).expect("send");
            assert_eq!(rx.recv_from(&mut buf).expect("passes again").0, 1);
        });
    }

    /// Brings `lo` up in a fresh network namespace (it starts down).
    fn lo_up() {
        // SAFETY: plain socket syscall; the descriptor is closed below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
        assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        // SAFETY: `req` is a valid ifreq for these ioctls and `fd` a valid socket; the flags
        // union member is the one SIOCGIFFLAGS fills.
        unsafe {
            assert_eq!(libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req), 0);
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            assert_eq!(libc::ioctl(fd, libc::SIOCSIFFLAGS, &mut req), 0);
            libc::close(fd);
        }
    }

    /// Attaches `prog` to `lo` in generic mode. The kernel tears the previous attachment down
    /// asynchronously, so a re-attach right after a drop can meet EBUSY for a while (longer on
    /// a loaded machine): retry with backoff for up to about two seconds.
    fn attach(prog: &Program, lo: u32) -> XdpLink {
        let mut wait = std::time::Duration::from_millis(5);
        for _ in 0..10 {
            match attach_xdp(prog, lo, XdpMode::Generic) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => std::thread::sleep(wait),
                r => return r.expect("attach"),
            }
            wait = (wait * 2).min(std::time::Duration::from_millis(400));
        }
        attach_xdp(prog, lo, XdpMode::Generic).expect("attach (still busy after retries)")
    }

    /// In a private namespace, runs `f` with `lo` up and its index.
    fn in_private_netns(f: impl FnOnce(u32) + Send + 'static) {
        std::thread::spawn(move || {
            // SAFETY: unshare takes no pointers and affects only this thread's network
            // namespace.
            let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "unshare: {}", io::Error::last_os_error());
            lo_up();
            f(ifindex("lo").expect("lo exists"));
        })
        .join()
        .expect("netns thread");
    }

    /// CE marking rewrites the TOS byte and the IP checksum so the receiving kernel still
    /// accepts the packet; loss drops about the configured fraction; both are counted.
    #[test]
    fn netem_marks_ce_with_a_valid_checksum_and_drops_its_fraction() {
        if !require_root("netem_marks_ce_with_a_valid_checksum_and_drops_its_fraction") {
            return;
        }
        in_private_netns(|lo| {
            use braid_datapath::udp::{UdpConfig, UdpDatapath};
            use braid_datapath::{Datapath, Ecn, RecvBatch, Transmit};
            let rx = UdpDatapath::bind(UdpConfig::new("127.0.0.1:0".parse().expect("addr"), 1))
                .expect("rx");
            let tx = UdpDatapath::bind(UdpConfig::new("127.0.0.1:0".parse().expect("addr"), 1))
                .expect("tx");
            let send = |n: usize, ecn: Ecn| {
                for _ in 0..n {
                    let t = Transmit {
                        dest: rx.local_addr(),
                        path: 0,
                        ecn,
                        contents: b"ce?",
                    };
                    assert_eq!(tx.send(&[t]).expect("send"), 1);
                }
            };
            let mut batch = RecvBatch::new(64, 64);
            let mut recv_all = || {
                let mut got = Vec::new();
                while let Ok(n) = rx.recv(&mut batch, Some(std::time::Duration::from_millis(100))) {
                    if n == 0 {
                        break;
                    }
                    got.extend(batch.metas[..n].iter().map(|m| m.ecn));
                }
                got
            };
            let prog = netem(NetemConfig {
                ce_mark: 1.0,
                ..Default::default()
            })
            .expect("load");
            let link = attach(&prog, lo);
            send(50, Ecn::Ect0);
            send(10, Ecn::NotEct);
            let got = recv_all();
            assert_eq!(
                got.len(),
                60,
                "marked packets must keep a valid IP checksum"
            );
            assert_eq!(got.iter().filter(|&&e| e == Ecn::Ce).count(), 50);
            assert_eq!(
                got.iter().filter(|&&e| e == Ecn::NotEct).count(),
                10,
                "non-ECT packets are never marked"
            );
            assert_eq!(
                prog.maps()[0].counter(netem_counter::MARKED).expect("read"),
                50
            );
            drop(link);

            let prog = netem(NetemConfig {
                loss: 0.25,
                ..Default::default()
            })
            .expect("load");
            let _link = attach(&prog, lo);
            send(2000, Ecn::Ect0);
            let got = recv_all().len();
            let dropped = prog.maps()[0]
                .counter(netem_counter::DROPPED)
                .expect("read");
            assert_eq!(got as u64 + dropped, 2000);
            assert!(
                (400..600).contains(&dropped),
                "25% of 2000 dropped, got {dropped}"
            );
        });
    }
}
