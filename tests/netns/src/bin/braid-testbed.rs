//! `braid-testbed`: holds a [`Testbed4`] up for shell scripts (bench/scripts/compare-testbed.sh),
//! with the per-link degradations the Rust harness can apply and a shell cannot (the XDP
//! loss and CE marking: this kernel has no netem qdisc).
//!
//! ```text
//! braid-testbed [--rate L:MBIT]... [--loss L:FRACTION]... [--ce L:FRACTION]... [--udp-only]
//! ```
//!
//! Prints `KEY=VALUE` lines a shell can `eval` (namespace names, addresses, interfaces), then
//! `READY`, and keeps the testbed up until its standard input closes or reads a line `quit`.
//! A line `counters` prints per-link counters as one JSON object (packets routerL forwarded
//! per link, tbf drops, netem seen/dropped/marked); `rate L MBIT` (0: no limit) and
//! `netem L LOSS CE` (0 0: none) change a link and answer `OK` or `ERROR ...`. Loss and marking act on every IPv4 packet
//! (TCP too) unless `--udp-only`. Root only.
use std::io::{self, BufRead, Write};

use braid_netns::{NetemConfig, TESTBED_PATHS, Testbed4};

fn main() {
    if let Err(e) = run() {
        eprintln!("braid-testbed: {e}");
        std::process::exit(1);
    }
}

fn parse(arg: &str, what: &str) -> io::Result<(usize, f64)> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, format!("bad {what} {arg:?}"));
    let (l, v) = arg.split_once(':').ok_or_else(bad)?;
    let l: usize = l.parse().map_err(|_| bad())?;
    let v: f64 = v.parse().map_err(|_| bad())?;
    if l >= TESTBED_PATHS {
        return Err(bad());
    }
    Ok((l, v))
}

fn run() -> io::Result<()> {
    let mut rates = Vec::new();
    let mut netem = [NetemConfig::default(); TESTBED_PATHS];
    let mut udp_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{a} needs a value"))
            })
        };
        match a.as_str() {
            "--rate" => {
                let (l, v) = parse(&value()?, "--rate")?;
                rates.push((l, v as u32));
            }
            "--loss" => {
                let (l, v) = parse(&value()?, "--loss")?;
                netem[l].loss = v;
            }
            "--ce" => {
                let (l, v) = parse(&value()?, "--ce")?;
                netem[l].ce_mark = v;
            }
            "--udp-only" => udp_only = true,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("unknown argument {a:?} (see the doc comment of braid-testbed.rs)"),
                ));
            }
        }
    }
    let bed = Testbed4::new()?;
    for &(l, mbit) in &rates {
        bed.set_rate(l, mbit)?;
    }
    for (l, cfg) in netem.iter().enumerate() {
        if *cfg != NetemConfig::default() {
            if udp_only {
                bed.set_netem(l, *cfg)?;
            } else {
                bed.set_netem_ipv4(l, *cfg)?;
            }
        }
    }
    let mut out = io::stdout().lock();
    writeln!(out, "NSA={}", bed.host_a().name())?;
    writeln!(out, "NSB={}", bed.host_b().name())?;
    writeln!(out, "NSL={}", bed.router_l().name())?;
    writeln!(out, "NSR={}", bed.router_r().name())?;
    writeln!(out, "IPA={}", bed.ip_a())?;
    writeln!(out, "IPB={}", bed.ip_b())?;
    writeln!(out, "IFA={}", bed.end_a().ifname)?;
    writeln!(out, "IFB={}", bed.end_b().ifname)?;
    for l in 0..TESTBED_PATHS {
        writeln!(out, "LINK{l}_L={}", bed.left(l).ifname)?;
        writeln!(out, "LINK{l}_R={}", bed.right(l).ifname)?;
    }
    writeln!(out, "READY")?;
    out.flush()?;
    drop(out);
    for line in io::stdin().lock().lines() {
        match line?.trim() {
            "quit" => break,
            "counters" => {
                let fwd = bed.path_counters()?;
                let mut links = Vec::new();
                for (l, c) in fwd.iter().enumerate() {
                    let n = bed.netem_counters(l)?;
                    links.push(format!(
                        "{{\"link\":{l},\"forward_packets\":{},\"forward_bytes\":{},\"tbf_drops\":{},\
                         \"netem_seen\":{},\"netem_dropped\":{},\"netem_marked\":{}}}",
                        c.forward,
                        c.forward_bytes,
                        bed.rate_drops(l)?,
                        n.seen,
                        n.dropped,
                        n.marked
                    ));
                }
                let mut out = io::stdout().lock();
                writeln!(out, "{{\"links\":[{}]}}", links.join(","))?;
                out.flush()?;
            }
            cmd if cmd.starts_with("rate ") || cmd.starts_with("netem ") => {
                // `rate L MBIT` (0 removes the limit); `netem L LOSS CE` (0 0 removes it).
                let f: Vec<&str> = cmd.split_whitespace().collect();
                let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
                let reply = match (f[0], num(1), num(2), num(3)) {
                    ("rate", Some(l), Some(m), None) if (l as usize) < TESTBED_PATHS => {
                        if m == 0.0 {
                            bed.clear_rate(l as usize)
                        } else {
                            bed.set_rate(l as usize, m as u32)
                        }
                    }
                    ("netem", Some(l), Some(loss), Some(ce)) if (l as usize) < TESTBED_PATHS => {
                        let cfg = NetemConfig {
                            loss,
                            ce_mark: ce,
                            ..Default::default()
                        };
                        if cfg == NetemConfig::default() {
                            bed.clear_netem(l as usize)
                        } else if udp_only {
                            bed.set_netem(l as usize, cfg)
                        } else {
                            bed.set_netem_ipv4(l as usize, cfg)
                        }
                    }
                    _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "bad command")),
                };
                let mut out = io::stdout().lock();
                match reply {
                    Ok(()) => writeln!(out, "OK")?,
                    Err(e) => writeln!(out, "ERROR {e}")?,
                }
                out.flush()?;
            }
            "" => {}
            other => {
                eprintln!("braid-testbed: unknown command {other:?} (counters, rate, netem, quit)")
            }
        }
    }
    Ok(())
}
