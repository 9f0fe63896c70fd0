//! Network namespaces for Braid's tests: a veth pair between two namespaces, and a four-path
//! ECMP testbed with per-path rate limits, loss, ECN marking, black holes and counters.
//!
//! What it does not do: it never touches the root namespace's interfaces, routes or sysctls
//! (everything is created inside namespaces it made), it has no netem (this kernel has none:
//! loss and ECN marks come from [`netem`], an XDP program of its own), and it does
//! not make a test pass without root. Call [`require_root`] first; under CI (the `CI`
//! variable set) a missing privilege or a failed setup panics instead of skipping, so CI
//! fails rather than silently passing.
//!
//! Every object tears itself down in `Drop`, also while a failing test unwinds. Names are
//! unique per run (`braidns-<prefix>-<pid>-<counter>` for namespaces, a pid-and-counter tag of
//! at most 15 characters for interfaces), so concurrent runs never collide; namespaces left
//! behind by a killed run are deleted the next time a run starts (their pid is gone).
//!
//! ```text
//! VethPair:   [a] 10.X.Y.1/24 ──veth── 10.X.Y.2/24 [b]
//!
//! Testbed4:   [hostA] ── [routerL] ══ path 0..3 (4 veth links) ══ [routerR] ── [hostB]
//!              routerL ──tbf (set_rate)──▶ link k ──XDP netem (set_netem)──▶ routerR
//! ```
//!
//! Code that must run inside a namespace (opening a socket, a Braid device with its progress
//! thread, attaching XDP) runs in [`Netns::run`], on a thread that entered the namespace;
//! sockets and threads created there stay in it.
#![warn(missing_docs, unreachable_pub)]

use std::ffi::OsStr;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

use braid_datapath::bpf::{self, Program, XdpLink, XdpMode};

pub mod netem;
pub use netem::NetemConfig;
use netem::netem_counter;

/// Where `ip netns add` puts the namespace handles.
const NETNS_DIR: &str = "/var/run/netns";
/// Prefix of every namespace this crate creates.
const NAME_PREFIX: &str = "braidns-";
/// Paths of [`Testbed4`].
pub const TESTBED_PATHS: usize = 4;
/// The ECMP hash seed of [`Testbed4`]'s routers (`net.ipv4.fib_multipath_hash_seed`).
pub const HASH_SEED: u32 = 0x0b7a_1d5e;
/// `net.ipv4.fib_multipath_hash_fields`: source and destination address, protocol, source
/// and destination port (0x01 | 0x02 | 0x04 | 0x10 | 0x20).
pub const HASH_FIELDS: u32 = 0x37;

/// Whether this run is under CI (the `CI` environment variable is set).
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// Whether the process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The gate at the top of every namespace test: true when it can run. Without root it prints
/// a loud `SKIPPED <test>: needs root and network namespaces` and returns false, except under
/// CI, where it panics: CI runs as root and must fail rather than skip.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    assert!(
        !in_ci(),
        "{test}: needs root and network namespaces, and CI (CI is set) must run it"
    );
    eprintln!("SKIPPED {test}: needs root and network namespaces");
    false
}

/// Unwraps a namespace setup result: `Some` on success; on failure prints a loud `SKIPPED`
/// line and returns `None`, except under CI, where it panics with the error.
///
/// ```no_run
/// # fn t() {
/// let Some(bed) = braid_netns::setup("my_test", braid_netns::Testbed4::new()) else { return };
/// # }
/// ```
pub fn setup<T>(test: &str, result: io::Result<T>) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(e) if in_ci() => panic!("{test}: network namespace setup failed under CI: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: needs root and network namespaces (setup failed: {e})");
            None
        }
    }
}

/// A process-wide counter making names unique within one run.
fn next_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A short tag for interface names: `b` + pid in hex + a two-hex-digit counter (at most 9
/// characters, leaving 6 for a suffix within the 15-character limit). Suffixes start with a
/// letter past `f`, so tags of different runs never run into each other.
fn if_tag() -> String {
    format!("b{:x}{:02x}", std::process::id(), next_id() & 0xff)
}

/// A /24 subnet `10.X.Y.0` unique per run: X from the pid, Y from a counter. (The subnets
/// live in private namespaces, so even a clash would not matter; unique is just clearer in
/// packet traces.)
fn subnet() -> [u8; 2] {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    [(std::process::id() & 0xff) as u8, (n & 0xff) as u8]
}

fn addr(net: [u8; 2], host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, net[0], net[1], host)
}

/// A locally administered MAC for `host` on `net`.
fn mac(net: [u8; 2], host: u8) -> String {
    format!("02:b4:0a:{:02x}:{:02x}:{:02x}", net[0], net[1], host)
}

fn command_error(what: &str, out: &Output) -> io::Error {
    io::Error::other(format!(
        "`{what}` failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// Runs `ip` with `args`; fails with the command's stderr if it exits non-zero. A missing
/// `ip` binary comes back as `NotFound`.
fn ip(args: &[&str]) -> io::Result<Output> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run `ip` (iproute2): {e}")))?;
    if !out.status.success() {
        return Err(command_error(&format!("ip {}", args.join(" ")), &out));
    }
    Ok(out)
}

/// Deletes namespaces named by this crate whose process is gone (a run that was killed
/// before its `Drop`s ran). Runs once per process.
fn reap_stale() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
            return;
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
                continue;
            };
            // braidns-<prefix>-<pid>-<counter>, both numbers: anything else is not ours.
            let mut parts = rest.rsplit('-');
            let (Some(counter), Some(pid), Some(_prefix)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), counter.parse::<u32>()) else {
                continue;
            };
            if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = ip(&["netns", "del", &name]);
            }
        }
    });
}

/// Interface counters from `/proc/net/dev` of one namespace.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Received packets dropped by the interface.
    pub rx_dropped: u64,
    /// Bytes transmitted.
    pub tx_bytes: u64,
    /// Packets transmitted (for a veth: handed to its peer).
    pub tx_packets: u64,
    /// Transmitted packets dropped by the interface.
    pub tx_dropped: u64,
}

/// UDP counters of one namespace (the `Udp:` lines of `/proc/net/snmp`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct UdpCounters {
    /// Datagrams delivered to sockets.
    pub in_datagrams: u64,
    /// Datagrams to a port no socket listens on.
    pub no_ports: u64,
    /// Datagrams that could not be delivered (includes `rcvbuf_errors`).
    pub in_errors: u64,
    /// Datagrams sent.
    pub out_datagrams: u64,
    /// Datagrams dropped because the receiving socket's buffer was full.
    pub rcvbuf_errors: u64,
    /// Sends that failed for want of socket buffer space.
    pub sndbuf_errors: u64,
}

impl UdpCounters {
    /// `self - before`, field by field.
    pub fn since(&self, before: &UdpCounters) -> UdpCounters {
        UdpCounters {
            in_datagrams: self.in_datagrams.saturating_sub(before.in_datagrams),
            no_ports: self.no_ports.saturating_sub(before.no_ports),
            in_errors: self.in_errors.saturating_sub(before.in_errors),
            out_datagrams: self.out_datagrams.saturating_sub(before.out_datagrams),
            rcvbuf_errors: self.rcvbuf_errors.saturating_sub(before.rcvbuf_errors),
            sndbuf_errors: self.sndbuf_errors.saturating_sub(before.sndbuf_errors),
        }
    }
}

/// Parses the `Udp:` header and value lines of `/proc/net/snmp`.
fn parse_snmp_udp(text: &str) -> Option<UdpCounters> {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let names: Vec<&str> = lines.next()?.split_whitespace().skip(1).collect();
    let values: Vec<u64> = lines
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let get = |name: &str| {
        names
            .iter()
            .position(|n| *n == name)
            .and_then(|i| values.get(i).copied())
            .unwrap_or(0)
    };
    Some(UdpCounters {
        in_datagrams: get("InDatagrams"),
        no_ports: get("NoPorts"),
        in_errors: get("InErrors"),
        out_datagrams: get("OutDatagrams"),
        rcvbuf_errors: get("RcvbufErrors"),
        sndbuf_errors: get("SndbufErrors"),
    })
}

/// A network namespace (`ip netns add`), deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a namespace named `braidns-<prefix>-<pid>-<counter>` with `lo` up and IPv6 off
    /// (so no neighbour discovery or router solicitations show up in packet counters).
    pub fn new(prefix: &str) -> io::Result<Netns> {
        reap_stale();
        let name = format!("{NAME_PREFIX}{prefix}-{}-{}", std::process::id(), next_id());
        ip(&["netns", "add", &name])?;
        let ns = Netns { name };
        ns.ip_batch(&["link set lo up"])?;
        for key in [
            "net/ipv6/conf/all/disable_ipv6",
            "net/ipv6/conf/default/disable_ipv6",
        ] {
            match ns.sysctl(key, "1") {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {} // a kernel without IPv6
                r => r?,
            }
        }
        Ok(ns)
    }

    /// The namespace's name (as `ip netns` lists it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs a program inside the namespace (`ip netns exec NAME args...`) and returns its
    /// output, whatever its exit status.
    pub fn exec<I, S>(&self, args: I) -> io::Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .stdin(Stdio::null())
            .output()
    }

    /// Like [`exec`](Self::exec), but fails unless the program exits with status 0, and
    /// returns its stdout.
    pub fn exec_ok<I, S>(&self, args: I) -> io::Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<S> = args.into_iter().collect();
        let out = self.exec(&args)?;
        if !out.status.success() {
            let shown: Vec<_> = args
                .iter()
                .map(|a| a.as_ref().to_string_lossy().into_owned())
                .collect();
            return Err(command_error(&shown.join(" "), &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `ip -n NAME -batch -` with one `ip` command per line (without the leading `ip`),
    /// stopping at the first failure.
    pub fn ip_batch(&self, commands: &[&str]) -> io::Result<()> {
        let mut child = Command::new("ip")
            .args(["-n", &self.name, "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run `ip` (iproute2): {e}")))?;
        {
            let mut stdin = child.stdin.take().expect("stdin is piped");
            for c in commands {
                writeln!(stdin, "{c}")?;
            }
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(command_error(
                &format!("ip -n {} -batch: {}", self.name, commands.join("; ")),
                &out,
            ));
        }
        Ok(())
    }

    /// Runs `f` on a fresh thread that entered this namespace (`setns(CLONE_NEWNET)`), and
    /// returns its result; a panic in `f` propagates. Sockets opened and threads started by
    /// `f` belong to the namespace for their whole life, also after `run` returns, so a Braid
    /// device opened here keeps its progress thread and sockets in the namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("{NETNS_DIR}/{}", self.name);
        std::thread::scope(|s| {
            let worker = std::thread::Builder::new()
                .name(format!("netns {}", self.name))
                .spawn_scoped(s, move || {
                    enter(&path).unwrap_or_else(|e| panic!("entering namespace {path}: {e}"));
                    f()
                })
                .expect("spawn a namespace thread");
            match worker.join() {
                Ok(v) => v,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Writes sysctl `key` (a path under `/proc/sys`, e.g. `net/ipv4/ip_forward`) in this
    /// namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> io::Result<()> {
        let path = format!("/proc/sys/{key}");
        self.run(|| std::fs::write(&path, value))
            .map_err(|e| io::Error::new(e.kind(), format!("sysctl {path} = {value}: {e}")))
    }

    /// Reads sysctl `key` in this namespace.
    pub fn read_sysctl(&self, key: &str) -> io::Result<String> {
        let path = format!("/proc/sys/{key}");
        self.run(|| std::fs::read_to_string(&path))
            .map(|s| s.trim().to_string())
    }

    /// Counters of every interface in the namespace, by name (`/proc/net/dev` as this
    /// namespace sees it).
    pub fn link_stats(&self) -> io::Result<Vec<(String, LinkStats)>> {
        let text = self.run(|| std::fs::read_to_string("/proc/thread-self/net/dev"))?;
        Ok(parse_net_dev(&text))
    }

    /// The namespace's UDP counters (`/proc/net/snmp`): how many datagrams its sockets
    /// received, and how many the kernel dropped because a socket's receive buffer was full.
    pub fn udp_counters(&self) -> io::Result<UdpCounters> {
        let text = self.run(|| std::fs::read_to_string("/proc/thread-self/net/snmp"))?;
        parse_snmp_udp(&text).ok_or_else(|| io::Error::other("no Udp lines in /proc/net/snmp"))
    }

    /// Counters of interface `ifname`.
    pub fn link_stats_of(&self, ifname: &str) -> io::Result<LinkStats> {
        self.link_stats()?
            .into_iter()
            .find(|(n, _)| n == ifname)
            .map(|(_, s)| s)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no interface {ifname} in {}", self.name),
                )
            })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Interfaces in the namespace go with it; a socket still open in it (a device not yet
        // dropped) keeps the namespace alive, unnamed, until it closes.
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("braid-netns: could not delete namespace {}: {e}", self.name);
        }
    }
}

/// Moves the calling thread into the namespace at `path`.
fn enter(path: &str) -> io::Result<()> {
    let f = std::fs::File::open(path)?;
    // SAFETY: setns on a valid namespace descriptor; it changes only this thread's network
    // namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Parses `/proc/net/dev`.
fn parse_net_dev(text: &str) -> Vec<(String, LinkStats)> {
    text.lines()
        .skip(2)
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let v: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            if v.len() < 16 {
                return None;
            }
            Some((
                name.trim().to_string(),
                LinkStats {
                    rx_bytes: v[0],
                    rx_packets: v[1],
                    rx_dropped: v[3],
                    tx_bytes: v[8],
                    tx_packets: v[9],
                    tx_dropped: v[11],
                },
            ))
        })
        .collect()
}

/// One end of a link: namespace-local interface name, address and MAC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct End {
    /// Interface name (at most 15 characters).
    pub ifname: String,
    /// IPv4 address (on a /24).
    pub ip: Ipv4Addr,
    /// MAC address.
    pub mac: String,
}

/// `ip` commands creating a veth from the current namespace (`here`) to `peer_ns`.
fn veth_commands(here: &End, peer: &End, peer_ns: &Netns) -> String {
    format!(
        "link add {} address {} type veth peer name {} address {} netns {}",
        here.ifname,
        here.mac,
        peer.ifname,
        peer.mac,
        peer_ns.name()
    )
}

/// `ip` commands giving `me` its address, bringing it up and pinning the neighbour `peer`
/// (so AF_XDP senders, which do no ARP, reach it).
fn end_commands(me: &End, peer: &End) -> Vec<String> {
    vec![
        format!("addr add {}/24 dev {}", me.ip, me.ifname),
        format!("link set {} up", me.ifname),
        format!(
            "neigh replace {} lladdr {} dev {} nud permanent",
            peer.ip, peer.mac, me.ifname
        ),
    ]
}

fn batch(ns: &Netns, commands: &[String]) -> io::Result<()> {
    let refs: Vec<&str> = commands.iter().map(String::as_str).collect();
    ns.ip_batch(&refs)
}

/// Two namespaces `a` and `b` joined by one veth: `10.X.Y.1/24` in `a`, `10.X.Y.2/24` in
/// `b`, both up, with permanent neighbour entries both ways.
#[derive(Debug)]
pub struct VethPair {
    end_a: End,
    end_b: End,
    // Dropped last: deleting a namespace removes its end of the veth, and with it the pair.
    a: Netns,
    b: Netns,
}

impl VethPair {
    /// Creates the namespaces and the link.
    pub fn new() -> io::Result<VethPair> {
        let (a, b) = (Netns::new("va")?, Netns::new("vb")?);
        let (tag, net) = (if_tag(), subnet());
        let end_a = End {
            ifname: format!("{tag}va"),
            ip: addr(net, 1),
            mac: mac(net, 1),
        };
        let end_b = End {
            ifname: format!("{tag}vb"),
            ip: addr(net, 2),
            mac: mac(net, 2),
        };
        let mut on_a = vec![veth_commands(&end_a, &end_b, &b)];
        on_a.extend(end_commands(&end_a, &end_b));
        batch(&a, &on_a)?;
        batch(&b, &end_commands(&end_b, &end_a))?;
        Ok(VethPair { end_a, end_b, a, b })
    }

    /// The first namespace.
    pub fn a(&self) -> &Netns {
        &self.a
    }
    /// The second namespace.
    pub fn b(&self) -> &Netns {
        &self.b
    }
    /// The veth end in `a`.
    pub fn end_a(&self) -> &End {
        &self.end_a
    }
    /// The veth end in `b`.
    pub fn end_b(&self) -> &End {
        &self.end_b
    }
    /// Interface name in `a`.
    pub fn if_a(&self) -> &str {
        &self.end_a.ifname
    }
    /// Interface name in `b`.
    pub fn if_b(&self) -> &str {
        &self.end_b.ifname
    }
    /// Address in `a` (`10.X.Y.1`).
    pub fn ip_a(&self) -> Ipv4Addr {
        self.end_a.ip
    }
    /// Address in `b` (`10.X.Y.2`).
    pub fn ip_b(&self) -> Ipv4Addr {
        self.end_b.ip
    }
}

/// What a path's netem program has counted (IPv4/UDP packets only), summed over every
/// program attached to that path during the testbed's life.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct NetemCounters {
    /// IPv4/UDP packets seen.
    pub seen: u64,
    /// Packets dropped (loss or black hole).
    pub dropped: u64,
    /// Packets marked CE.
    pub marked: u64,
}

impl NetemCounters {
    /// `dropped / seen` (0 when nothing was seen).
    pub fn drop_fraction(&self) -> f64 {
        if self.seen == 0 {
            0.0
        } else {
            self.dropped as f64 / self.seen as f64
        }
    }

    fn add(&mut self, o: NetemCounters) {
        self.seen += o.seen;
        self.dropped += o.dropped;
        self.marked += o.marked;
    }
}

/// Packets each way on one testbed path, counted where they enter the link: `forward` by
/// routerL's transmit counter (hostA → hostB; packets later dropped by the path's netem
/// count, packets dropped by its tbf do not), `reverse` by routerR's (hostB → hostA).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PathCounters {
    /// Packets routerL sent onto the link (towards hostB).
    pub forward: u64,
    /// Bytes routerL sent onto the link.
    pub forward_bytes: u64,
    /// Packets routerR sent onto the link (towards hostA).
    pub reverse: u64,
}

struct Attached {
    cfg: NetemConfig,
    /// The program's run-time black hole switch is on.
    switched: bool,
    prog: Program,
    _link: XdpLink,
    mode: XdpMode,
}

impl Attached {
    fn counters(&self) -> NetemCounters {
        let m = &self.prog.maps()[0];
        let read = |i| m.counter(i).unwrap_or(0);
        NetemCounters {
            seen: read(netem_counter::SEEN),
            dropped: read(netem_counter::DROPPED),
            marked: read(netem_counter::MARKED),
        }
    }
}

#[derive(Default)]
struct PathNetem {
    attached: Option<Attached>,
    /// Counts of programs already detached from this path.
    carried: NetemCounters,
}

/// The four-path multipath testbed of LAB.md:
///
/// ```text
/// hostA ──── routerL ══ path 0 ══ routerR ──── hostB
///  .1 net_a .2   .1 ══ path 1 ══ .2   .1 net_b .2
///                   ══ path 2 ══
///                   ══ path 3 ══
/// ```
///
/// Both routers forward (rp_filter off) with 4-way equal-cost multipath routes to the far
/// host's subnet, hashing addresses, protocol and ports
/// (`fib_multipath_hash_policy=3`, `fib_multipath_hash_fields=0x37`) with a fixed seed
/// ([`HASH_SEED`]), so a given 5-tuple always takes the same path. Every neighbour entry is
/// static. Per path: a tbf rate limit on routerL's side ([`set_rate`](Self::set_rate)), an
/// XDP fault injector on routerR's side ([`set_netem`](Self::set_netem),
/// [`blackhole`](Self::blackhole)): both act on hostA → hostB traffic only, so a WRITE's
/// data suffers and its ACKs do not. All knobs take `&self` and may be turned from another
/// thread while traffic flows.
pub struct Testbed4 {
    host_a_end: End,
    host_b_end: End,
    /// routerL's end of hostA's link.
    left_a: End,
    /// routerR's end of hostB's link.
    right_b: End,
    left: [End; TESTBED_PATHS],
    right: [End; TESTBED_PATHS],
    netem: Mutex<[PathNetem; TESTBED_PATHS]>,
    // Namespaces last, after the XDP links above are detached.
    host_a: Netns,
    router_l: Netns,
    router_r: Netns,
    host_b: Netns,
}

impl std::fmt::Debug for Testbed4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Testbed4")
            .field("host_a", &self.host_a.name)
            .field("host_b", &self.host_b.name)
            .field("ip_a", &self.host_a_end.ip)
            .field("ip_b", &self.host_b_end.ip)
            .finish()
    }
}

impl Testbed4 {
    /// Builds the testbed (about 0.1 s).
    pub fn new() -> io::Result<Testbed4> {
        let host_a = Netns::new("ha")?;
        let router_l = Netns::new("rl")?;
        let router_r = Netns::new("rr")?;
        let host_b = Netns::new("hb")?;
        let tag = if_tag();
        let end = |suffix: &str, net: [u8; 2], host: u8| End {
            ifname: format!("{tag}{suffix}"),
            ip: addr(net, host),
            mac: mac(net, host),
        };
        let (net_a, net_b) = (subnet(), subnet());
        let nets: [[u8; 2]; TESTBED_PATHS] = std::array::from_fn(|_| subnet());
        let host_a_end = end("ha", net_a, 1);
        let left_a = end("la", net_a, 2);
        let right_b = end("rb", net_b, 1);
        let host_b_end = end("hb", net_b, 2);
        let left: [End; TESTBED_PATHS] = std::array::from_fn(|k| end(&format!("l{k}"), nets[k], 1));
        let right: [End; TESTBED_PATHS] =
            std::array::from_fn(|k| end(&format!("r{k}"), nets[k], 2));

        for router in [&router_l, &router_r] {
            for (key, value) in [
                ("net/ipv4/ip_forward", "1".to_string()),
                ("net/ipv4/conf/all/rp_filter", "0".to_string()),
                ("net/ipv4/conf/default/rp_filter", "0".to_string()),
                ("net/ipv4/fib_multipath_hash_policy", "3".to_string()),
                (
                    "net/ipv4/fib_multipath_hash_fields",
                    HASH_FIELDS.to_string(),
                ),
            ] {
                router.sysctl(key, &value)?;
            }
            // Since Linux 6.11; older kernels hash with a per-boot random seed, which is
            // still fixed for the life of a testbed.
            match router.sysctl("net/ipv4/fib_multipath_hash_seed", &HASH_SEED.to_string()) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                r => r?,
            }
        }

        // hostA and its link to routerL. `gso_max_segs 1` makes the kernel cut a UDP GSO
        // run into its datagrams at the hosts' own devices, as a NIC without segmentation
        // offload does, so the routers forward (and count, and shape) separate datagrams
        // as on a wire instead of passing the run through the veths whole.
        let mut cmds = vec![veth_commands(&host_a_end, &left_a, &router_l)];
        cmds.extend(end_commands(&host_a_end, &left_a));
        cmds.push(format!("link set {} gso_max_segs 1", host_a_end.ifname));
        batch(&host_a, &cmds)?;
        // routerL: its side of hostA's link, and the four path links to routerR.
        let mut cmds = end_commands(&left_a, &host_a_end);
        for k in 0..TESTBED_PATHS {
            cmds.push(veth_commands(&left[k], &right[k], &router_r));
            cmds.extend(end_commands(&left[k], &right[k]));
        }
        batch(&router_l, &cmds)?;
        // routerR: its side of the path links, and the link to hostB.
        let mut cmds = vec![veth_commands(&right_b, &host_b_end, &host_b)];
        cmds.extend(end_commands(&right_b, &host_b_end));
        for k in 0..TESTBED_PATHS {
            cmds.extend(end_commands(&right[k], &left[k]));
        }
        batch(&router_r, &cmds)?;
        let mut cmds = end_commands(&host_b_end, &right_b);
        cmds.push(format!("link set {} gso_max_segs 1", host_b_end.ifname));
        batch(&host_b, &cmds)?;

        // Per-interface rp_filter too (the effective value is the larger of all and the
        // interface's).
        for (ns, ends) in [
            (&router_l, left.iter().chain([&left_a]).collect::<Vec<_>>()),
            (
                &router_r,
                right.iter().chain([&right_b]).collect::<Vec<_>>(),
            ),
        ] {
            for e in ends {
                ns.sysctl(&format!("net/ipv4/conf/{}/rp_filter", e.ifname), "0")?;
            }
        }

        // Routes, once every link is up.
        let multipath = |gw: &[End; TESTBED_PATHS], dev: &[End; TESTBED_PATHS]| {
            (0..TESTBED_PATHS)
                .map(|k| format!("nexthop via {} dev {} weight 1", gw[k].ip, dev[k].ifname))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let net = |e: &End| {
            let o = e.ip.octets();
            format!("{}.{}.{}.0/24", o[0], o[1], o[2])
        };
        batch(
            &host_a,
            &[format!(
                "route add default via {} dev {}",
                left_a.ip, host_a_end.ifname
            )],
        )?;
        batch(
            &host_b,
            &[format!(
                "route add default via {} dev {}",
                right_b.ip, host_b_end.ifname
            )],
        )?;
        batch(
            &router_l,
            &[format!(
                "route add {} {}",
                net(&host_b_end),
                multipath(&right, &left)
            )],
        )?;
        batch(
            &router_r,
            &[format!(
                "route add {} {}",
                net(&host_a_end),
                multipath(&left, &right)
            )],
        )?;

        Ok(Testbed4 {
            host_a_end,
            host_b_end,
            left_a,
            right_b,
            left,
            right,
            netem: Mutex::new(Default::default()),
            host_a,
            router_l,
            router_r,
            host_b,
        })
    }

    /// hostA's namespace.
    pub fn host_a(&self) -> &Netns {
        &self.host_a
    }
    /// hostB's namespace.
    pub fn host_b(&self) -> &Netns {
        &self.host_b
    }
    /// routerL's namespace (hostA's side).
    pub fn router_l(&self) -> &Netns {
        &self.router_l
    }
    /// routerR's namespace (hostB's side).
    pub fn router_r(&self) -> &Netns {
        &self.router_r
    }
    /// hostA's interface and address.
    pub fn end_a(&self) -> &End {
        &self.host_a_end
    }
    /// hostB's interface and address.
    pub fn end_b(&self) -> &End {
        &self.host_b_end
    }
    /// hostA's address.
    pub fn ip_a(&self) -> Ipv4Addr {
        self.host_a_end.ip
    }
    /// hostB's address.
    pub fn ip_b(&self) -> Ipv4Addr {
        self.host_b_end.ip
    }
    /// routerL's end of path `path` (where [`set_rate`](Self::set_rate) shapes).
    pub fn left(&self, path: usize) -> &End {
        &self.left[path]
    }
    /// routerR's end of path `path` (where [`set_netem`](Self::set_netem) drops and marks).
    pub fn right(&self, path: usize) -> &End {
        &self.right[path]
    }

    fn check(path: usize) -> io::Result<()> {
        if path < TESTBED_PATHS {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("path {path} out of 0..{TESTBED_PATHS}"),
            ))
        }
    }

    /// Limits path `path` towards hostB to `mbit` Mbit/s with a tbf on routerL's egress
    /// (replacing an earlier limit). Its queue holds about 10 ms at that rate; beyond that it
    /// drops.
    pub fn set_rate(&self, path: usize, mbit: u32) -> io::Result<()> {
        Testbed4::check(path)?;
        let bytes_per_ms = u64::from(mbit) * 1_000_000 / 8 / 1000;
        let burst = bytes_per_ms.max(4 * 1514);
        let limit = (10 * bytes_per_ms).max(burst + 4 * 1514);
        let cmd = format!(
            "qdisc replace dev {} root tbf rate {mbit}mbit burst {burst} limit {limit}",
            self.left[path].ifname
        );
        Command::new("tc")
            .args(["-n", self.router_l.name()])
            .args(cmd.split_whitespace())
            .stdin(Stdio::null())
            .output()
            .and_then(|out| {
                if out.status.success() {
                    Ok(())
                } else {
                    Err(command_error(&format!("tc {cmd}"), &out))
                }
            })
    }

    /// Removes path `path`'s rate limit.
    pub fn clear_rate(&self, path: usize) -> io::Result<()> {
        Testbed4::check(path)?;
        let out = Command::new("tc")
            .args(["-n", self.router_l.name(), "qdisc", "del", "dev"])
            .arg(&self.left[path].ifname)
            .arg("root")
            .stdin(Stdio::null())
            .output()?;
        // "No such file or directory" / "Cannot delete qdisc with handle of zero": no limit set.
        if !out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("qdisc") {
            return Err(command_error("tc qdisc del", &out));
        }
        Ok(())
    }

    /// Packets path `path`'s tbf dropped (0 without a rate limit).
    pub fn rate_drops(&self, path: usize) -> io::Result<u64> {
        Testbed4::check(path)?;
        let out = Command::new("tc")
            .args(["-n", self.router_l.name(), "-s", "qdisc", "show", "dev"])
            .arg(&self.left[path].ifname)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(command_error("tc -s qdisc show", &out));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        // "qdisc tbf 8001: root ... \n Sent 123 bytes 4 pkt (dropped 5, overlimits ...)"
        Ok(text
            .lines()
            .skip_while(|l| !l.starts_with("qdisc tbf"))
            .find_map(|l| {
                let rest = l.split("(dropped ").nth(1)?;
                rest.split(',').next()?.trim().parse().ok()
            })
            .unwrap_or(0))
    }

    fn netem_lock(&self) -> MutexGuard<'_, [PathNetem; TESTBED_PATHS]> {
        self.netem.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attaches a [`netem::netem`] fault injector for hostA → hostB traffic on path `path`
    /// (XDP on routerR's ingress; native mode if the kernel takes it, else generic),
    /// replacing an earlier one. Counters carry over (see
    /// [`netem_counters`](Self::netem_counters)).
    pub fn set_netem(&self, path: usize, cfg: NetemConfig) -> io::Result<()> {
        Testbed4::check(path)?;
        self.attach_netem(path, cfg, netem::netem(cfg)?)
    }

    /// Like [`set_netem`](Self::set_netem), but the program acts on every IPv4 packet (TCP
    /// too, [`netem::netem_ipv4`]), for kernel TCP and MPTCP baselines.
    pub fn set_netem_ipv4(&self, path: usize, cfg: NetemConfig) -> io::Result<()> {
        Testbed4::check(path)?;
        self.attach_netem(path, cfg, netem::netem_ipv4(cfg)?)
    }

    fn attach_netem(&self, path: usize, cfg: NetemConfig, prog: bpf::Program) -> io::Result<()> {
        let mut all = self.netem_lock();
        let slot = &mut all[path];
        if let Some(old) = slot.attached.take() {
            slot.carried.add(old.counters());
            // Dropping `old` closes its link: the program detaches before the new one goes on.
        }
        let ifname = self.right[path].ifname.clone();
        let (link, mode) = self.router_r.run(|| -> io::Result<(XdpLink, XdpMode)> {
            let index = bpf::ifindex(&ifname)?;
            let mut last = None;
            // A link just closed may take a moment to let go of the interface.
            for attempt in 0..20 {
                for mode in [XdpMode::Native, XdpMode::Generic] {
                    match bpf::attach_xdp(&prog, index, mode) {
                        Ok(link) => return Ok((link, mode)),
                        Err(e) => last = Some(e),
                    }
                }
                std::thread::sleep(Duration::from_millis(5 * (attempt + 1)));
            }
            Err(last.expect("tried at least once"))
        })?;
        slot.attached = Some(Attached {
            cfg,
            switched: false,
            prog,
            _link: link,
            mode,
        });
        Ok(())
    }

    /// Removes path `path`'s fault injector (its counts carry over).
    pub fn clear_netem(&self, path: usize) -> io::Result<()> {
        Testbed4::check(path)?;
        let mut all = self.netem_lock();
        let slot = &mut all[path];
        if let Some(old) = slot.attached.take() {
            slot.carried.add(old.counters());
        }
        Ok(())
    }

    /// Black-holes path `path` towards hostB (every IPv4/UDP packet dropped), or ends the
    /// black hole, keeping the path's other netem settings.
    pub fn blackhole(&self, path: usize, on: bool) -> io::Result<()> {
        Testbed4::check(path)?;
        let cfg = {
            let mut all = self.netem_lock();
            match all[path].attached.as_mut() {
                // The attached program's run-time switch acts at the next packet; swapping
                // programs would take a detach and an attach (tens of ms on a busy machine).
                Some(a) if !a.cfg.blackhole => {
                    netem::set_netem_blackhole(&a.prog, on)?;
                    a.switched = on;
                    return Ok(());
                }
                Some(a) => a.cfg,
                None => NetemConfig::default(),
            }
        };
        self.set_netem(
            path,
            NetemConfig {
                blackhole: on,
                ..cfg
            },
        )
    }

    /// The netem configuration on path `path` and the XDP mode it is attached in, if any.
    pub fn netem_of(&self, path: usize) -> Option<(NetemConfig, XdpMode)> {
        self.netem_lock().get(path)?.attached.as_ref().map(|a| {
            let blackhole = a.cfg.blackhole || a.switched;
            (NetemConfig { blackhole, ..a.cfg }, a.mode)
        })
    }

    /// What path `path`'s fault injectors counted so far, summed over every program attached
    /// there (zero if none ever was).
    pub fn netem_counters(&self, path: usize) -> io::Result<NetemCounters> {
        Testbed4::check(path)?;
        let all = self.netem_lock();
        let slot = &all[path];
        let mut c = slot.carried;
        if let Some(a) = &slot.attached {
            c.add(a.counters());
        }
        Ok(c)
    }

    /// Packets each way on every path so far (see [`PathCounters`]). Take it before and after
    /// a transfer and subtract with [`path_delta`] to see which path carried what.
    pub fn path_counters(&self) -> io::Result<[PathCounters; TESTBED_PATHS]> {
        let l = self.router_l.link_stats()?;
        let r = self.router_r.link_stats()?;
        let find = |stats: &[(String, LinkStats)], name: &str| {
            stats
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, s)| *s)
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no {name}")))
        };
        let mut out = [PathCounters::default(); TESTBED_PATHS];
        for (k, o) in out.iter_mut().enumerate() {
            let (ls, rs) = (
                find(&l, &self.left[k].ifname)?,
                find(&r, &self.right[k].ifname)?,
            );
            *o = PathCounters {
                forward: ls.tx_packets,
                forward_bytes: ls.tx_bytes,
                reverse: rs.tx_packets,
            };
        }
        Ok(out)
    }

    /// The path routerL chooses for a UDP flow from hostA port `sport` to hostB port `dport`
    /// (asks the kernel with `ip route get ... ipproto udp sport .. dport ..`).
    pub fn forward_path_of_udp(&self, sport: u16, dport: u16) -> io::Result<usize> {
        self.path_of_udp(&self.router_l, &self.left, &self.left_a, true, sport, dport)
    }

    /// The path routerR chooses for a UDP flow from hostB port `sport` to hostA port `dport`.
    pub fn reverse_path_of_udp(&self, sport: u16, dport: u16) -> io::Result<usize> {
        self.path_of_udp(
            &self.router_r,
            &self.right,
            &self.right_b,
            false,
            sport,
            dport,
        )
    }

    fn path_of_udp(
        &self,
        router: &Netns,
        links: &[End; TESTBED_PATHS],
        iif: &End,
        forward: bool,
        sport: u16,
        dport: u16,
    ) -> io::Result<usize> {
        let (src, dst) = if forward {
            (self.ip_a(), self.ip_b())
        } else {
            (self.ip_b(), self.ip_a())
        };
        let out = ip(&[
            "-n",
            router.name(),
            "route",
            "get",
            &dst.to_string(),
            "from",
            &src.to_string(),
            "iif",
            &iif.ifname,
            "ipproto",
            "udp",
            "sport",
            &sport.to_string(),
            "dport",
            &dport.to_string(),
        ])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let dev = text
            .split_whitespace()
            .skip_while(|w| *w != "dev")
            .nth(1)
            .unwrap_or_default()
            .to_string();
        links
            .iter()
            .position(|e| e.ifname == dev)
            .ok_or_else(|| io::Error::other(format!("route get answered {text:?}")))
    }
}

impl Drop for Testbed4 {
    fn drop(&mut self) {
        // Detach the XDP programs before the namespaces (and their interfaces) go.
        for slot in self.netem_lock().iter_mut() {
            slot.attached = None;
        }
    }
}

/// `after - before`, per path and direction.
pub fn path_delta(
    before: &[PathCounters; TESTBED_PATHS],
    after: &[PathCounters; TESTBED_PATHS],
) -> [PathCounters; TESTBED_PATHS] {
    std::array::from_fn(|k| PathCounters {
        forward: after[k].forward.saturating_sub(before[k].forward),
        forward_bytes: after[k]
            .forward_bytes
            .saturating_sub(before[k].forward_bytes),
        reverse: after[k].reverse.saturating_sub(before[k].reverse),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_interface_limit() {
        let tag = if_tag();
        for suffix in ["ha", "la", "l3", "r3", "rb", "hb", "va", "vb"] {
            let name = format!("{tag}{suffix}");
            assert!(name.len() <= 15, "{name} is longer than 15 characters");
        }
        assert!(format!("b{:x}{:02x}", 4_194_303u32, 0xff).len() <= 9);
    }

    fn exists(ns: &str) -> bool {
        std::path::Path::new(&format!("{NETNS_DIR}/{ns}")).exists()
    }

    #[test]
    fn run_enters_the_namespace_and_drop_deletes_it_even_on_panic() {
        if !require_root("run_enters_the_namespace_and_drop_deletes_it_even_on_panic") {
            return;
        }
        let ns = setup("run_enters_...", Netns::new("t")).expect("setup");
        let name = ns.name().to_string();
        assert!(exists(&name));
        let links: Vec<String> = ns
            .link_stats()
            .expect("stats")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            links,
            vec!["lo".to_string()],
            "a fresh namespace has only lo"
        );
        // A socket opened inside is in the namespace: 127.0.0.1 there is not ours.
        let port = ns.run(|| {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
            s.local_addr().expect("addr").port()
        });
        assert!(port > 0);
        drop(ns);
        assert!(!exists(&name), "namespace {name} left behind");

        let mut leaked = String::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let ns = Netns::new("t").expect("netns");
            leaked = ns.name().to_string();
            ns.run(|| panic!("deliberate"));
        }));
        assert!(r.is_err(), "the panic inside run propagates");
        assert!(
            !leaked.is_empty() && !exists(&leaked),
            "namespace {leaked} left behind after a panic"
        );
    }

    #[test]
    fn a_panicking_test_leaves_no_testbed_behind() {
        if !require_root("a_panicking_test_leaves_no_testbed_behind") {
            return;
        }
        let mut names = Vec::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let bed = Testbed4::new().expect("testbed");
            names.extend(
                [bed.host_a(), bed.router_l(), bed.router_r(), bed.host_b()]
                    .map(|ns| ns.name().to_string()),
            );
            bed.set_netem(
                1,
                NetemConfig {
                    loss: 0.5,
                    ..Default::default()
                },
            )
            .expect("netem");
            bed.set_rate(2, 100).expect("tbf");
            let v = VethPair::new().expect("veth");
            names.extend([v.a().name().to_string(), v.b().name().to_string()]);
            panic!("deliberate");
        }));
        assert!(r.is_err());
        assert_eq!(names.len(), 6);
        for n in &names {
            assert!(!exists(n), "namespace {n} left behind after a panic");
        }
    }

    #[test]
    fn veth_pair_carries_udp_between_its_namespaces() {
        if !require_root("veth_pair_carries_udp_between_its_namespaces") {
            return;
        }
        let v = setup("veth_pair_carries_udp", VethPair::new()).expect("setup");
        assert!(v.if_a().len() <= 15 && v.if_b().len() <= 15);
        assert_eq!(v.ip_a().octets()[3], 1);
        assert_eq!(v.ip_b().octets()[3], 2);
        let (ip_a, ip_b) = (v.ip_a(), v.ip_b());
        let rx = v
            .b()
            .run(|| std::net::UdpSocket::bind((ip_b, 0)).expect("bind in b"));
        rx.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let dest = rx.local_addr().expect("addr");
        v.a().run(|| {
            let tx = std::net::UdpSocket::bind((ip_a, 0)).expect("bind in a");
            tx.send_to(b"over the veth", dest).expect("send");
        });
        let mut buf = [0u8; 64];
        let (n, from) = rx.recv_from(&mut buf).expect("delivered");
        assert_eq!(&buf[..n], b"over the veth");
        assert_eq!(from.ip(), ip_a);
    }

    /// Sends `count` datagrams from hostA port `sport` to hostB port `dport`.
    fn blast(bed: &Testbed4, sport: u16, dport: u16, count: usize, size: usize) {
        let (a, b) = (bed.ip_a(), bed.ip_b());
        bed.host_a().run(|| {
            let s = std::net::UdpSocket::bind((a, sport)).expect("bind in hostA");
            let payload = vec![0x5a; size];
            for i in 0..count {
                // A full socket buffer is not a test failure: pace a little and go on.
                if s.send_to(&payload, (b, dport)).is_err() || i % 64 == 63 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        });
    }

    #[test]
    fn testbed_routes_each_udp_flow_on_the_path_route_get_predicts() {
        if !require_root("testbed_routes_each_udp_flow_on_the_path_route_get_predicts") {
            return;
        }
        let bed = setup("testbed_routes", Testbed4::new()).expect("setup");
        let dport = 4791;
        let ip_b = bed.ip_b();
        let sink = bed
            .host_b()
            .run(|| std::net::UdpSocket::bind((ip_b, dport)).expect("sink"));
        let mut predicted = [0u64; TESTBED_PATHS];
        let before = bed.path_counters().expect("counters");
        for i in 0..16u16 {
            let sport = 40_000 + 7 * i;
            let path = bed.forward_path_of_udp(sport, dport).expect("route get");
            assert_eq!(
                path,
                bed.forward_path_of_udp(sport, dport).expect("route get")
            );
            predicted[path] += 10 + u64::from(i);
            blast(&bed, sport, dport, 10 + usize::from(i), 100);
        }
        let d = path_delta(&before, &bed.path_counters().expect("counters"));
        let got: Vec<u64> = d.iter().map(|c| c.forward).collect();
        assert_eq!(got, predicted, "packets per path, hostA to hostB");
        assert!(
            predicted.iter().filter(|&&n| n > 0).count() >= 2,
            "16 flows used one path"
        );
        drop(sink);
    }

    #[test]
    fn testbed_netem_drops_its_fraction_and_a_black_hole_everything() {
        if !require_root("testbed_netem_drops_its_fraction_and_a_black_hole_everything") {
            return;
        }
        let bed = setup("testbed_netem", Testbed4::new()).expect("setup");
        let (sport, dport) = (41_000, 4791);
        let path = bed.forward_path_of_udp(sport, dport).expect("route get");
        let ip_b = bed.ip_b();
        let sink = bed
            .host_b()
            .run(|| std::net::UdpSocket::bind((ip_b, dport)).expect("sink"));
        sink.set_nonblocking(true).expect("nonblocking");
        let drain = || {
            std::thread::sleep(Duration::from_millis(50));
            let mut buf = [0u8; 2048];
            std::iter::from_fn(|| sink.recv(&mut buf).ok()).count() as u64
        };

        bed.set_netem(
            path,
            NetemConfig {
                loss: 0.1,
                ..Default::default()
            },
        )
        .expect("netem");
        // In rounds, so the sink's receive buffer never overflows.
        let delivered: u64 = (0..20)
            .map(|_| {
                blast(&bed, sport, dport, 200, 64);
                drain()
            })
            .sum();
        let c = bed.netem_counters(path).expect("counters");
        assert_eq!(c.seen, 4000);
        assert_eq!(c.dropped + delivered, 4000);
        assert!(
            (0.07..0.13).contains(&c.drop_fraction()),
            "10% loss dropped {c:?}"
        );

        bed.blackhole(path, true).expect("black hole");
        assert_eq!(
            bed.netem_of(path).map(|(cfg, _)| (cfg.loss, cfg.blackhole)),
            Some((0.1, true))
        );
        blast(&bed, sport, dport, 100, 64);
        assert_eq!(drain(), 0, "a black hole let packets through");
        let c2 = bed.netem_counters(path).expect("counters");
        assert_eq!((c2.seen - c.seen, c2.dropped - c.dropped), (100, 100));

        bed.clear_netem(path).expect("clear");
        blast(&bed, sport, dport, 100, 64);
        assert_eq!(drain(), 100, "clearing the netem restores the path");
        assert_eq!(
            bed.netem_counters(path).expect("counters"),
            c2,
            "counts carry over"
        );
    }

    #[test]
    fn testbed_rate_limit_shapes_and_drops_its_path() {
        if !require_root("testbed_rate_limit_shapes_and_drops_its_path") {
            return;
        }
        let bed = setup("testbed_rate", Testbed4::new()).expect("setup");
        let (sport, dport) = (42_000, 4791);
        let path = bed.forward_path_of_udp(sport, dport).expect("route get");
        bed.set_rate(path, 10).expect("tbf");
        bed.set_rate(path, 5).expect("tbf replaced");
        // 3000 × 1400 bytes in well under a second is far above 5 Mbit/s.
        blast(&bed, sport, dport, 3000, 1400);
        let drops = bed.rate_drops(path).expect("tc stats");
        assert!(drops > 500, "tbf at 5 Mbit/s dropped only {drops} of 3000");
        bed.clear_rate(path).expect("clear");
        bed.clear_rate(path).expect("clearing twice is fine");
        assert_eq!(bed.rate_drops(path).expect("tc stats"), 0);
    }

    #[test]
    fn snmp_udp_parses() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n\
                    Udp: 10 1 7 20 6 2 0 0 0\n\
                    UdpLite: InDatagrams NoPorts\nUdpLite: 0 0\n";
        assert_eq!(
            parse_snmp_udp(text),
            Some(UdpCounters {
                in_datagrams: 10,
                no_ports: 1,
                in_errors: 7,
                out_datagrams: 20,
                rcvbuf_errors: 6,
                sndbuf_errors: 2
            })
        );
    }

    #[test]
    fn net_dev_parses() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
             lo:     100       2    0    0    0     0          0         0      300       4    0    5    0     0       0          0\n";
        let got = parse_net_dev(text);
        assert_eq!(
            got,
            vec![(
                "lo".to_string(),
                LinkStats {
                    rx_bytes: 100,
                    rx_packets: 2,
                    rx_dropped: 0,
                    tx_bytes: 300,
                    tx_packets: 4,
                    tx_dropped: 5
                }
            )]
        );
    }
}
