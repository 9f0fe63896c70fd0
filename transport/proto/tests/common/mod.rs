//! The set-up the engine's integration tests share: two endpoints, the test playing the
//! network between them.
#![allow(dead_code)] // each test file uses its own part

use std::net::SocketAddr;

use braid_proto::{CqId, Endpoint, EndpointConfig, PdId};

/// Two endpoints, A at 10.0.0.1:4791 and B at 10.0.0.2:4791, each with a protection
/// domain, a completion queue and a QP; the two QPs are connected to each other.
pub struct Connected {
    pub a: Endpoint,
    pub b: Endpoint,
    pub a_addr: SocketAddr,
    pub b_addr: SocketAddr,
    pub pa: PdId,
    pub pb: PdId,
    pub ca: CqId,
    pub cb: CqId,
    /// A's QP number.
    pub qa: u32,
    /// B's QP number.
    pub qb: u32,
}

/// [`Connected`] endpoints configured by `cfg` (A seeded 1, B seeded 2).
pub fn connected(cfg: EndpointConfig) -> Connected {
    let a_addr: SocketAddr = "10.0.0.1:4791".parse().expect("literal");
    let b_addr: SocketAddr = "10.0.0.2:4791".parse().expect("literal");
    let seeded = |seed| EndpointConfig {
        seed,
        ..cfg.clone()
    };
    let mut a = Endpoint::new(seeded(1), a_addr);
    let mut b = Endpoint::new(seeded(2), b_addr);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(), b.create_cq());
    let ia = a.create_qp(pa, ca, ca).expect("qp");
    let ib = b.create_qp(pb, cb, cb).expect("qp");
    a.connect(ia.qpn, ib).expect("connect");
    b.connect(ib.qpn, ia).expect("connect");
    Connected {
        a,
        b,
        a_addr,
        b_addr,
        pa,
        pb,
        ca,
        cb,
        qa: ia.qpn,
        qb: ib.qpn,
    }
}
