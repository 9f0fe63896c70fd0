//! One driver of real engines over any simulated [`Network`]: the glue that hands
//! datagrams to [`Endpoint`]s, runs their timers, moves what they transmit into the network,
//! and hands their completions to the test or workload, written once.
//!
//! What it does not do: read a clock, start threads, or change the engine. Time is virtual:
//! [`Driver::step`] jumps to the earliest event (a delivery, or a host's wake-up: an engine
//! timer, its NIC draining, a batched receive falling due, the end of a hold) and processes
//! it. The same network seed, endpoints and calls give the same run.
//!
//! # One step
//!
//! 1. Every datagram the network delivers by `now` goes to its host's engine
//!    (`handle_datagram`), or, with [`DriverConfig::rx_batch_ns`] or while the host is held
//!    ([`Driver::hold_until`]), into the host's receive queue until its progress loop picks
//!    it up. The host is marked for service.
//! 2. Hosts whose wake-up is due are marked for service.
//! 3. Each marked host, in the order it was marked, is *serviced*: its batched datagrams are
//!    handed over if due, its engine's timers run if due (`handle_timeout`), then, in a loop,
//!    `poll_transmit` while its NIC has room (see [`DriverConfig::nic_limit_bytes`]),
//!    `poll_completion` into the [`Handler`], and again while the handler posted work;
//!    finally `poll_timeout` (with the NIC's drain time) sets its next wake-up.
//!
//! Only hosts that had input are serviced, so a run of thousands of hosts costs what its
//! traffic costs. Work posted from outside a handler (a test posting on an endpoint between
//! steps) needs [`Driver::touch`] so the host is serviced at the next step;
//! [`Driver::touch_all`] is the blunt form.
//!
//! # Slow and paused hosts
//!
//! [`Driver::hold_until`] defers everything a host does (its datagram handling, timers,
//! transmissions and completions) until a time: what arrives meanwhile waits in its receive
//! queue, and at the end of the hold the host catches up in one service, as a descheduled
//! progress thread does.
//!
//! [`Driver::set_host_model`] makes a host slow for the rest of the run ([`HostModel`]): each
//! datagram it handles or sends costs it time, during which it does nothing else (arrivals
//! wait in a bounded socket buffer, beyond which they are dropped, and are then handled at
//! most 32 at a time; its timers fire late), and it pauses at random, drawn from a seed.
//!
//! # Other hooks for tests
//!
//! [`Driver::drop_sent`] drops chosen datagrams a host sends before they reach the network;
//! [`Handler::on_delivery`] sees (and may lose) every delivery before a host does;
//! [`Driver::remove_host`] takes a host away as a crashed machine and
//! [`Driver::replace_ep`] restarts its process; [`Driver::step_until`] is a step that never
//! moves the clock past a given time.
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::mem;

use braid_datapath::net::{Delivery, HostId, Network};
use braid_datapath::{Ecn, Transmit};
use braid_proto::{Completion, CqId, Endpoint, Timestamp};

/// How the driver models each host's progress loop and NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverConfig {
    /// Size of the buffer each `poll_transmit` writes into (at least the engines' largest
    /// datagram).
    pub buffer_bytes: usize,
    /// Datagrams at least this long are handed to the network in the buffer the engine
    /// wrote them into ([`Network::send_buf`], no copy, for a network that pools buffers);
    /// shorter ones (ACKs) are copied out so the big buffer is reused. `usize::MAX` always
    /// copies.
    pub handover_min_bytes: usize,
    /// With a network that has NIC queues ([`Network::has_nic_queues`]), an engine is asked
    /// for a datagram only while its NIC holds fewer wire bytes than this, as a real NIC's
    /// backpressure does: packets then leave at line rate and wait in the switch queues,
    /// not in an unbounded host queue. `None` asks the engine for everything at once.
    pub nic_limit_bytes: Option<usize>,
    /// How often a host's progress loop picks up received datagrams, ns: datagrams that
    /// arrive within one interval are handed to the engine together (as a batched receive
    /// does), so one ACK covers them. 0 hands each datagram over as it arrives.
    pub rx_batch_ns: u64,
    /// Which hosts a step services.
    pub service: Service,
}

impl Default for DriverConfig {
    /// A 64 KiB buffer, always copied, no NIC limit, no receive batching, only the hosts
    /// that had input serviced.
    fn default() -> Self {
        DriverConfig {
            buffer_bytes: 65_536,
            handover_min_bytes: usize::MAX,
            nic_limit_bytes: None,
            rx_batch_ns: 0,
            service: Service::Marked,
        }
    }
}

/// Which hosts a step services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Only the hosts that had input (a datagram, a due wake-up, a [`Driver::touch`]), in
    /// the order they had it, each through its whole service (timers, transmissions,
    /// completions, next wake-up): what a fabric of thousands of hosts needs.
    Marked,
    /// Every host, in host order: first each one's due timers (and batched datagrams), then
    /// each one's transmissions and completions; the next event is the earliest engine
    /// deadline or delivery, read from every host. Work posted from outside needs no
    /// [`Driver::touch`]. This is the order `braid::testing::Cluster` drives its nodes in.
    EveryHost,
}

/// What the test or workload does with completions.
pub trait Handler<N: Network> {
    /// Called for each datagram the network delivers, before any host sees it (whether or
    /// not a host runs at its address): a test looks at it or copies it, and returns false
    /// to lose it there. The default keeps every datagram.
    fn on_delivery(&mut self, delivery: &Delivery) -> bool {
        let _ = delivery;
        true
    }

    /// Called for each completion host `host`'s engine reports (on completion queue `cq`),
    /// in the order the engine reports them, while the host is being serviced. It may post
    /// work on any endpoint ([`Driver::ep_mut`]); work on another host than `host` needs
    /// [`Driver::touch`]. Returns whether it posted work on `host`, so the driver polls its
    /// transmissions again.
    fn on_completion(
        &mut self,
        driver: &mut Driver<N>,
        host: usize,
        cq: CqId,
        completion: Completion,
    ) -> bool;
}

/// A [`Handler`] that queues every completion per host and completion queue, for a test to
/// take with [`CqQueues::poll`].
#[derive(Debug, Default)]
pub struct CqQueues {
    queues: Vec<HashMap<CqId, VecDeque<Completion>>>,
}

impl CqQueues {
    /// Takes the oldest completion of `cq` on host `host`.
    pub fn poll(&mut self, host: usize, cq: CqId) -> Option<Completion> {
        self.queues.get_mut(host)?.get_mut(&cq)?.pop_front()
    }

    /// Completions waiting on `cq` of host `host`.
    pub fn len(&self, host: usize, cq: CqId) -> usize {
        self.queues
            .get(host)
            .and_then(|q| q.get(&cq))
            .map_or(0, VecDeque::len)
    }

    /// Forgets every completion waiting on host `host` (a restarted host's old queues).
    pub fn clear(&mut self, host: usize) {
        if let Some(q) = self.queues.get_mut(host) {
            q.clear();
        }
    }

    /// Whether no completion waits anywhere.
    pub fn is_empty(&self) -> bool {
        self.queues
            .iter()
            .flat_map(HashMap::values)
            .all(VecDeque::is_empty)
    }
}

impl<N: Network> Handler<N> for CqQueues {
    fn on_completion(&mut self, _: &mut Driver<N>, host: usize, cq: CqId, c: Completion) -> bool {
        if self.queues.len() <= host {
            self.queues.resize_with(host + 1, HashMap::new);
        }
        self.queues[host].entry(cq).or_default().push_back(c);
        false
    }
}

/// Why [`Driver::drive_bounded`] stopped before the network went idle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Livelock {
    /// Steps taken.
    pub steps: u64,
    /// Seed of the network, to replay the run.
    pub seed: u64,
    /// Virtual time reached.
    pub now: Timestamp,
}

impl std::fmt::Display for Livelock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no quiescence after {} steps at {} ns (seed {})",
            self.steps,
            self.now.as_nanos(),
            self.seed
        )
    }
}

impl std::error::Error for Livelock {}

/// How fast a simulated host runs. `Default` is an infinitely fast host (no cost, no pause),
/// which is what every host is unless [`Driver::set_host_model`] says otherwise.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct HostModel {
    /// Time each datagram handled or sent costs the host, ns. While it works it handles
    /// nothing else: arrivals queue, timers fire late.
    pub cost_ns: u64,
    /// Arrivals queued while busy, at most (a socket buffer); more are dropped. 0 means 256.
    pub queue: usize,
    /// Mean time between pauses, ns (0: never pauses). Pause starts are drawn uniformly
    /// from 0 to twice this after the previous pause ends.
    pub pause_every_ns: u64,
    /// How long one pause lasts, ns.
    pub pause_ns: u64,
}

impl HostModel {
    /// A host `factor` times slower than one that spends a microsecond per datagram.
    pub fn slower(factor: u64) -> HostModel {
        HostModel {
            cost_ns: factor * 1_000,
            ..HostModel::default()
        }
    }

    /// A host that pauses for `pause_ns` every `every_ns` on average.
    pub fn pausing(every_ns: u64, pause_ns: u64) -> HostModel {
        HostModel {
            pause_every_ns: every_ns,
            pause_ns,
            ..HostModel::default()
        }
    }

    fn is_slow(&self) -> bool {
        self.cost_ns > 0 || self.pause_every_ns > 0
    }
}

/// Most queued arrivals a slow host handles in one go (a receive batch).
const SLOW_BATCH: usize = 32;

/// What a slow host is doing: busy until when, what waits for it, when it pauses next.
#[derive(Debug, Default)]
struct SlowHost {
    model: HostModel,
    busy_until: Timestamp,
    inbox: VecDeque<Delivery>,
    next_pause: Option<Timestamp>,
    /// It handled something while busy and has not polled for datagrams to send since.
    owes_flush: bool,
    rng: u64,
    dropped: u64,
    pauses: u64,
}

impl SlowHost {
    fn draw(&mut self) -> u64 {
        // splitmix64: deterministic from the seed `set_host_model` was given.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn schedule_pause(&mut self, after: Timestamp) {
        let every = self.model.pause_every_ns;
        self.next_pause = (every > 0).then(|| after.add_nanos(self.draw() % (2 * every)));
    }

    /// True when the host may work at `now`; starts a due pause first.
    fn ready(&mut self, now: Timestamp) -> bool {
        if let Some(p) = self.next_pause
            && p <= now
            && self.busy_until <= now
        {
            self.busy_until = now.add_nanos(self.model.pause_ns);
            self.pauses += 1;
            self.schedule_pause(self.busy_until);
        }
        self.busy_until <= now
    }

    fn work(&mut self, now: Timestamp, datagrams: u64) {
        let from = self.busy_until.max(now);
        self.busy_until = from.add_nanos(self.model.cost_ns.saturating_mul(datagrams));
    }

    /// Queues an arrival, or drops it when the socket buffer is full.
    fn arrive(&mut self, d: Delivery) -> Option<Delivery> {
        let cap = if self.model.queue == 0 {
            256
        } else {
            self.model.queue
        };
        if self.inbox.len() < cap {
            self.inbox.push_back(d);
            None
        } else {
            self.dropped += 1;
            Some(d)
        }
    }

    /// When the host next has something to do by itself, given its engine's deadline: the
    /// deadline once it is free, or the moment it is free when arrivals wait or it owes a
    /// transmission poll. An idle host's pauses are no events.
    fn deadline(&self, timer: Option<Timestamp>) -> Option<Timestamp> {
        let owed = (!self.inbox.is_empty() || self.owes_flush).then_some(self.busy_until);
        [timer.map(|t| t.max(self.busy_until)), owed]
            .into_iter()
            .flatten()
            .min()
    }
}

/// A rule of [`Driver::drop_sent`]: how many more to drop, and which datagrams.
#[derive(Copy, Clone, Debug)]
struct TxDrop {
    left: u32,
    which: fn(&[u8]) -> bool,
}

/// One simulated host: its engine and the driver's view of its progress loop.
#[derive(Debug)]
struct Host {
    ep: Endpoint,
    id: HostId,
    /// The wake-up pushed on the heap that is still valid, ns.
    wake: Option<u64>,
    /// Marked for service.
    dirty: bool,
    /// Datagrams received and not yet handed to the engine, and when the progress loop
    /// picks them up.
    rx: Vec<Delivery>,
    rx_due: Option<u64>,
    /// The host does nothing before this time ([`Driver::hold_until`]), ns.
    held_until: Option<u64>,
    /// Its speed and pauses, when it is not infinitely fast ([`Driver::set_host_model`]).
    slow: Option<Box<SlowHost>>,
    /// Datagrams it sends that are dropped before the network ([`Driver::drop_sent`]).
    tx_drop: Option<TxDrop>,
    /// The host is gone ([`Driver::remove_host`]): nothing reaches it, it does nothing.
    gone: bool,
}

impl Host {
    /// The earliest time the host has something to do by itself ([`Service::EveryHost`]):
    /// the end of its hold, or else its batched datagrams or its engine's deadline.
    fn next_deadline(&self) -> Option<Timestamp> {
        if self.gone {
            return None;
        }
        if let Some(until) = self.held_until {
            return Some(Timestamp::from_nanos(until));
        }
        let rx = self.rx_due.map(Timestamp::from_nanos);
        let timer = match &self.slow {
            Some(slow) => slow.deadline(self.ep.poll_timeout()),
            None => self.ep.poll_timeout(),
        };
        match (timer, rx) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Real engines on a simulated network, on virtual time; see the [module docs](self).
#[derive(Debug)]
pub struct Driver<N> {
    /// The network; change its links at any time.
    pub net: N,
    /// Virtual time now.
    pub now: Timestamp,
    /// Steps taken so far.
    pub steps: u64,
    cfg: DriverConfig,
    hosts: Vec<Host>,
    /// Wake-ups `(ns, host)`; an entry is stale unless it matches the host's `wake`.
    wakes: BinaryHeap<Reverse<(u64, u32)>>,
    dirty: Vec<u32>,
    /// The host being serviced (work a handler posts on it needs no `touch`).
    servicing: Option<usize>,
    completions: Vec<(CqId, Completion)>,
    /// The buffer for the next `poll_transmit`.
    spare: Vec<u8>,
    late_deadlines: u64,
    /// Datagrams [`Driver::drop_sent`] rules dropped.
    tx_dropped: u64,
}

impl<N: Network> Driver<N> {
    /// A driver of no hosts yet on `net`.
    pub fn new(net: N, cfg: DriverConfig) -> Self {
        Driver {
            net,
            now: Timestamp::ZERO,
            steps: 0,
            cfg,
            hosts: Vec::new(),
            wakes: BinaryHeap::new(),
            dirty: Vec::new(),
            servicing: None,
            completions: Vec::new(),
            spare: Vec::new(),
            late_deadlines: 0,
            tx_dropped: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DriverConfig {
        &self.cfg
    }

    /// Adds a host running `ep` at network host `id` (whose address should be the
    /// endpoint's); returns its index, `0..` in the order hosts were added.
    pub fn add_host(&mut self, id: HostId, ep: Endpoint) -> usize {
        self.hosts.push(Host {
            ep,
            id,
            wake: None,
            dirty: false,
            rx: Vec::new(),
            rx_due: None,
            held_until: None,
            slow: None,
            tx_drop: None,
            gone: false,
        });
        self.hosts.len() - 1
    }

    /// Number of hosts.
    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    /// Host `h`'s network id.
    pub fn host_id(&self, h: usize) -> HostId {
        self.hosts[h].id
    }

    /// Host `h`'s engine.
    pub fn ep(&self, h: usize) -> &Endpoint {
        &self.hosts[h].ep
    }

    /// Host `h`'s engine, to post work or change resources. Outside a [`Handler`] call for
    /// `h`, follow it with [`Driver::touch`] so the host is serviced.
    pub fn ep_mut(&mut self, h: usize) -> &mut Endpoint {
        &mut self.hosts[h].ep
    }

    /// Every engine, in host order.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> + '_ {
        self.hosts.iter().map(|h| &h.ep)
    }

    /// Marks host `h` for service at the next step (or the next [`Driver::service`]).
    pub fn touch(&mut self, h: usize) {
        if self.servicing == Some(h) {
            return;
        }
        let host = &mut self.hosts[h];
        if !host.dirty {
            host.dirty = true;
            self.dirty.push(h as u32);
        }
    }

    /// Marks every host for service, in host order.
    pub fn touch_all(&mut self) {
        for h in 0..self.hosts.len() {
            self.touch(h);
        }
    }

    /// Defers everything host `h` does until `until`: datagrams arriving meanwhile wait in
    /// its receive queue, its timers, transmissions and completions wait, and at `until`
    /// it catches up in one service. A later hold replaces an earlier one.
    pub fn hold_until(&mut self, h: usize, until: Timestamp) {
        let until = until.as_nanos();
        let host = &mut self.hosts[h];
        host.held_until = Some(until);
        host.rx_due = host.rx_due.map(|d| d.max(until));
        // Nothing happens on the host before `until`; then it catches up and reschedules.
        if host.wake != Some(until) {
            host.wake = Some(until);
            self.wakes.push(Reverse((until, h as u32)));
        }
    }

    /// Makes host `h` run as `model` says from now on: each datagram it handles or sends
    /// costs it `cost_ns`, during which its timers and arrivals wait (and are handled late,
    /// at most 32 arrivals at a time), arrivals beyond its socket buffer are dropped, and it
    /// pauses at random, as a descheduled process does. Its pauses are drawn from `seed`.
    pub fn set_host_model(&mut self, h: usize, model: HostModel, seed: u64) {
        let now = self.now;
        let slow = self.hosts[h].slow.get_or_insert_with(Box::default);
        slow.model = model;
        slow.rng = seed;
        slow.schedule_pause(now);
        // Its next wake-up depends on the model now.
        self.touch(h);
    }

    /// Arrivals host `h` dropped because its queue was full while it was busy.
    pub fn host_drops(&self, h: usize) -> u64 {
        self.hosts[h].slow.as_ref().map_or(0, |s| s.dropped)
    }

    /// Pauses host `h` has taken.
    pub fn host_pauses(&self, h: usize) -> u64 {
        self.hosts[h].slow.as_ref().map_or(0, |s| s.pauses)
    }

    /// Drops the next `n` datagrams host `h` sends that `which` matches, before they reach
    /// the network: a loss aimed at exactly one packet (a NAK, say). Replaces an earlier
    /// rule of the same host.
    pub fn drop_sent(&mut self, h: usize, n: u32, which: fn(&[u8]) -> bool) {
        self.hosts[h].tx_drop = Some(TxDrop { left: n, which });
    }

    /// Forgets every [`drop_sent`](Self::drop_sent) rule.
    pub fn clear_drop_sent(&mut self) {
        for host in &mut self.hosts {
            host.tx_drop = None;
        }
    }

    /// Datagrams dropped by [`drop_sent`](Self::drop_sent) rules so far.
    pub fn dropped_sent(&self) -> u64 {
        self.tx_dropped
    }

    /// Takes host `h` away, as a crashed machine: what the network delivers to it is lost,
    /// its engine's timers never run and it sends nothing more. Its index stays taken and
    /// its engine readable.
    pub fn remove_host(&mut self, h: usize) {
        let host = &mut self.hosts[h];
        host.gone = true;
        host.wake = None;
        for d in host.rx.drain(..) {
            self.net.recycle(d.bytes);
        }
        host.rx_due = None;
        if let Some(slow) = &mut host.slow {
            slow.inbox.clear();
            slow.owes_flush = false;
        }
    }

    /// Whether host `h` was taken away ([`Driver::remove_host`]).
    pub fn is_removed(&self, h: usize) -> bool {
        self.hosts[h].gone
    }

    /// Runs `ep` on host `h` from now on, as a restarted process on the same machine
    /// (its network host, receive queue and model stay); returns the engine it replaces.
    pub fn replace_ep(&mut self, h: usize, ep: Endpoint) -> Endpoint {
        let old = mem::replace(&mut self.hosts[h].ep, ep);
        self.touch(h);
        old
    }

    /// Whether host `h` is held at `now` ([`Driver::hold_until`]).
    pub fn is_held(&self, h: usize) -> bool {
        self.hosts[h]
            .held_until
            .is_some_and(|t| t > self.now.as_nanos())
    }

    /// Wake-ups that had to be pushed a nanosecond past an engine deadline already due (an
    /// engine that keeps reporting past deadlines; 0 in a healthy run).
    pub fn late_deadlines(&self) -> u64 {
        self.late_deadlines
    }

    /// When the next event happens: a delivery inside the network or a host's wake-up.
    /// Stale wake-ups are dropped on the way.
    pub fn next_event(&mut self) -> Option<Timestamp> {
        if self.cfg.service == Service::EveryHost {
            return self.every_host_next_event();
        }
        while let Some(&Reverse((t, h))) = self.wakes.peek() {
            if self.hosts[h as usize].wake == Some(t) {
                break;
            }
            self.wakes.pop();
        }
        let wake = self.wakes.peek().map(|Reverse((t, _))| *t);
        let net = self.net.next_event().map(Timestamp::as_nanos);
        match (net, wake) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .map(Timestamp::from_nanos)
    }

    /// [`Service::EveryHost`]'s next event: the earliest delivery or host deadline.
    pub(crate) fn every_host_next_event(&self) -> Option<Timestamp> {
        let net = self.net.next_event();
        let hosts = self.hosts.iter().filter_map(Host::next_deadline).min();
        match (net, hosts) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Services the marked hosts (their pending work and completions) at the current time,
    /// without advancing it.
    pub fn service(&mut self, handler: &mut impl Handler<N>) {
        if self.cfg.service == Service::EveryHost {
            self.flush_all(handler);
            return;
        }
        let mut i = 0;
        while i < self.dirty.len() {
            let h = self.dirty[i] as usize;
            self.hosts[h].dirty = false;
            self.service_host(h, handler);
            i += 1;
        }
        self.dirty.clear();
    }

    /// Services the marked hosts, advances to the next event and processes it (steps 1 to 3
    /// of the [module docs](self)). False when nothing is pending.
    pub fn step(&mut self, handler: &mut impl Handler<N>) -> bool {
        self.service(handler);
        let Some(next) = self.next_event() else {
            return false;
        };
        self.now = self.now.max(next);
        self.process(handler);
        true
    }

    /// [`step`](Self::step), except that the clock never passes `until`: when nothing is
    /// due by then, the clock moves to `until` and the step ends there. False when nothing
    /// is pending and there is no `until`.
    pub fn step_until(&mut self, handler: &mut impl Handler<N>, until: Option<Timestamp>) -> bool {
        self.service(handler);
        match (self.next_event(), until) {
            (None, None) => false,
            (None, Some(u)) => {
                self.now = self.now.max(u);
                true
            }
            (Some(n), Some(u)) if u < n => {
                self.now = self.now.max(u);
                true
            }
            (Some(n), _) => {
                self.now = self.now.max(n);
                self.process(handler);
                true
            }
        }
    }

    /// Steps until `done` holds, nothing is pending, or the next event is past `until`.
    /// Returns whether `done` held.
    pub fn run_until<H: Handler<N>>(
        &mut self,
        handler: &mut H,
        until: Timestamp,
        mut done: impl FnMut(&Self, &H) -> bool,
    ) -> bool {
        self.service(handler);
        while !done(self, handler) {
            self.service(handler);
            match self.next_event() {
                Some(next) if next <= until => {
                    self.now = self.now.max(next);
                    self.process(handler);
                }
                _ => return done(self, handler),
            }
        }
        true
    }

    /// Runs until nothing is pending (all traffic delivered, no timer armed, no host held).
    /// Fails (with the seed) if that takes more than `max_steps` steps: a livelock.
    pub fn drive_bounded(
        &mut self,
        handler: &mut impl Handler<N>,
        max_steps: u64,
    ) -> Result<(), Livelock> {
        for _ in 0..max_steps {
            if !self.step(handler) {
                return Ok(());
            }
        }
        self.service(handler);
        if self.next_event().is_none() {
            return Ok(());
        }
        Err(Livelock {
            steps: self.steps,
            seed: self.net.seed(),
            now: self.now,
        })
    }

    /// Steps 1 to 3 at `self.now`.
    fn process(&mut self, handler: &mut impl Handler<N>) {
        self.steps += 1;
        let now = self.now;
        let t_now = now.as_nanos();
        let batch = self.cfg.rx_batch_ns;
        while let Some(d) = self.net.poll_deliver(now) {
            if !handler.on_delivery(&d) {
                self.net.recycle(d.bytes);
                continue;
            }
            let h = d.host.0 as usize;
            let Some(host) = self.hosts.get_mut(h).filter(|host| !host.gone) else {
                // A network host no engine runs on: nobody listens.
                self.net.recycle(d.bytes);
                continue;
            };
            if let Some(slow) = host.slow.as_mut().filter(|s| s.model.is_slow()) {
                // Its progress loop takes arrivals from its socket buffer when it is free.
                if let Some(lost) = slow.arrive(d) {
                    self.net.recycle(lost.bytes);
                }
                self.touch(h);
                continue;
            }
            let held = host.held_until.filter(|&t| t > t_now);
            if batch == 0 && held.is_none() {
                host.ep
                    .handle_datagram(now, d.meta.src, d.meta.ecn as u8, &d.bytes);
                self.net.recycle(d.bytes);
                self.touch(h);
                continue;
            }
            host.rx.push(d);
            if host.rx_due.is_none() {
                let due = (t_now + batch).max(held.unwrap_or(0));
                host.rx_due = Some(due);
                if host.wake.is_none_or(|w| w > due) {
                    host.wake = Some(due);
                    self.wakes.push(Reverse((due, h as u32)));
                }
            }
        }
        if self.cfg.service == Service::EveryHost {
            for h in 0..self.hosts.len() {
                self.catch_up(h);
            }
            self.flush_all(handler);
            return;
        }
        while let Some(&Reverse((t, h))) = self.wakes.peek() {
            if t > t_now {
                break;
            }
            self.wakes.pop();
            let h = h as usize;
            if self.hosts[h].wake == Some(t) {
                self.hosts[h].wake = None;
                self.touch(h);
            }
        }
        self.service(handler);
    }

    /// Ends host `h`'s hold if it is over, then hands over its batched datagrams and runs
    /// its timers if due. Returns false while the host is held.
    fn catch_up(&mut self, h: usize) -> bool {
        let now = self.now;
        let t_now = now.as_nanos();
        let host = &mut self.hosts[h];
        if host.gone {
            return false;
        }
        if let Some(until) = host.held_until {
            if until > t_now {
                return false;
            }
            host.held_until = None;
        }
        if let Some(slow) = host.slow.as_mut().filter(|s| s.model.is_slow()) {
            // A batch of what arrived, then the timers, at whatever time the host is free.
            if !slow.ready(now) {
                return false;
            }
            let n = slow.inbox.len().min(SLOW_BATCH);
            for d in slow.inbox.drain(..n) {
                host.ep
                    .handle_datagram(now, d.meta.src, d.meta.ecn as u8, &d.bytes);
                self.net.recycle(d.bytes);
            }
            slow.work(now, n as u64);
            slow.owes_flush = true;
        }
        if host.rx_due.is_some_and(|d| d <= t_now) {
            host.rx_due = None;
            for d in host.rx.drain(..) {
                host.ep
                    .handle_datagram(now, d.meta.src, d.meta.ecn as u8, &d.bytes);
                self.net.recycle(d.bytes);
            }
        }
        if host.ep.poll_timeout().is_some_and(|t| t <= now) {
            host.ep.handle_timeout(now);
            if let Some(slow) = &mut host.slow {
                slow.owes_flush = true;
            }
        }
        true
    }

    /// Whether host `h` may transmit now: it is there, not held, and not a slow host still
    /// busy (asking starts the slow host's pause when one is due).
    fn may_run(&mut self, h: usize) -> bool {
        let now = self.now;
        if self.hosts[h].gone || self.is_held(h) {
            return false;
        }
        match self.hosts[h].slow.as_mut() {
            Some(slow) if slow.model.is_slow() => slow.ready(now),
            _ => true,
        }
    }

    /// [`Service::EveryHost`]: transmissions and completions of every host not held, in
    /// host order.
    fn flush_all(&mut self, handler: &mut impl Handler<N>) {
        for h in mem::take(&mut self.dirty) {
            self.hosts[h as usize].dirty = false;
        }
        let nic_limit = self.nic_limit();
        for h in 0..self.hosts.len() {
            if self.may_run(h) {
                self.run_host(h, handler, nic_limit);
            }
        }
    }

    /// The NIC limit, if the network has NIC queues.
    fn nic_limit(&self) -> Option<usize> {
        self.cfg
            .nic_limit_bytes
            .filter(|_| self.net.has_nic_queues())
    }

    /// Runs host `h`'s engine: batched datagrams and timers if due, transmissions while its
    /// NIC has room, completions (and the work they trigger), then its next wake-up.
    fn service_host(&mut self, h: usize, handler: &mut impl Handler<N>) {
        let now = self.now;
        let t_now = now.as_nanos();
        if !self.catch_up(h) || !self.may_run(h) {
            // Held or busy: come back when it is free.
            let host = &mut self.hosts[h];
            if host.gone {
                return;
            }
            let busy = host.slow.as_ref().map(|s| s.busy_until.as_nanos());
            let until = host.held_until.or(busy).unwrap_or(t_now).max(t_now + 1);
            if host.wake != Some(until) {
                host.wake = Some(until);
                self.wakes.push(Reverse((until, h as u32)));
            }
            return;
        }
        let nic_limit = self.nic_limit();
        let nic_full = self.run_host(h, handler, nic_limit);
        self.schedule(h, nic_full, nic_limit);
    }

    /// Host `h`'s transmissions while its NIC has room and its completions, again while the
    /// handler posts work; returns whether the NIC was left full.
    fn run_host(
        &mut self,
        h: usize,
        handler: &mut impl Handler<N>,
        nic_limit: Option<usize>,
    ) -> bool {
        self.servicing = Some(h);
        let mut nic_full;
        loop {
            let sent;
            (nic_full, sent) = self.transmit(h, nic_limit);
            if let Some(slow) = self.hosts[h].slow.as_mut().filter(|s| s.model.is_slow()) {
                slow.work(self.now, sent);
                slow.owes_flush = false;
            }
            let mut completions = mem::take(&mut self.completions);
            completions.clear();
            while let Some(c) = self.hosts[h].ep.poll_completion() {
                completions.push(c);
            }
            let mut posted = false;
            for &(cq, c) in &completions {
                posted |= handler.on_completion(self, h, cq, c);
            }
            let any = !completions.is_empty();
            self.completions = completions;
            if !any || !posted {
                break;
            }
        }
        self.servicing = None;
        nic_full
    }

    /// `poll_transmit` into the network while host `h`'s NIC has room; returns whether it
    /// stopped because the NIC was full, and how many datagrams the engine gave.
    fn transmit(&mut self, h: usize, nic_limit: Option<usize>) -> (bool, u64) {
        let now = self.now;
        let host = &mut self.hosts[h];
        let mut sent = 0;
        loop {
            if let Some(limit) = nic_limit
                && self.net.nic_backlog_bytes(host.id, now) >= limit
            {
                return (true, sent);
            }
            if self.spare.len() < self.cfg.buffer_bytes {
                self.spare = self.net.buffer(self.cfg.buffer_bytes);
            }
            let Some(mut t) = host.ep.poll_transmit(now, &mut self.spare) else {
                return (false, sent);
            };
            if t.payload.is_some() {
                // A payload left in its region (`Endpoint::set_in_place_min`): the simulated
                // network carries whole datagrams, so it is copied in at once, the CRC read
                // in place vouching for it.
                assert!(
                    host.ep.copy_payload(&mut t, &mut self.spare),
                    "a payload left in place outside the pinned regions"
                );
                host.ep.unpin_payloads();
            }
            sent += 1;
            if let Some(d) = &mut host.tx_drop
                && d.left > 0
                && (d.which)(&self.spare[..t.len])
            {
                d.left -= 1;
                self.tx_dropped += 1;
                continue;
            }
            let ecn = Ecn::from_tos(t.ecn);
            if t.len < self.cfg.handover_min_bytes {
                let tx = Transmit {
                    dest: t.dest,
                    path: t.path,
                    ecn,
                    contents: &self.spare[..t.len],
                };
                self.net.send(now, host.id, &tx);
            } else {
                let mut buf = mem::take(&mut self.spare);
                buf.truncate(t.len);
                self.net.send_buf(now, host.id, t.dest, t.path, ecn, buf);
            }
        }
    }

    /// Sets host `h`'s next wake-up: its engine's deadline, or when its full NIC drains, or
    /// when its batched datagrams fall due, whichever comes first.
    fn schedule(&mut self, h: usize, nic_full: bool, nic_limit: Option<usize>) {
        let now = self.now;
        let t_now = now.as_nanos();
        let host = &self.hosts[h];
        let timer = match &host.slow {
            Some(slow) if slow.model.is_slow() => slow.deadline(host.ep.poll_timeout()),
            _ => host.ep.poll_timeout(),
        }
        .map(Timestamp::as_nanos);
        let wake = if nic_full {
            let ready = self
                .net
                .nic_drained_at(host.id, now, nic_limit.unwrap_or(0))
                .as_nanos()
                .max(t_now + 1);
            // A deadline already past is a pacing time the full NIC overtook: the NIC wake-up
            // covers it.
            Some(timer.filter(|&t| t > t_now).map_or(ready, |t| t.min(ready)))
        } else {
            timer.map(|t| {
                if t <= t_now {
                    self.late_deadlines += 1;
                    t_now + 1
                } else {
                    t
                }
            })
        };
        let host = &mut self.hosts[h];
        let wake = match (wake, host.rx_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if wake != host.wake {
            host.wake = wake;
            if let Some(w) = wake {
                self.wakes.push(Reverse((w, h as u32)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use braid_datapath::sim::{LinkConfig, SimNet};
    use braid_proto::{
        Access, EndpointConfig, QpInfo, Region, RemoteAddr, SendOp, SendWr, Sge, WcStatus,
    };

    use super::*;

    use std::sync::Arc;

    struct Pair {
        driver: Driver<SimNet>,
        qp_a: QpInfo,
        cq_a: CqId,
        src: u32,
        dst: Arc<Region>,
        rkey: u32,
    }

    /// Two hosts on a SimNet with `link`, one connected QP pair, a source region on host 0
    /// holding `0..len` and a remotely writable region on host 1.
    fn pair(seed: u64, link: LinkConfig, len: usize) -> Pair {
        pair_leaving_in_place(seed, link, len, None)
    }

    /// [`pair`], host 0 leaving payloads of at least `in_place` bytes in their regions.
    fn pair_leaving_in_place(
        seed: u64,
        link: LinkConfig,
        len: usize,
        in_place: Option<usize>,
    ) -> Pair {
        let mut net = SimNet::new(seed);
        net.set_default_link(link);
        let cfg = EndpointConfig {
            seed,
            ..EndpointConfig::default()
        };
        let addrs: [SocketAddr; 2] = [
            "10.0.0.1:4791".parse().unwrap(),
            "10.0.0.2:4791".parse().unwrap(),
        ];
        let mut driver = Driver::new(net, DriverConfig::default());
        for (i, a) in addrs.iter().enumerate() {
            let id = driver.net.add_host(*a, cfg.paths);
            let mut c = cfg.clone();
            c.seed = seed + i as u64;
            assert_eq!(driver.add_host(id, Endpoint::new(c, *a)), i);
        }
        driver.ep_mut(0).set_in_place_min(in_place);
        let mut side = |h: usize| {
            let ep = driver.ep_mut(h);
            let pd = ep.alloc_pd();
            let cq = ep.create_cq();
            let qp = ep.create_qp(pd, cq, cq).unwrap();
            (pd, cq, qp)
        };
        let (pd_a, cq_a, qp_a) = side(0);
        let (pd_b, _, qp_b) = side(1);
        driver.ep_mut(0).connect(qp_a.qpn, qp_b).unwrap();
        driver.ep_mut(1).connect(qp_b.qpn, qp_a).unwrap();
        let src_region = Region::new(len);
        let bytes: Vec<u8> = (0..len).map(|i| (i + i / 251) as u8).collect();
        src_region.write(0, &bytes).unwrap();
        let src = driver
            .ep_mut(0)
            .register(pd_a, src_region, Access::LOCAL_WRITE)
            .unwrap()
            .lkey;
        let dst = Region::new(len);
        let rkey = driver
            .ep_mut(1)
            .register(
                pd_b,
                dst.clone(),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .unwrap()
            .rkey;
        Pair {
            driver,
            qp_a,
            cq_a,
            src,
            dst,
            rkey,
        }
    }

    fn write(p: &mut Pair, len: u32) {
        let wr = SendWr {
            wr_id: 7,
            op: SendOp::Write(RemoteAddr {
                rkey: p.rkey,
                offset: 0,
            }),
            sges: vec![Sge {
                lkey: p.src,
                offset: 0,
                len,
            }],
            signaled: true,
        };
        p.driver.ep_mut(0).post_send(p.qp_a.qpn, wr).unwrap();
        p.driver.touch(0);
    }

    #[test]
    fn a_write_over_lossy_links_completes_and_lands() {
        let link = LinkConfig {
            loss: 0.05,
            jitter_ns: 2_000,
            ..LinkConfig::default()
        };
        let mut p = pair(3, link, 256 << 10);
        write(&mut p, 256 << 10);
        let mut cqs = CqQueues::default();
        p.driver.drive_bounded(&mut cqs, 1_000_000).unwrap();
        let c = cqs.poll(0, p.cq_a).expect("the WRITE completed");
        assert_eq!((c.wr_id, c.status), (7, WcStatus::Success));
        assert!(cqs.is_empty());
        let want: Vec<u8> = (0..256 << 10).map(|i| (i + i / 251) as u8).collect();
        assert_eq!(p.dst.to_vec(0, want.len()).unwrap(), want);
        assert!(p.driver.net.stats().lost > 0, "the links lost something");
        assert_eq!(p.driver.net.in_flight(), 0);
        assert_eq!(p.driver.next_event(), None);
    }

    /// The same with payloads left in their regions (`Endpoint::set_in_place_min`), which
    /// the driver copies into each datagram as it takes it: the same bytes on the wire, so
    /// the same run, first copies and retransmissions alike.
    #[test]
    fn payloads_left_in_place_make_the_same_run() {
        let run = |in_place| {
            let link = LinkConfig {
                loss: 0.05,
                jitter_ns: 2_000,
                ..LinkConfig::default()
            };
            let mut p = pair_leaving_in_place(3, link, 256 << 10, in_place);
            write(&mut p, 256 << 10);
            let mut cqs = CqQueues::default();
            p.driver.drive_bounded(&mut cqs, 1_000_000).unwrap();
            let c = cqs.poll(0, p.cq_a).expect("the WRITE completed");
            assert_eq!((c.wr_id, c.status), (7, WcStatus::Success));
            let s = p.driver.ep(0).stats();
            assert!(s.retransmits > 0, "the links lost something");
            assert_eq!(p.driver.ep(1).stats().rx_bad_crc, 0);
            let placed = p.dst.to_vec(0, 256 << 10).unwrap();
            (s.tx_in_place, p.driver.now, p.driver.steps, placed)
        };
        let (gathered, t0, steps0, placed0) = run(None);
        let (in_place, t1, steps1, placed1) = run(Some(64));
        assert_eq!(gathered, 0);
        assert!(in_place > 150, "{in_place}");
        assert_eq!((t0, steps0), (t1, steps1));
        let want: Vec<u8> = (0..256 << 10).map(|i| (i + i / 251) as u8).collect();
        assert!(placed0 == want && placed1 == want, "both land byte exact");
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let run = |seed| {
            let link = LinkConfig {
                loss: 0.02,
                reorder: 0.1,
                reorder_extra_ns: 10_000,
                ..LinkConfig::default()
            };
            let mut p = pair(seed, link, 64 << 10);
            write(&mut p, 64 << 10);
            p.driver
                .drive_bounded(&mut CqQueues::default(), 1_000_000)
                .unwrap();
            (p.driver.now, p.driver.steps, p.driver.net.stats().clone())
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn a_held_host_does_nothing_until_the_hold_ends() {
        for service in [Service::Marked, Service::EveryHost] {
            let mut p = pair(1, LinkConfig::default(), 4096);
            p.driver.cfg.service = service;
            let until = Timestamp::from_micros(500);
            p.driver.hold_until(1, until);
            assert!(p.driver.is_held(1));
            write(&mut p, 4096);
            let mut cqs = CqQueues::default();
            // Before the hold ends, host 1 took in nothing and acknowledged nothing.
            let cq_a = p.cq_a;
            let done = p
                .driver
                .run_until(&mut cqs, Timestamp::from_micros(499), |_, q| {
                    q.len(0, cq_a) > 0
                });
            assert!(!done, "{service:?}");
            assert_eq!(p.driver.ep(1).stats().rx_datagrams, 0, "{service:?}");
            assert!(p.dst.to_vec(0, 4096).unwrap().iter().all(|b| *b == 0));
            p.driver.drive_bounded(&mut cqs, 100_000).unwrap();
            assert!(!p.driver.is_held(1));
            assert!(p.driver.ep(1).stats().rx_datagrams > 0, "{service:?}");
            assert_eq!(cqs.poll(0, p.cq_a).unwrap().status, WcStatus::Success);
            assert!(p.driver.now > until, "{service:?}");
        }
    }

    /// A slow host (per-datagram cost, a small socket buffer, pauses) and a dropped send
    /// work in both service orders: the WRITE still lands, later than on a fast host, the
    /// host dropped arrivals and paused, and exactly the chosen datagram was dropped.
    #[test]
    fn slow_hosts_and_dropped_sends_work_in_both_service_orders() {
        for service in [Service::Marked, Service::EveryHost] {
            let fast = {
                let mut p = pair(4, LinkConfig::default(), 128 << 10);
                p.driver.cfg.service = service;
                write(&mut p, 128 << 10);
                p.driver
                    .drive_bounded(&mut CqQueues::default(), 1_000_000)
                    .unwrap();
                p.driver.now
            };
            let mut p = pair(4, LinkConfig::default(), 128 << 10);
            p.driver.cfg.service = service;
            let model = HostModel {
                cost_ns: 4_000,
                queue: 4,
                pause_every_ns: 100_000,
                pause_ns: 20_000,
            };
            p.driver.set_host_model(1, model, 77);
            // The responder's first datagram (an ACK) never reaches the network.
            p.driver.drop_sent(1, 1, |_| true);
            write(&mut p, 128 << 10);
            let mut cqs = CqQueues::default();
            p.driver.drive_bounded(&mut cqs, 1_000_000).unwrap();
            let c = cqs.poll(0, p.cq_a).expect("the WRITE completed");
            assert_eq!(c.status, WcStatus::Success, "{service:?}");
            let want: Vec<u8> = (0..128 << 10).map(|i| (i + i / 251) as u8).collect();
            assert_eq!(p.dst.to_vec(0, want.len()).unwrap(), want, "{service:?}");
            assert!(
                p.driver.now > fast,
                "{service:?}: {:?} vs {fast:?}",
                p.driver.now
            );
            assert!(p.driver.host_drops(1) > 0, "{service:?}");
            assert!(p.driver.host_pauses(1) > 0, "{service:?}");
            assert_eq!(p.driver.host_drops(0), 0, "{service:?}");
            assert_eq!(p.driver.dropped_sent(), 1, "{service:?}");
            assert_eq!(p.driver.next_event(), None, "{service:?}");
        }
    }

    /// A removed host takes in nothing and does nothing: the requester's WRITE gives up.
    #[test]
    fn a_removed_host_is_gone_from_the_run() {
        for service in [Service::Marked, Service::EveryHost] {
            let mut p = pair(2, LinkConfig::default(), 4096);
            p.driver.cfg.service = service;
            p.driver.remove_host(1);
            assert!(p.driver.is_removed(1));
            write(&mut p, 4096);
            let mut cqs = CqQueues::default();
            p.driver.drive_bounded(&mut cqs, 1_000_000).unwrap();
            assert_eq!(p.driver.ep(1).stats().rx_datagrams, 0, "{service:?}");
            assert_eq!(p.driver.ep(1).stats().tx_datagrams, 0, "{service:?}");
            let c = cqs.poll(0, p.cq_a).expect("the WRITE completed");
            assert_eq!(c.status, WcStatus::RetryExceeded, "{service:?}");
        }
    }

    #[test]
    fn a_run_that_does_not_settle_is_a_livelock_naming_its_seed() {
        let mut p = pair(9, LinkConfig::default(), 64 << 10);
        write(&mut p, 64 << 10);
        let err = p
            .driver
            .drive_bounded(&mut CqQueues::default(), 1)
            .unwrap_err();
        assert_eq!((err.seed, err.steps), (9, 1));
        assert!(err.to_string().contains("seed 9"), "{err}");
        // Only the bound stopped it: with room, the same run settles.
        p.driver
            .drive_bounded(&mut CqQueues::default(), 100_000)
            .unwrap();
        assert_eq!(p.driver.next_event(), None);
    }

    /// The same two-way traffic on `testing::Cluster` (its constructor, QP pairs and regions)
    /// and on a driver built by hand servicing every host: the same virtual times, steps,
    /// network counters, completions and memory.
    #[test]
    fn every_host_service_reproduces_the_cluster_exactly() {
        use crate::testing::Cluster;
        use braid_proto::QpOptions;

        let seed = 11;
        let link = LinkConfig {
            loss: 0.03,
            duplicate: 0.02,
            reorder: 0.1,
            reorder_extra_ns: 8_000,
            jitter_ns: 3_000,
            ..LinkConfig::default()
        };
        let cfg = EndpointConfig::default();
        let len = 96 << 10;
        let wr = |wr_id, rkey, lkey| SendWr {
            wr_id,
            op: SendOp::Write(RemoteAddr { rkey, offset: 0 }),
            sges: vec![Sge {
                lkey,
                offset: 0,
                len: len as u32,
            }],
            signaled: true,
        };
        let fill = |r: &Region, k: u8| {
            let bytes: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(k)).collect();
            r.write(0, &bytes).unwrap();
        };

        let mut cluster = Cluster::new(seed, 2, &cfg, link.clone());
        let (sa, sb) = cluster.connect(0, 1);
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let (ma, mb) = (
            cluster.alloc_mr(&sa, len, access),
            cluster.alloc_mr(&sb, len, access),
        );
        fill(&ma.region, 3);
        fill(&mb.region, 5);
        // Each side writes its region into the other's, twice.
        for (i, (from, qp, to, lkey)) in [
            (0, sa.qp.qpn, &mb, ma.keys.lkey),
            (1, sb.qp.qpn, &ma, mb.keys.lkey),
        ]
        .into_iter()
        .enumerate()
        {
            for k in 0..2 {
                let id = (i * 2 + k) as u64;
                cluster
                    .ep_mut(from)
                    .post_send(qp, wr(id, to.keys.rkey, lkey))
                    .unwrap();
            }
        }
        cluster.drive_bounded(1_000_000);

        let mut net = SimNet::new(seed);
        net.set_default_link(link);
        let config = DriverConfig {
            service: Service::EveryHost,
            ..DriverConfig::default()
        };
        let mut driver = Driver::new(net, config);
        for h in 0..cluster.host_count() {
            let addr = cluster.addr(h);
            let id = driver.net.add_host(addr, cfg.paths);
            let mut c = cfg.clone();
            c.seed = cluster.ep(h).config().seed;
            driver.add_host(id, Endpoint::new(c, addr));
        }
        let mut sides = Vec::new();
        for h in 0..2 {
            let ep = driver.ep_mut(h);
            let pd = ep.alloc_pd();
            let cq = ep.create_cq();
            let qp = ep.create_qp_with(pd, cq, cq, QpOptions::default()).unwrap();
            sides.push((pd, cq, qp));
        }
        driver
            .ep_mut(0)
            .connect(sides[0].2.qpn, sides[1].2)
            .unwrap();
        driver
            .ep_mut(1)
            .connect(sides[1].2.qpn, sides[0].2)
            .unwrap();
        let mut mrs = Vec::new();
        for (h, k) in [(0, 3), (1, 5)] {
            let region = Region::new(len);
            let keys = driver
                .ep_mut(h)
                .register(sides[h].0, region.clone(), access)
                .unwrap();
            fill(&region, k);
            mrs.push((region, keys));
        }
        for (i, (from, to)) in [(0, 1), (1, 0)].into_iter().enumerate() {
            for k in 0..2 {
                let id = (i * 2 + k) as u64;
                let w = wr(id, mrs[to].1.rkey, mrs[from].1.lkey);
                driver.ep_mut(from).post_send(sides[from].2.qpn, w).unwrap();
            }
        }
        let mut cqs = CqQueues::default();
        driver.drive_bounded(&mut cqs, 1_000_000).unwrap();

        assert!(cluster.net.stats().lost > 0 && cluster.net.stats().duplicated > 0);
        assert_eq!((driver.now, driver.steps), (cluster.now, cluster.steps));
        assert_eq!(driver.net.stats(), cluster.net.stats());
        for h in 0..2 {
            let (cq, ccq) = (sides[h].1, [sa.cq, sb.cq][h]);
            let ours: Vec<_> = std::iter::from_fn(|| cqs.poll(h, cq)).collect();
            let theirs: Vec<_> = std::iter::from_fn(|| cluster.poll_cq(h, ccq)).collect();
            assert_eq!(ours.len(), 2);
            assert_eq!(
                ours.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
                theirs
                    .iter()
                    .map(|c| (c.wr_id, c.status))
                    .collect::<Vec<_>>()
            );
            assert_eq!(driver.ep(h).stats(), cluster.ep(h).stats());
        }
        assert_eq!(
            mrs[0].0.to_vec(0, len).unwrap(),
            ma.region.to_vec(0, len).unwrap()
        );
        assert_eq!(
            mrs[1].0.to_vec(0, len).unwrap(),
            mb.region.to_vec(0, len).unwrap()
        );
    }
}
