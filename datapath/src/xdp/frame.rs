//! Ethernet II + IPv4 + UDP frames, written for transmit and checked on receive.
//!
//! Only the one layout the AF_XDP datapath sends and steers is handled: no VLAN tag, an IPv4
//! header without options, not a fragment.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                 destination MAC (6) ...                       |  0  Ethernet
//! |  ... destination MAC          |       source MAC (6) ...      |
//! |                     ... source MAC                            |
//! |       EtherType 0x0800        |Ver=4|IHL=5|  DSCP     |ECN|     12 / 14  IPv4
//! |         total length          |        identification         |
//! |Flags|    fragment offset      |   TTL=64      |  proto=17     |
//! |        header checksum        |     source address ...        |
//! |   ... source address          |  destination address ...      |
//! |   ... destination address     |        source port            |  34  UDP
//! |       destination port        |          length               |
//! |          checksum             |          payload ...          |  42
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! No function here panics on any input: every offset is checked against the frame length
//! first (`check_len` style), and the accessors after the check index within that length.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::Range;

use crate::Ecn;

/// Byte ranges of the header fields, from the start of the Ethernet frame.
pub(super) mod field {
    use std::ops::Range;

    pub(crate) const ETH_DST: Range<usize> = 0..6;
    pub(crate) const ETH_SRC: Range<usize> = 6..12;
    pub(crate) const ETH_TYPE: Range<usize> = 12..14;
    pub(crate) const IP_VER_IHL: usize = 14;
    pub(crate) const IP_TOS: usize = 15;
    pub(crate) const IP_LEN: Range<usize> = 16..18;
    pub(crate) const IP_ID: Range<usize> = 18..20;
    pub(crate) const IP_FRAG: Range<usize> = 20..22;
    pub(crate) const IP_TTL: usize = 22;
    pub(crate) const IP_PROTO: usize = 23;
    pub(crate) const IP_CSUM: Range<usize> = 24..26;
    pub(crate) const IP_SRC: Range<usize> = 26..30;
    pub(crate) const IP_DST: Range<usize> = 30..34;
    pub(crate) const IP_HEADER: Range<usize> = 14..34;
    pub(crate) const UDP_SPORT: Range<usize> = 34..36;
    pub(crate) const UDP_DPORT: Range<usize> = 36..38;
    pub(crate) const UDP_LEN: Range<usize> = 38..40;
    pub(crate) const UDP_CSUM: Range<usize> = 40..42;
    pub(crate) const UDP_START: usize = 34;
    pub(crate) const PAYLOAD: usize = 42;
}

/// Ethernet (14) + IPv4 (20) + UDP (8) header bytes in front of every payload.
pub(super) const HEADERS: usize = field::PAYLOAD;

/// Bytes of IPv4 + UDP header counted against the MTU.
pub(super) const IP_UDP_HEADERS: usize = 28;

/// Ethernet header bytes, not counted in the MTU.
pub(super) const ETH_HEADER: usize = 14;

const ETHERTYPE_IPV4: u16 = 0x0800;
const IPPROTO_UDP: u8 = 17;
/// Don't Fragment, offset 0.
const IP_FLAGS_DF: u16 = 0x4000;
const IP_TTL: u8 = 64;

/// A 48-bit Ethernet address.
pub(super) type Mac = [u8; 6];

/// The addresses and fields of one outgoing frame (everything but the payload).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct TxHeaders {
    pub(super) dst_mac: Mac,
    pub(super) src_mac: Mac,
    pub(super) src: SocketAddrV4,
    pub(super) dst: SocketAddrV4,
    pub(super) ecn: Ecn,
    pub(super) ip_id: u16,
}

/// Writes headers and `payload` into `frame`; returns the frame length, or `None` if the
/// frame is too short or the payload too large for one IPv4 datagram.
///
/// The UDP checksum is sent as zero, "no checksum" (RFC 768, IPv4 only), as RoCEv2 sends
/// it: every Braid datagram carries its own CRC32C, which receivers check (and [`parse`]
/// does not check the UDP checksum). Computing it was a second pass over each payload,
/// 7% of an AF_XDP sender's CPU at 1472-byte frames.
pub(super) fn write(frame: &mut [u8], h: &TxHeaders, payload: &[u8]) -> Option<usize> {
    let total = HEADERS.checked_add(payload.len())?;
    let ip_len = u16::try_from(total - ETH_HEADER).ok()?;
    let udp_len = ip_len - 20;
    let frame = frame.get_mut(..total)?;
    frame[field::ETH_DST].copy_from_slice(&h.dst_mac);
    frame[field::ETH_SRC].copy_from_slice(&h.src_mac);
    frame[field::ETH_TYPE].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    frame[field::IP_VER_IHL] = 0x45;
    frame[field::IP_TOS] = h.ecn.to_bits();
    frame[field::IP_LEN].copy_from_slice(&ip_len.to_be_bytes());
    frame[field::IP_ID].copy_from_slice(&h.ip_id.to_be_bytes());
    frame[field::IP_FRAG].copy_from_slice(&IP_FLAGS_DF.to_be_bytes());
    frame[field::IP_TTL] = IP_TTL;
    frame[field::IP_PROTO] = IPPROTO_UDP;
    frame[field::IP_CSUM].copy_from_slice(&[0, 0]);
    frame[field::IP_SRC].copy_from_slice(&h.src.ip().octets());
    frame[field::IP_DST].copy_from_slice(&h.dst.ip().octets());
    let ip_csum = !fold(sum(&frame[field::IP_HEADER], 0));
    frame[field::IP_CSUM].copy_from_slice(&ip_csum.to_be_bytes());
    frame[field::UDP_SPORT].copy_from_slice(&h.src.port().to_be_bytes());
    frame[field::UDP_DPORT].copy_from_slice(&h.dst.port().to_be_bytes());
    frame[field::UDP_LEN].copy_from_slice(&udp_len.to_be_bytes());
    frame[field::UDP_CSUM].copy_from_slice(&[0, 0]);
    frame[field::PAYLOAD..].copy_from_slice(payload);
    Some(total)
}

/// Why a received frame was not handed to the user.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Reject {
    /// Shorter than its headers, or its length fields disagree with its size.
    Truncated,
    /// Not IPv4 without options carrying UDP, or a fragment.
    NotUdpV4,
    /// For another IP address or UDP port.
    NotForUs,
    /// IPv4 header checksum wrong.
    BadIpChecksum,
}

/// A received datagram that passed every check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RxDatagram {
    pub(super) src: SocketAddrV4,
    pub(super) ecn: Ecn,
    /// The UDP payload's bytes within the frame.
    pub(super) payload: Range<usize>,
}

fn be16(frame: &[u8], at: Range<usize>) -> u16 {
    let mut b = [0u8; 2];
    b.copy_from_slice(&frame[at]);
    u16::from_be_bytes(b)
}

fn ip4(frame: &[u8], at: Range<usize>) -> Ipv4Addr {
    let mut b = [0u8; 4];
    b.copy_from_slice(&frame[at]);
    Ipv4Addr::from(b)
}

/// Checks a received frame addressed to `local` and locates its payload. Ethernet padding
/// after the IP datagram is ignored (the lengths come from the IP and UDP headers).
///
/// The UDP checksum is not verified: frames from a virtual device (veth, tap) carry only the
/// pseudo-header sum when the sender's stack left the checksum to an offload that never ran
/// (`CHECKSUM_PARTIAL`), and XDP cannot tell such frames apart. Braid's own per-packet CRC32C
/// protects the payload instead. The IPv4 header checksum is always complete and is checked.
pub(super) fn parse(frame: &[u8], local: SocketAddrV4) -> Result<RxDatagram, Reject> {
    if frame.len() < HEADERS {
        return Err(Reject::Truncated);
    }
    // From here on every fixed field lies within `frame`.
    if be16(frame, field::ETH_TYPE) != ETHERTYPE_IPV4
        || frame[field::IP_VER_IHL] != 0x45
        || frame[field::IP_PROTO] != IPPROTO_UDP
        || be16(frame, field::IP_FRAG) & 0x3fff != 0
    {
        return Err(Reject::NotUdpV4);
    }
    if ip4(frame, field::IP_DST) != *local.ip() || be16(frame, field::UDP_DPORT) != local.port() {
        return Err(Reject::NotForUs);
    }
    let ip_len = usize::from(be16(frame, field::IP_LEN));
    if ip_len < IP_UDP_HEADERS || ETH_HEADER + ip_len > frame.len() {
        return Err(Reject::Truncated);
    }
    if fold(sum(&frame[field::IP_HEADER], 0)) != 0xffff {
        return Err(Reject::BadIpChecksum);
    }
    let udp_len = be16(frame, field::UDP_LEN);
    if usize::from(udp_len) < 8 || usize::from(udp_len) > ip_len - 20 {
        return Err(Reject::Truncated);
    }
    let udp_end = field::UDP_START + usize::from(udp_len);
    let src = SocketAddrV4::new(ip4(frame, field::IP_SRC), be16(frame, field::UDP_SPORT));
    Ok(RxDatagram {
        src,
        ecn: Ecn::from_tos(frame[field::IP_TOS]),
        payload: field::PAYLOAD..udp_end,
    })
}

/// Adds `data` as big-endian 16-bit words (a trailing odd byte padded with zero) to `acc`,
/// RFC 1071 style. Summing 32-bit words and folding later gives the same result, because
/// 2^16 is 1 modulo 2^16 - 1.
pub(super) fn sum(data: &[u8], mut acc: u64) -> u64 {
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        acc += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    match *words.remainder() {
        [a] => acc += u64::from(a) << 8,
        [a, b] => acc += u64::from(u16::from_be_bytes([a, b])),
        [a, b, c] => acc += u64::from(u16::from_be_bytes([a, b])) + (u64::from(c) << 8),
        _ => {}
    }
    acc
}

/// Folds a sum into 16 bits with end-around carry.
pub(super) fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers() -> TxHeaders {
        TxHeaders {
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_mac: [2, 0, 0, 0, 0, 1],
            src: "10.0.0.1:4791".parse().unwrap(),
            dst: "10.0.0.2:5000".parse().unwrap(),
            ecn: Ecn::Ect0,
            ip_id: 77,
        }
    }

    /// The checksum of the classic RFC 1071 example words.
    #[test]
    fn checksum_matches_rfc_1071_example() {
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&data, 0)), 0xddf2);
        // Odd lengths pad with zero.
        assert_eq!(fold(sum(&[0xab], 0)), 0xab00);
        assert_eq!(fold(sum(&[1, 2, 3], 0)), 0x0102 + 0x0300);
    }

    #[test]
    fn written_frames_parse_back() {
        let h = headers();
        let local = h.dst;
        for len in [0usize, 1, 2, 3, 17, 1000, 1472] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let mut frame = vec![0u8; 2048];
            let n = write(&mut frame, &h, &payload).unwrap();
            assert_eq!(n, HEADERS + len);
            // Ethernet padding after the datagram is ignored.
            let rx = parse(&frame[..n.max(60)], local).unwrap();
            assert_eq!(rx.src, h.src);
            assert_eq!(rx.ecn, Ecn::Ect0);
            assert_eq!(&frame[rx.payload], &payload[..]);
            assert_eq!(frame[field::IP_FRAG.start], 0x40, "DF set");
            assert_eq!(frame[field::IP_TTL], 64);
            assert_eq!(frame[field::UDP_CSUM], [0, 0], "no UDP checksum (RFC 768)");
        }
    }

    #[test]
    fn damaged_frames_are_rejected_not_panicking() {
        let h = headers();
        let mut frame = vec![0u8; 256];
        let n = write(&mut frame, &h, &[9u8; 100]).unwrap();
        let good = frame[..n].to_vec();
        for cut in 0..n {
            let r = parse(&good[..cut], h.dst);
            assert_eq!(r, Err(Reject::Truncated), "cut at {cut}");
        }
        let mut bad = good.clone();
        bad[field::IP_TTL] ^= 1;
        assert_eq!(parse(&bad, h.dst), Err(Reject::BadIpChecksum));
        // A partial (pseudo-header only) UDP checksum, as veth delivers, is accepted.
        let mut partial = good.clone();
        partial[field::UDP_CSUM].copy_from_slice(&[0x12, 0x34]);
        assert!(parse(&partial, h.dst).is_ok());
        let other_port: SocketAddrV4 = "10.0.0.2:5001".parse().unwrap();
        assert_eq!(parse(&good, other_port), Err(Reject::NotForUs));
        let mut arp = good.clone();
        arp[field::ETH_TYPE].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(parse(&arp, h.dst), Err(Reject::NotUdpV4));
        let mut frag = good.clone();
        frag[field::IP_FRAG].copy_from_slice(&[0x20, 0x00]);
        assert_eq!(parse(&frag, h.dst), Err(Reject::NotUdpV4));
        // Every single-byte corruption is either rejected or still parses inside the frame.
        for at in 0..n {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut f = good.clone();
                f[at] ^= flip;
                if let Ok(rx) = parse(&f, h.dst) {
                    assert!(rx.payload.end <= f.len());
                }
            }
        }
    }

    #[test]
    fn oversized_payloads_are_refused() {
        let mut frame = vec![0u8; 100];
        assert_eq!(write(&mut frame, &headers(), &[0u8; 59]), None);
        assert_eq!(write(&mut frame, &headers(), &[0u8; 58]), Some(100));
    }
}
