//! The counters of a QP and the [`QpStats`] snapshot [`Endpoint::qp_stats`](crate::Endpoint::qp_stats) returns.
use crate::hist::RttSummary;
use crate::types::{PathStats, QpState};

/// Counters and state of one QP.
#[derive(Clone, Debug, PartialEq)]
pub struct QpStats {
    /// Current state.
    pub state: QpState,
    /// Smoothed RTT, ns (0 before any sample).
    pub srtt_ns: u64,
    /// Minimum RTT seen, ns (0 before any sample).
    pub min_rtt_ns: u64,
    /// Distribution of the fabric RTT samples (receiver holding time removed): percentiles
    /// from a log-linear histogram (within 1/32 of a recorded value), exact min and max.
    pub rtt: RttSummary,
    /// Current retransmit timeout, ns.
    pub rto_ns: u64,
    /// Congestion controller in use.
    pub cc: &'static str,
    /// Congestion window, bytes.
    pub cwnd_bytes: u64,
    /// Pacing rate, bytes per second, when the controller paces.
    pub pacing_rate: Option<u64>,
    /// CE marks the peer reported for this QP's packets.
    pub ce_marks: u64,
    /// Paths moved to a fresh source port (PLB re-pathing).
    pub repaths: u64,
    /// Spraying weight of each logical path (sums to 1).
    pub path_weights: Vec<f64>,
    /// Bytes in flight.
    pub in_flight_bytes: u64,
    /// Data packets sent (first transmissions).
    pub packets_sent: u64,
    /// Data packets retransmitted.
    pub retransmits: u64,
    /// Retransmit timeouts fired on this QP.
    pub rtos: u64,
    /// Packets declared lost whose original transmission was acknowledged after all.
    pub spurious_losses: u64,
    /// Retransmissions that proved unnecessary: the acknowledgement was for an earlier copy
    /// (Eifel-style echo check), or the peer flagged a duplicate that no earlier proof
    /// explains.
    pub spurious_retransmits: u64,
    /// ACKs from the peer flagging that a duplicate arrived (`FLAG_DUPLICATE`).
    pub duplicates_reported: u64,
    /// Device source port each logical path currently uses (changes on re-pathing).
    pub path_ports: Vec<u16>,
    /// Counters per logical path of this QP.
    pub paths: Vec<PathStats>,
    /// Send work requests posted and not yet completed.
    pub outstanding_sends: usize,
    /// Receive work requests posted and not yet completed.
    pub outstanding_recvs: usize,
}

/// The QP's counters, reported by [`QpStats`].
pub(crate) struct Counters {
    pub(crate) repaths: u64,
    /// CE marks the peer reported for our packets.
    pub(crate) ce_marks: u64,
    pub(crate) packets_sent: u64,
    pub(crate) retransmits: u64,
    pub(crate) rtos: u64,
    pub(crate) spurious_losses: u64,
    pub(crate) spurious_retransmits: u64,
    pub(crate) duplicates_reported: u64,
    /// Counters per logical path (the endpoint's `paths` sums them over QPs).
    pub(crate) path_stats: Vec<PathStats>,
}

impl Counters {
    pub(crate) fn new(paths: u16) -> Counters {
        Counters {
            repaths: 0,
            ce_marks: 0,
            packets_sent: 0,
            retransmits: 0,
            rtos: 0,
            spurious_losses: 0,
            spurious_retransmits: 0,
            duplicates_reported: 0,
            path_stats: vec![PathStats::default(); usize::from(paths)],
        }
    }
}

impl super::Qp {
    /// The snapshot of this QP's state and counters.
    pub(crate) fn stats(&self, cfg: &crate::types::EndpointConfig) -> QpStats {
        QpStats {
            state: self.state,
            srtt_ns: self.rec.rtt.srtt_ns,
            min_rtt_ns: self.rec.rtt.min_ns,
            rtt: self.rec.rtt_hist.summary(),
            rto_ns: self.rto_ns(cfg),
            cc: self.cc.name(),
            cwnd_bytes: self.cc.window(),
            pacing_rate: self.cc.pacing_rate(),
            ce_marks: self.counters.ce_marks,
            repaths: self.counters.repaths,
            path_weights: self.route.paths.last_weights().to_vec(),
            in_flight_bytes: self.rec.in_flight_bytes,
            packets_sent: self.counters.packets_sent,
            retransmits: self.counters.retransmits,
            rtos: self.counters.rtos,
            spurious_losses: self.counters.spurious_losses,
            spurious_retransmits: self.counters.spurious_retransmits,
            duplicates_reported: self.counters.duplicates_reported,
            path_ports: self.route.port_map.clone(),
            paths: self.counters.path_stats.clone(),
            outstanding_sends: self.req.sq.len(),
            outstanding_recvs: self.rsp.rq.len(),
        }
    }
}
