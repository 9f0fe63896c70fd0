//! Seed corpora: real traffic captured from the simulator and hand-picked cases, one
//! meaningful input per file.
use super::ack_sack::*;
use super::engine::*;
use super::sim_ops::*;
use super::*;

/// One seed: its file name and bytes.
pub type Seed = (String, Vec<u8>);

/// The seeds of target `name`.
pub fn for_target(name: &str) -> Vec<Seed> {
    match name {
        "packet" => packet(),
        "engine_datagrams" => engine_datagrams(),
        "sim_ops" => sim_ops(),
        "ack_sack" => ack_sack(),
        _ => panic!("unknown fuzz target {name:?}"),
    }
}

fn sim_input(config: u8, ops: &[SimOp]) -> Vec<u8> {
    let mut o = Out::default();
    o.u8(config);
    for op in ops {
        op.encode(&mut o);
    }
    o.0
}

fn write(lane: u8, flags: u8, sges: &[(u16, u16)], target: u8, remote_off: u16) -> SimOp {
    SimOp::Write {
        lane,
        flags,
        sges: sges.to_vec(),
        target,
        remote_off,
        imm: 0x1234_5678,
    }
}

fn read(lane: u8, flags: u8, target: u8, remote_off: u16, len: u16, land_off: u16) -> SimOp {
    SimOp::Read {
        lane,
        flags,
        target,
        remote_off,
        len,
        land_off,
    }
}

fn send(lane: u8, flags: u8, sges: &[(u16, u16)]) -> SimOp {
    SimOp::Send {
        lane,
        flags,
        sges: sges.to_vec(),
        imm: 0xabcd,
    }
}

fn recv(lane: u8, pieces: u8, len: u16) -> SimOp {
    SimOp::Recv { lane, pieces, len }
}

fn atomic(lane: u8, flags: u8, remote_off: u16, land_off: u16, a: u64, b: u64) -> SimOp {
    SimOp::Atomic {
        lane,
        flags,
        target: 0,
        remote_off,
        land_off,
        a,
        b,
    }
}

fn link(node: u8, path: u8, knob: u8, level: u8) -> SimOp {
    SimOp::Link {
        node,
        path,
        knob,
        level,
    }
}

/// A varied exchange on two lanes, with loss and duplication: every kind of packet,
/// retransmissions, duplicate reports and NAKs.
fn busy_scenario() -> Vec<SimOp> {
    use simflag::*;
    vec![
        link(0, 0x80, 0, 1),
        link(1, 0x80, 2, 1),
        recv(0, 0, 1000),
        recv(0, 1, 900),
        recv(0, 2, 600),
        write(0, 0, &[(0, 2000), (3000, 1000)], 0, 100),
        read(0, 0, 0, 0, 3000, 0),
        send(0, 0, &[(100, 700)]),
        send(0, IMM_OR_CAS, &[(900, 500)]),
        write(0, IMM_OR_CAS, &[(5000, 300)], 0, 3500),
        atomic(0, 0, 64, 3200, 5, 0),
        atomic(0, IMM_OR_CAS | COMPARE_ORACLE, 72, 3208, 9, 0),
        read(0, 0, 2, 100, 1500, 3300),
        SimOp::Step(63),
        SimOp::NewLane,
        write(1, 0, &[(0, 64)], 2, 0),
        SimOp::Step(63),
        SimOp::NewLane,
        send(2, 0, &[(0, 100)]),
        SimOp::Settle,
    ]
}

/// Datagrams delivered in [`busy_scenario`] on the given configuration.
fn captured(config: u8) -> Vec<Vec<u8>> {
    let mut t = SimTarget::new(config);
    t.capture = Some(Vec::new());
    for op in busy_scenario() {
        t.apply(&op);
    }
    t.finish();
    t.capture.take().unwrap_or_default()
}

/// A label for the shape of a packet, to keep one or two of each.
fn shape(d: &[u8]) -> String {
    match Packet::parse(d) {
        Ok(p) => {
            let what = match p.body {
                Body::Request(r) => format!("req-{:?}", r.op),
                Body::ReadResponse(_) => "read-resp".into(),
                Body::AtomicResponse(_) => "atomic-resp".into(),
                Body::Ack(_) => "ack".into(),
                Body::Nak(n) => format!("nak-{:?}", n.syndrome),
            };
            let flags = match p.header.flags & 3 {
                0 => "",
                1 => "-rtx",
                2 => "-dup",
                _ => "-rtx-dup",
            };
            let size = if p.payload.len() > 600 { "-big" } else { "" };
            format!("{what}{flags}{size}").to_lowercase()
        }
        Err(e) => format!("{e:?}").to_lowercase(),
    }
}

/// Up to `per_shape` datagrams of each shape.
fn diverse(all: Vec<Vec<u8>>, per_shape: usize, prefix: &str) -> Vec<Seed> {
    let mut count: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for d in all {
        let s = shape(&d);
        let n = count.entry(s.clone()).or_default();
        if *n < per_shape {
            *n += 1;
            out.push((format!("{prefix}-{s}-{n}"), d));
        }
    }
    out
}

fn packet() -> Vec<Seed> {
    let mut seeds = diverse(captured(0x0a), 2, "sim");
    seeds.extend(diverse(captured(0x00), 1, "sim-small"));
    let h = |kind| Header {
        kind,
        path: 255,
        flags: wire::FLAG_RETRANSMIT | wire::FLAG_DUPLICATE,
        dst_qpn: u32::MAX,
        src_qpn: 0,
        psn: u32::MAX,
        send_ts_ns: u64::MAX,
    };
    let req = |op, msg_len, offset| {
        Body::Request(wire::Request {
            op,
            msn: u32::MAX,
            ssn: 7,
            imm: 0xdead_beef,
            rkey: 0x1234,
            msg_len,
            offset,
            remote_offset: u64::MAX - 7,
        })
    };
    let mut hand: Vec<(&str, Vec<u8>)> = vec![
        (
            "edge-write-at-end",
            build(&h(Kind::Request), &req(Op::Write, 10, 6), &[1; 4]),
        ),
        (
            "edge-send-empty",
            build(&h(Kind::Request), &req(Op::Send, 0, 0), &[]),
        ),
        (
            "edge-read",
            build(&h(Kind::Request), &req(Op::Read, u32::MAX, 0), &[]),
        ),
        (
            "edge-cas",
            build(&h(Kind::Request), &req(Op::CompareSwap, 8, 0), &[9; 16]),
        ),
        (
            "edge-read-resp-last",
            build(
                &h(Kind::ReadResponse),
                &Body::ReadResponse(wire::ReadResponse {
                    msn: 1,
                    offset: u32::MAX - 3,
                    msg_len: u32::MAX,
                }),
                &[7; 3],
            ),
        ),
        (
            "edge-ack-full-sack",
            build(
                &h(Kind::Ack),
                &Body::Ack(wire::Ack {
                    cum_psn: u32::MAX,
                    echo_psn: 3,
                    echo_ts_ns: 0,
                    hold_ns: u32::MAX,
                    ce_count: u32::MAX,
                    sack: [0xff; 32],
                }),
                &[],
            ),
        ),
        (
            "edge-nak",
            build(
                &h(Kind::Nak),
                &Body::Nak(wire::Nak {
                    psn: 0,
                    msn: u32::MAX,
                    syndrome: Syndrome::RemoteOperation,
                }),
                &[],
            ),
        ),
    ];
    let good = build(&h(Kind::Request), &req(Op::Write, 100, 0), &[5; 100]);
    let refit = |mut c: Vec<u8>| {
        c.extend_from_slice(&[0; 4]);
        fix_crc(&mut c);
        c
    };
    let content = &good[..good.len() - wire::TRAILER_LEN];
    let mut bad_crc = good.clone();
    bad_crc[30] ^= 1;
    hand.push(("bad-crc", bad_crc));
    hand.push(("bad-empty", Vec::new()));
    hand.push(("bad-27-bytes", refit(content[..23].to_vec())));
    hand.push((
        "bad-header-only",
        refit(content[..wire::HEADER_LEN].to_vec()),
    ));
    hand.push((
        "bad-body-cut",
        refit(content[..wire::HEADER_LEN + 35].to_vec()),
    ));
    for (name, at, v) in [
        ("bad-version", 0, 2u8),
        ("bad-kind", 1, 6),
        ("bad-op", wire::HEADER_LEN, 7),
    ] {
        let mut c = content.to_vec();
        c[at] = v;
        hand.push((name, refit(c)));
    }
    let mut c = content.to_vec();
    c[wire::HEADER_LEN + 20..wire::HEADER_LEN + 24].copy_from_slice(&99u32.to_be_bytes());
    hand.push(("bad-payload-past-message", refit(c)));
    let mut nak = build(
        &h(Kind::Nak),
        &Body::Nak(wire::Nak {
            psn: 0,
            msn: 0,
            syndrome: Syndrome::RemoteAccess,
        }),
        &[],
    );
    nak[wire::HEADER_LEN + 8] = 9;
    fix_crc(&mut nak);
    hand.push(("bad-syndrome", nak));
    seeds.extend(hand.into_iter().map(|(n, d)| (n.to_string(), d)));
    seeds
}

/// Records for [`super::engine_datagrams`]: (control byte, datagram).
fn engine_input(config: u8, recs: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut o = Out::default();
    o.u8(config);
    for (c, d) in recs {
        o.u8(*c).u16(d.len() as u16).bytes(d);
    }
    o.0
}

fn engine_datagrams() -> Vec<Seed> {
    use ctrl::*;
    let config = 0x0a;
    let mut t = EngineTarget::new(config);
    t.emitted = Some(Vec::new());
    t.transmit_all();
    let mine = t.emitted.take().unwrap_or_default();
    let (qpn, my_psn) = (t.qp.qpn, t.qp.psn);
    let rkey = |i: usize| t.regions[i].keys.rkey;
    let req_h = |psn_off: u32| header(Kind::Request, qpn, PEER_QPN, PEER_PSN.wrapping_add(psn_off));
    let request = |op, ssn, rkey, msg_len, offset, remote_offset| {
        Body::Request(wire::Request {
            op,
            msn: 0,
            ssn,
            imm: 0x77,
            rkey,
            msg_len,
            offset,
            remote_offset,
        })
    };
    let data = |n: usize| pattern(0xee, n);
    let w = |psn, region: usize, off: u64, n: usize| {
        build(
            &req_h(psn),
            &request(Op::Write, 0, rkey(region), n as u32, 0, off),
            &data(n),
        )
    };
    let go = TRANSMIT | TIMEOUT;
    let mut seeds: Vec<Seed> = Vec::new();
    let mut add = |name: &str, recs: Vec<(u8, Vec<u8>)>| {
        seeds.push((name.to_string(), engine_input(config, &recs)));
    };
    for (i, r) in t.regions.iter().enumerate() {
        add(
            &format!("write-into-{}", r.name),
            vec![(go, w(0, i, 100, 200))],
        );
    }
    add(
        "write-multi-packet-out-of-order",
        vec![
            (
                go,
                build(
                    &req_h(1),
                    &request(Op::Write, 0, rkey(0), 1500, 1000, 0),
                    &data(500),
                ),
            ),
            (
                go,
                build(
                    &req_h(0),
                    &request(Op::Write, 0, rkey(0), 1500, 0, 0),
                    &data(1000),
                ),
            ),
        ],
    );
    add("write-past-end", vec![(go, w(0, 3, 2000, 100))]);
    add(
        "write-duplicate",
        vec![
            (go, w(0, 0, 0, 64)),
            (go, w(0, 0, 0, 64)),
            (go, w(1, 0, 64, 64)),
        ],
    );
    add("write-out-of-window", vec![(go, w(5000, 0, 0, 64))]);
    add("write-from-stranger", vec![(go | STRANGER, w(0, 0, 0, 64))]);
    for (i, name) in [
        (1, "ro"),
        (3, "all"),
        (4, "none"),
        (6, "other-pd"),
        (0, "rw"),
    ] {
        add(
            &format!("read-from-{name}"),
            vec![(
                go,
                build(&req_h(0), &request(Op::Read, 0, rkey(i), 1500, 0, 200), &[]),
            )],
        );
    }
    for (op, name) in [
        (Op::FetchAdd, "fetch-add"),
        (Op::CompareSwap, "compare-swap"),
    ] {
        for (i, r) in [(2, "atomic"), (1, "ro"), (3, "all")] {
            let mut ops = [0u8; 16];
            ops[7] = 3;
            add(
                &format!("{name}-on-{r}"),
                vec![(
                    go,
                    build(&req_h(0), &request(op, 0, rkey(i), 8, 0, 16), &ops),
                )],
            );
        }
    }
    add(
        "send-into-receives",
        vec![
            (
                go,
                build(&req_h(0), &request(Op::Send, 0, 0, 600, 0, 0), &data(600)),
            ),
            (
                go,
                build(
                    &req_h(1),
                    &request(Op::SendImm, 1, 0, 300, 200, 0),
                    &data(100),
                ),
            ),
            (
                go,
                build(
                    &req_h(2),
                    &request(Op::SendImm, 1, 0, 300, 0, 0),
                    &data(200),
                ),
            ),
        ],
    );
    add(
        "send-too-long",
        vec![(
            go,
            build(&req_h(0), &request(Op::Send, 0, 0, 601, 0, 0), &data(601)),
        )],
    );
    add(
        "send-without-receive",
        vec![(
            go,
            build(&req_h(0), &request(Op::Send, 3, 0, 10, 0, 0), &data(10)),
        )],
    );
    add(
        "write-imm-consumes-receive",
        vec![(
            go,
            build(
                &req_h(0),
                &request(Op::WriteImm, 0, rkey(0), 10, 0, 0),
                &data(10),
            ),
        )],
    );
    // Answers to the victim's own work.
    let resp_h = |psn_off: u32, kind| header(kind, qpn, PEER_QPN, PEER_PSN.wrapping_add(psn_off));
    let read_resp = |psn, offset, n: usize| {
        build(
            &resp_h(psn, Kind::ReadResponse),
            &Body::ReadResponse(wire::ReadResponse {
                msn: 1,
                offset,
                msg_len: 1024,
            }),
            &data(n),
        )
    };
    let atomic_resp = |psn, msn| {
        build(
            &resp_h(psn, Kind::AtomicResponse),
            &Body::AtomicResponse(wire::AtomicResponse { msn, original: 41 }),
            &[],
        )
    };
    let ack = |cum_off: u32, sack: [u8; 32], echo: &[u8]| {
        let echo_ts = Packet::parse(echo).map_or(1, |p| p.header.send_ts_ns);
        build(
            &header(Kind::Ack, qpn, PEER_QPN, 0),
            &Body::Ack(wire::Ack {
                cum_psn: my_psn.wrapping_add(cum_off),
                echo_psn: my_psn.wrapping_add(cum_off.saturating_sub(1)),
                echo_ts_ns: echo_ts,
                hold_ns: 1000,
                ce_count: 1,
                sack,
            }),
            &[],
        )
    };
    let sent = mine.len() as u32;
    let last = mine.last().cloned().unwrap_or_default();
    add("ack-everything", vec![(go, ack(sent, [0; 32], &last))]);
    add(
        "ack-sack-holes",
        vec![
            (go, ack(1, [0x55; 32], &last)),
            (go | 0x80, ack(sent, [0; 32], &last)),
        ],
    );
    add(
        "ack-beyond-sent",
        vec![(go, ack(sent + 10, [0xff; 32], &last))],
    );
    add(
        "answer-everything",
        vec![
            (go, ack(sent, [0; 32], &last)),
            (go, read_resp(0, 0, 600)),
            (go, read_resp(1, 600, 424)),
            (go, atomic_resp(2, 2)),
            (go, atomic_resp(3, 3)),
            (go, ack(sent, [0; 32], &last)),
        ],
    );
    add(
        "read-response-overflow",
        vec![(go, read_resp(0, 1000, 100)), (go, read_resp(1, 0, 1024))],
    );
    let nak = |psn_off: u32, msn, syndrome| {
        build(
            &header(Kind::Nak, qpn, PEER_QPN, 0),
            &Body::Nak(wire::Nak {
                psn: my_psn.wrapping_add(psn_off),
                msn,
                syndrome,
            }),
            &[],
        )
    };
    add("nak-access", vec![(go, nak(0, 0, Syndrome::RemoteAccess))]);
    add(
        "nak-rnr-then-timeouts",
        vec![
            (
                go,
                nak(sent.saturating_sub(2), 4, Syndrome::ReceiverNotReady),
            ),
            (go | 0xc0, Vec::new()),
        ],
    );
    add(
        "nak-wrong-msn",
        vec![(go, nak(0, 3, Syndrome::InvalidRequest))],
    );
    // Raw captured traffic, retargeted by the patch bit.
    let traffic = captured(0x0a);
    let mut recs: Vec<(u8, Vec<u8>)> = Vec::new();
    for (i, d) in traffic.iter().take(40).enumerate() {
        recs.push((PATCH | if i % 4 == 0 { go } else { 0 }, d.clone()));
    }
    add("patched-traffic", recs);
    for k in 1..=5u8 {
        let mut d = pattern(k, 120);
        d[1] = k - 1;
        add(&format!("patched-random-kind-{k}"), vec![(PATCH | go, d)]);
    }
    add(
        "garbage",
        vec![(go, pattern(9, 300)), (0, Vec::new()), (go, vec![1; 28])],
    );
    // The same records against an encrypted QP: the input speaks as the authenticated peer
    // (every datagram that parses is sealed before delivery).
    let encrypted: Vec<Seed> = seeds
        .iter()
        .map(|(name, input)| {
            let mut input = input.clone();
            input[0] |= super::ENCRYPTED;
            (format!("encrypted-{name}"), input)
        })
        .collect();
    seeds.extend(encrypted);
    seeds
}

fn sim_ops() -> Vec<Seed> {
    use simflag::*;
    let tgt = 0;
    let mut s: Vec<(&str, u8, Vec<SimOp>)> = vec![
        (
            "write",
            0x0a,
            vec![write(0, 0, &[(0, 3000)], tgt, 500), SimOp::Step(63)],
        ),
        (
            "write-small-datagrams",
            0x00,
            vec![
                write(0, 0, &[(10, 2000), (4000, 100)], tgt, 7),
                SimOp::Settle,
            ],
        ),
        (
            "writes-overlapping",
            0x0b,
            vec![
                write(0, 0, &[(0, 1500)], tgt, 0),
                write(0, 0, &[(2000, 1500)], tgt, 700),
                write(0, UNSIGNALED, &[(4000, 100)], tgt, 650),
                read(0, 0, tgt, 0, 2300, 0),
                SimOp::Settle,
                read(0, 0, tgt, 0, 2300, 0),
            ],
        ),
        (
            "write-then-read",
            0x0a,
            vec![
                write(0, 0, &[(100, 1000)], tgt, 100),
                SimOp::Settle,
                read(0, 0, tgt, 100, 1000, 50),
            ],
        ),
        (
            "read-ro",
            0x06,
            vec![read(0, 0, 2, 0, 2048, 2048), SimOp::Step(40)],
        ),
        (
            "send-recv",
            0x0a,
            vec![
                recv(0, 0, 1024),
                recv(0, 2, 999),
                send(0, 0, &[(0, 1024)]),
                send(0, IMM_OR_CAS, &[(50, 300), (7000, 333)]),
                SimOp::Settle,
            ],
        ),
        (
            "recv-after-send",
            0x09,
            vec![
                send(0, 0, &[(0, 200)]),
                SimOp::Step(3),
                recv(0, 0, 500),
                SimOp::Settle,
            ],
        ),
        (
            "send-too-long",
            0x0a,
            vec![recv(0, 0, 100), send(0, 0, &[(0, 200)]), SimOp::Settle],
        ),
        (
            "send-without-recv",
            0x0a,
            vec![send(0, 0, &[(0, 200)]), SimOp::Settle],
        ),
        (
            "write-imm",
            0x0a,
            vec![
                recv(0, 1, 64),
                write(0, IMM_OR_CAS, &[(0, 2000)], tgt, 1000),
                SimOp::Settle,
            ],
        ),
        (
            "atomics",
            0x0a,
            vec![
                atomic(0, 0, 8, 0, 5, 0),
                atomic(0, 0, 8, 8, 6, 0),
                atomic(0, IMM_OR_CAS | COMPARE_ORACLE, 16, 16, 77, 0),
                atomic(0, IMM_OR_CAS, 16, 24, 1, 2),
                SimOp::Settle,
                atomic(0, IMM_OR_CAS | COMPARE_ORACLE, 8, 32, 0, 0),
                SimOp::Settle,
            ],
        ),
        (
            "atomic-refusals",
            0x0a,
            vec![
                atomic(0, UNALIGNED, 8, 0, 1, 0),
                atomic(0, BAD_LOCAL, 8, 0, 1, 0),
                atomic(0, 0, 8, 4095, 1, 0),
                SimOp::Atomic {
                    lane: 0,
                    flags: 0,
                    target: 2,
                    remote_off: 0,
                    land_off: 0,
                    a: 1,
                    b: 0,
                },
                SimOp::Settle,
            ],
        ),
        (
            "local-errors",
            0x0a,
            vec![
                write(0, BAD_LOCAL, &[(0, 10)], tgt, 0),
                write(0, 0, &[(8000, 500)], tgt, 0),
                read(0, BAD_LOCAL, tgt, 0, 10, 0),
                read(0, 0, tgt, 0, 100, 4050),
                SimOp::Step(5),
            ],
        ),
        (
            "remote-errors",
            0x0a,
            vec![
                write(0, 0, &[(0, 100)], tgt, 4050),
                write(0, 0, &[(0, 100)], tgt, 0),
                SimOp::Settle,
                SimOp::NewLane,
                write(1, 0, &[(0, 100)], 2, 0),
                SimOp::Settle,
                SimOp::NewLane,
                read(2, 0, 3, 0, 10, 0),
                SimOp::Settle,
            ],
        ),
        (
            "unsignaled",
            0x0a,
            vec![
                write(0, UNSIGNALED, &[(0, 100)], tgt, 0),
                write(0, UNSIGNALED, &[(100, 100)], tgt, 100),
                write(0, 0, &[(200, 100)], tgt, 200),
                write(0, UNSIGNALED, &[(300, 100)], tgt, 300),
                SimOp::Settle,
            ],
        ),
        (
            "queue-full",
            0x0a,
            (0..34)
                .map(|i| write(0, UNSIGNALED, &[(i * 10, 10)], tgt, i * 10))
                .collect(),
        ),
        (
            "lossy",
            0x0b,
            vec![
                link(0, 0x80, 0, 2),
                link(1, 0x80, 0, 1),
                write(0, 0, &[(0, 2000), (2000, 2000)], tgt, 0),
                read(0, 0, tgt, 0, 4000, 0),
                recv(0, 0, 1000),
                send(0, 0, &[(0, 1000)]),
                SimOp::Settle,
            ],
        ),
        (
            "blackholed-path",
            0x0b,
            vec![
                link(0, 3, 1, 1),
                write(0, 0, &[(0, 2000), (2000, 2000)], tgt, 0),
                SimOp::Settle,
            ],
        ),
        (
            "blackout-then-heal",
            0x0a,
            vec![
                link(0, 0x80, 1, 1),
                write(0, 0, &[(0, 3000)], tgt, 0),
                SimOp::Step(10),
                link(0, 0x80, 6, 0),
                SimOp::Settle,
            ],
        ),
        (
            "duplicates-and-reordering",
            0x0b,
            vec![
                link(0, 0x80, 2, 2),
                link(0, 0x80, 3, 6),
                link(1, 0x80, 4, 2),
                write(0, 0, &[(0, 4000)], tgt, 0),
                recv(0, 0, 1024),
                send(0, 0, &[(0, 1024)]),
                atomic(0, 0, 0, 0, 1, 0),
                SimOp::Settle,
            ],
        ),
        (
            "corruption",
            0x0a,
            vec![
                link(0, 0x80, 5, 2),
                link(1, 0x80, 5, 2),
                write(0, 0, &[(0, 4000)], tgt, 0),
                SimOp::Settle,
            ],
        ),
        (
            "stray-datagrams",
            0x0a,
            vec![
                write(0, 0, &[(0, 1000)], tgt, 0),
                SimOp::Inject {
                    node: 1,
                    patch: 1,
                    bytes: pattern(3, 120),
                },
                SimOp::Inject {
                    node: 0,
                    patch: 1,
                    bytes: pattern(4, 88),
                },
                SimOp::Settle,
            ],
        ),
        (
            "lanes",
            0x0a,
            vec![
                SimOp::NewLane,
                SimOp::NewLane,
                write(0, 0, &[(0, 1000)], tgt, 0),
                write(1, 0, &[(1000, 1000)], tgt, 500),
                write(2, 0, &[(2000, 1000)], tgt, 2000),
                SimOp::Settle,
            ],
        ),
        (
            "set-error-mid-flight",
            0x0a,
            vec![
                write(0, 0, &[(0, 4000)], tgt, 0),
                SimOp::Step(2),
                SimOp::SetError(0),
                write(0, 0, &[(0, 10)], tgt, 0),
                SimOp::Settle,
                SimOp::NewLane,
                write(1, 0, &[(5, 4000)], tgt, 0),
                SimOp::Settle,
            ],
        ),
    ];
    s.push(("busy", 0x0a, busy_scenario()));
    s.into_iter()
        .map(|(name, config, ops)| (name.to_string(), sim_input(config, &ops)))
        .collect()
}

fn ack_input(config: u8, ops: &[AckOp]) -> Vec<u8> {
    let mut o = Out::default();
    o.u8(config);
    for op in ops {
        op.encode(&mut o);
    }
    o.0
}

fn ack_sack() -> Vec<Seed> {
    let post = |kind, len| AckOp::Post {
        kind,
        len,
        src_off: 7,
        unsignaled: false,
    };
    let ack = |flags, cum, mask| AckOp::Ack {
        flags,
        cum,
        sack: [0xaa; 32],
        mask,
        echo: 3,
        echo_raw: (1, 2),
        hold: 100,
        ce: 0,
    };
    let nak = |syndrome| AckOp::Nak {
        pkt: 0,
        syndrome,
        wrong_msn: false,
    };
    let tracker = |accept, rel| AckOp::Tracker { accept, rel };
    let s: Vec<(&str, u8, Vec<AckOp>)> = vec![
        (
            "write-acked",
            0x0a,
            vec![post(0, 5000), AckOp::Transmit(20), AckOp::AckAll],
        ),
        (
            "sack-holes-then-loss",
            0x05,
            vec![
                post(0, 3000),
                AckOp::Transmit(200),
                ack(0x16, 1, 0x5555_5555),
                AckOp::Advance(3),
                AckOp::Transmit(50),
                ack(0x12, 0, 0xffff_ffff),
                AckOp::Advance(4),
                AckOp::Transmit(50),
                AckOp::AckAll,
            ],
        ),
        (
            "sack-bitmap-raw",
            0x06,
            vec![
                post(1, 4000),
                AckOp::Transmit(100),
                ack(0x10, 2, 0),
                AckOp::AckAll,
            ],
        ),
        (
            "ack-beyond-sent",
            0x0a,
            vec![
                post(0, 100),
                AckOp::Transmit(5),
                ack(0x04, 50, 0),
                ack(0x08, 0x8000_0000, 0),
            ],
        ),
        (
            "duplicate-flag-and-ce",
            0x0a,
            vec![
                post(0, 2000),
                AckOp::Transmit(5),
                AckOp::Ack {
                    flags: 0x15,
                    cum: 1,
                    sack: [0; 32],
                    mask: 0,
                    echo: 0,
                    echo_raw: (0, 0),
                    hold: 3,
                    ce: 200,
                },
                AckOp::AckAll,
            ],
        ),
        (
            "rnr-nak-then-retry",
            0x0a,
            vec![
                post(1, 100),
                AckOp::Transmit(5),
                nak(0),
                AckOp::Advance(3),
                AckOp::Transmit(5),
                AckOp::AckAll,
            ],
        ),
        (
            "rnr-exhausted",
            0x0a,
            vec![
                post(1, 100),
                AckOp::Transmit(5),
                nak(0),
                AckOp::Advance(3),
                AckOp::Transmit(5),
                nak(0),
                AckOp::Advance(3),
                AckOp::Transmit(5),
                nak(0),
                AckOp::Advance(3),
                AckOp::Transmit(5),
                nak(0),
            ],
        ),
        (
            "access-nak",
            0x0a,
            vec![post(0, 100), post(0, 100), AckOp::Transmit(5), nak(1)],
        ),
        (
            "nak-wrong-msn",
            0x0a,
            vec![
                post(0, 100),
                AckOp::Transmit(5),
                AckOp::Nak {
                    pkt: 0,
                    syndrome: 2,
                    wrong_msn: true,
                },
                AckOp::AckAll,
            ],
        ),
        (
            "read-times-out",
            0x0a,
            vec![
                post(2, 64),
                AckOp::Transmit(5),
                AckOp::AckAll,
                AckOp::Advance(7),
            ],
        ),
        (
            "unsignaled-then-signaled",
            0x0a,
            vec![
                AckOp::Post {
                    kind: 0,
                    len: 10,
                    src_off: 0,
                    unsignaled: true,
                },
                post(1, 10),
                AckOp::Transmit(5),
                AckOp::AckAll,
            ],
        ),
        (
            "zero-length",
            0x0a,
            vec![post(0, 0), post(1, 0), AckOp::Transmit(5), AckOp::AckAll],
        ),
        (
            "tracker-in-order-and-holes",
            0x00,
            (0..40u16)
                .map(|i| tracker(true, (i * 7) % 50))
                .chain((0..10).map(|i| tracker(false, i * 100)))
                .collect(),
        ),
        (
            "tracker-across-wrap",
            0x10,
            (0..30u16)
                .map(|i| tracker(i % 3 != 0, 1100 - i * 37))
                .collect(),
        ),
        (
            "tracker-window-edges",
            0x20,
            vec![
                tracker(true, 1023),
                tracker(false, 1024),
                tracker(true, 1024),
                tracker(true, 0),
                tracker(false, 1024),
                tracker(true, 0x8001),
            ],
        ),
    ];
    s.into_iter()
        .map(|(name, config, ops)| (name.to_string(), ack_input(config, &ops)))
        .collect()
}
