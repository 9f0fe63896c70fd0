//! Paths of a QP: the map from logical paths to device source ports, re-pathing (PLB) and the
//! pacing gap.
use super::*;

/// A set of source ports (`0..MAX_PATHS`), one bit each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PortSet([u64; MAX_PATHS as usize / 64]);

/// How the QP's packets are spread over paths and spaced in time.
pub(crate) struct Route {
    /// Per-path health, spraying weights and re-pathing (indexed by logical path).
    pub(crate) paths: PathSet,
    /// Logical path → device path (source port). Re-pathing moves a logical path to a
    /// fresh port.
    pub(crate) port_map: Vec<u16>,
    /// The ports `port_map` holds (each at most once), for finding a spare one in O(1).
    pub(crate) ports_used: PortSet,
    pub(crate) pacer: Pacer,
    /// When the last new packet left, and its length (see [`Qp::pace_at`]).
    pub(crate) last_paced: (Timestamp, u32),
    /// New packets are waiting only for the pacer (its next send time is a deadline).
    pub(crate) paced_out: bool,
    /// New packets per path draw (burst spraying), at least 1.
    pub(crate) burst: u16,
    /// The path of the current burst, and how many more new packets it carries.
    pub(crate) burst_path: u8,
    pub(crate) burst_left: u16,
}

impl PortSet {
    /// Ports `0..n`.
    pub(crate) fn first(n: u16) -> PortSet {
        let mut s = PortSet::default();
        for p in 0..n.min(MAX_PATHS) {
            s.insert(p);
        }
        s
    }

    pub(crate) fn insert(&mut self, port: u16) {
        if let Some(w) = self.0.get_mut(usize::from(port) / 64) {
            *w |= 1 << (port % 64);
        }
    }

    pub(crate) fn remove(&mut self, port: u16) {
        if let Some(w) = self.0.get_mut(usize::from(port) / 64) {
            *w &= !(1 << (port % 64));
        }
    }

    /// How many of the ports `0..n` are not in the set.
    pub(crate) fn free_below(&self, n: u16) -> u16 {
        let n = usize::from(n.min(MAX_PATHS));
        let mut used = 0;
        for (i, w) in self.0.iter().enumerate() {
            let lo = i * 64;
            if lo >= n {
                break;
            }
            let mask = if n - lo >= 64 {
                u64::MAX
            } else {
                (1u64 << (n - lo)) - 1
            };
            used += (w & mask).count_ones() as usize;
        }
        (n - used) as u16
    }

    /// The `k`-th smallest port not in the set (`k` below [`free_below`](Self::free_below)).
    pub(crate) fn nth_free(&self, k: u16) -> u16 {
        let mut k = u32::from(k);
        for (i, w) in self.0.iter().enumerate() {
            let free = !w;
            let c = free.count_ones();
            if k < c {
                let mut f = free;
                for _ in 0..k {
                    f &= f - 1;
                }
                return (i * 64) as u16 + f.trailing_zeros() as u16;
            }
            k -= c;
        }
        MAX_PATHS
    }
}

impl Route {
    pub(crate) fn new(paths: u16, burst: u16, path_cfg: PathConfig) -> Route {
        Route {
            paths: PathSet::with_config(paths, path_cfg),
            port_map: (0..paths).collect(),
            ports_used: PortSet::first(paths),
            pacer: Pacer::new(),
            last_paced: (Timestamp::ZERO, 0),
            paced_out: false,
            burst: burst.max(1),
            burst_path: 0,
            burst_left: 0,
        }
    }
}

impl Qp {
    /// Moves the paths PLB asked to re-path to spare source ports.
    pub(crate) fn repath(&mut self, sh: &mut Shared) {
        // PLB: a path kept looking congested; move it to a source port no other path of this
        // QP uses (the device has `cfg.ports` of them, by default more than the paths).
        // Sharing a port would only concentrate traffic (and could leave a route unused), so
        // without a spare port the path stays where it is, and keeps its statistics (taking
        // the re-path would reset them and make the bad path look new).
        let ports = sh.cfg.ports;
        if self.route.ports_used.free_below(ports) == 0 {
            self.route.paths.drop_repaths();
        }
        while let Some(path) = self.route.paths.take_repath() {
            let spare = self.route.ports_used.free_below(ports);
            if spare == 0 {
                continue;
            }
            let k = (sh.rng.next_u32() as usize) % usize::from(spare);
            let port = self.route.ports_used.nth_free(k as u16);
            if let Some(slot) = self.route.port_map.get_mut(usize::from(path)) {
                self.route.ports_used.remove(*slot);
                self.route.ports_used.insert(port);
                *slot = port;
                self.counters.repaths += 1;
            }
        }
    }

    /// A path for a new packet, by the paths' weights: the next point of the path set's
    /// low-discrepancy sequence ([`PathSet::pick_spread`]), which the first draw seeds.
    pub(crate) fn next_path(&mut self, sh: &mut Shared) -> u8 {
        self.route.paths.pick_spread(sh.rng.next_u32()) as u8
    }

    /// New packets the current burst has yet to send on its path.
    pub(crate) fn burst_left(&self) -> u16 {
        self.route.burst_left
    }

    /// A path for a new data packet: drawn as [`next_path`](Self::next_path) does once per
    /// burst of `route.burst` consecutive new packets, which all leave on it, so the datapath
    /// can coalesce them (UDP GSO). With a burst of 1 this is `next_path`, draw for draw.
    pub(crate) fn next_burst_path(&mut self, sh: &mut Shared) -> u8 {
        if self.route.burst_left == 0 {
            self.route.burst_path = self.next_path(sh);
            self.route.burst_left = self.route.burst;
        }
        self.route.burst_left -= 1;
        self.route.burst_path
    }
    /// The earliest time a new packet may leave. The pacer fixed it from the controller's rate
    /// when the last packet left; the rate may have risen since, or pacing stopped (a window of
    /// a packet or more), as when acknowledgements return after an outage that had cut the rate
    /// to a trickle. So the gap after the last packet is measured again at the current rate,
    /// and the earlier time holds: a gap set by a collapsed rate must not hold back a connection
    /// that has recovered (it held a READ's responses for 0.9 s, past the requester's retry
    /// budget, in the fault matrix's loss bursts).
    pub(crate) fn pace_at(&self) -> Timestamp {
        let (at, len) = self.route.last_paced;
        let mut current = Pacer::new();
        current.on_sent(at, len, self.cc.pacing_rate());
        self.route
            .pacer
            .next_send_time()
            .min(current.next_send_time())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The port set answers what a plain list of ports would: how many of `0..n` are
        /// spare, and which is the k-th spare one in increasing order.
        #[test]
        fn port_set_matches_a_list(
            moves in proptest::collection::vec((0u16..MAX_PATHS, 0u16..MAX_PATHS), 0..64),
            initial in 1u16..=MAX_PATHS,
            n in 1u16..=MAX_PATHS,
        ) {
            let mut set = PortSet::first(initial);
            let mut list: Vec<u16> = (0..initial).collect();
            for (out, inn) in moves {
                set.remove(out);
                list.retain(|&p| p != out);
                set.insert(inn);
                if !list.contains(&inn) {
                    list.push(inn);
                }
                let spare: Vec<u16> = (0..n).filter(|p| !list.contains(p)).collect();
                prop_assert_eq!(usize::from(set.free_below(n)), spare.len());
                for (k, &p) in spare.iter().enumerate() {
                    prop_assert_eq!(set.nth_free(k as u16), p);
                }
            }
        }
    }
}
