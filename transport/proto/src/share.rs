//! How one QP shares its sending side between the two kinds of new packets it has: responses
//! to the peer's requests (READ and atomic responses) and its own requests.
//!
//! ACKs and NAKs are control and always go first (see the QP's `poll_transmit`);
//! retransmissions go next. What is left, the new packets, is shared by deficit round robin
//! (Shreedhar and Varghese): each kind in turn receives [`QUANTUM_BYTES`] of credit and spends
//! it packet by packet; when its credit no longer covers its next packet, the turn passes to
//! the other kind. Both kinds get the same quantum, so while both have work they share the
//! packets' bytes equally, and a request posted behind megabytes of queued READ responses
//! waits for at most one quantum of them (and vice versa). A kind with nothing to send keeps
//! no credit, as in DRR, so a burst after an idle spell cannot claim more than a quantum
//! ahead of the other kind.
//!
//! The scheduler only chooses; it holds no packets, allocates nothing and does O(1) work per
//! packet.

/// Credit, in bytes of packet payload plus [`HEADER_COST_BYTES`], that each kind receives per
/// turn. Several full packets at the default datagram size, so turns do not alternate on every
/// packet (which would double the scheduling work for no fairness gain), and small enough that
/// a request behind a long READ waits for only a few response packets. A packet larger than
/// the quantum still goes out: its turn gets credit for at least that packet.
pub const QUANTUM_BYTES: u32 = 16 * 1024;
/// What a packet costs beyond its payload (headers; a READ request or atomic carries no
/// payload but is not free).
pub const HEADER_COST_BYTES: u32 = 64;

/// The two kinds of new packets a QP sends.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// READ or atomic responses to the peer's requests.
    Response,
    /// This QP's own requests.
    Request,
}

impl Turn {
    fn other(self) -> Turn {
        match self {
            Turn::Response => Turn::Request,
            Turn::Request => Turn::Response,
        }
    }

    fn index(self) -> usize {
        match self {
            Turn::Response => 0,
            Turn::Request => 1,
        }
    }
}

/// Deficit round robin between responses and requests of one QP.
#[derive(Clone, Debug)]
pub(crate) struct SendShare {
    turn: Turn,
    deficit: [u32; 2],
}

impl Default for SendShare {
    fn default() -> SendShare {
        SendShare {
            turn: Turn::Request,
            deficit: [0; 2],
        }
    }
}

impl SendShare {
    /// Which kind sends the next new packet, given the payload length of each kind's next
    /// packet (`None`: nothing of that kind can be sent now). Charges the chosen packet.
    pub(crate) fn pick(&mut self, response: Option<u32>, request: Option<u32>) -> Option<Turn> {
        let cost = |len: u32| len.saturating_add(HEADER_COST_BYTES);
        let (resp, req) = match (response, request) {
            (None, None) => {
                self.deficit = [0; 2];
                return None;
            }
            // Alone: it sends, and neither kind banks credit meanwhile.
            (Some(_), None) | (None, Some(_)) => {
                let t = if response.is_some() {
                    Turn::Response
                } else {
                    Turn::Request
                };
                self.turn = t;
                self.deficit = [0; 2];
                return Some(t);
            }
            (Some(a), Some(b)) => (cost(a), cost(b)),
        };
        let need = |t: Turn| match t {
            Turn::Response => resp,
            Turn::Request => req,
        };
        let t = self.turn;
        if self.deficit[t.index()] < need(t) {
            // Its credit is spent (what is left, less than a packet, stays for its next
            // turn): the other kind's turn, with a fresh quantum (at least one packet's
            // worth, so the turn always sends).
            let o = t.other();
            self.turn = o;
            let d = &mut self.deficit[o.index()];
            *d = d.saturating_add(QUANTUM_BYTES.max(need(o)));
        }
        let t = self.turn;
        self.deficit[t.index()] -= need(t); // covered: checked or just credited above
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alone_a_kind_always_sends() {
        let mut s = SendShare::default();
        for _ in 0..1000 {
            assert_eq!(s.pick(Some(1400), None), Some(Turn::Response));
        }
        assert_eq!(s.pick(None, Some(0)), Some(Turn::Request));
        assert_eq!(s.pick(None, None), None);
    }

    #[test]
    fn a_request_behind_many_responses_waits_at_most_one_quantum() {
        let mut s = SendShare::default();
        for _ in 0..100 {
            s.pick(Some(1400), None);
        }
        // Requests arrive: they go at once (the responses banked no credit), for at most a
        // quantum.
        let mut req_bytes = 0;
        while s.pick(Some(1400), Some(8)) == Some(Turn::Request) {
            req_bytes += 8 + HEADER_COST_BYTES;
            assert!(req_bytes <= QUANTUM_BYTES, "{req_bytes}");
        }
        assert!(req_bytes > 0, "the first request went at once");
        // Then responses, for at most a quantum, before the requests' next turn.
        let mut resp_bytes = 1400 + HEADER_COST_BYTES;
        while s.pick(Some(1400), Some(8)) == Some(Turn::Response) {
            resp_bytes += 1400 + HEADER_COST_BYTES;
            assert!(resp_bytes <= QUANTUM_BYTES, "{resp_bytes}");
        }
    }

    #[test]
    fn both_busy_share_bytes_equally_headers_counted() {
        let mut s = SendShare::default();
        let (mut a, mut b) = (0u64, 0u64);
        for _ in 0..100_000 {
            match s.pick(Some(1400), Some(700)) {
                Some(Turn::Response) => a += u64::from(1400 + HEADER_COST_BYTES),
                Some(Turn::Request) => b += u64::from(700 + HEADER_COST_BYTES),
                None => unreachable!(),
            }
        }
        let diff = a.abs_diff(b);
        assert!(diff <= 2 * u64::from(QUANTUM_BYTES), "{a} vs {b}");
    }

    #[test]
    fn a_packet_larger_than_the_quantum_still_goes() {
        let mut s = SendShare::default();
        let big = QUANTUM_BYTES * 3;
        let mut seen = [0; 2];
        for _ in 0..10 {
            match s.pick(Some(big), Some(big)) {
                Some(t) => seen[t.index()] += 1,
                None => unreachable!(),
            }
        }
        assert_eq!(seen, [5, 5]);
    }
}
