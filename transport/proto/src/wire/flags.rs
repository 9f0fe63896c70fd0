//! The flags byte of the common header.
use core::fmt;
use core::ops::{BitOr, BitOrAssign};

/// The flags byte of the common header. Unknown bits are kept as they are (a receiver
/// ignores them), so every byte is a valid `Flags`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(u8);

impl Flags {
    /// No flag set.
    pub const EMPTY: Flags = Flags(0);
    /// This packet is a retransmission.
    pub const RETRANSMIT: Flags = Flags(0x01);
    /// In ACKs: a duplicate data packet arrived since the previous ACK (a retransmission
    /// that was not needed, or network duplication), like TCP's D-SACK. The sender widens
    /// its reordering window on it.
    pub const DUPLICATE: Flags = Flags(0x02);
    /// The packet is sealed (encrypted and authenticated, see [`crate::seal`]); a sealing
    /// sequence number follows the header and a tag ends it.
    pub const SEALED: Flags = Flags(0x04);
    /// In sequenced packets (requests and responses): acknowledge at once instead of
    /// coalescing the acknowledgement with later packets (see `EndpointConfig::ack_every`),
    /// as InfiniBand's AckReq. Set on the last packet of a request that completes on its
    /// acknowledgement (WRITE, SEND), on a packet after which its sender can send nothing
    /// more until it hears from the receiver (its window or SACK span full, or no more
    /// work), and on retransmissions.
    pub const ACK_NOW: Flags = Flags(0x08);

    /// The flags of a flags byte, unknown bits included.
    pub const fn from_bits(bits: u8) -> Flags {
        Flags(bits)
    }

    /// The flags byte.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// `self` with the flags of `other` set too.
    pub const fn union(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }

    /// `self` without the flags of `other`.
    pub const fn difference(self, other: Flags) -> Flags {
        Flags(self.0 & !other.0)
    }
}

impl BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        self.union(rhs)
    }
}

impl BitOrAssign for Flags {
    fn bitor_assign(&mut self, rhs: Flags) {
        *self = self.union(rhs);
    }
}

impl fmt::Display for Flags {
    /// The set flags' names followed by a space each (`rtx dup sealed `), as the packet
    /// printer uses them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (flag, name) in [
            (Flags::RETRANSMIT, "rtx "),
            (Flags::DUPLICATE, "dup "),
            (Flags::SEALED, "sealed "),
            (Flags::ACK_NOW, "ack-now "),
        ] {
            if self.contains(flag) {
                f.write_str(name)?;
            }
        }
        Ok(())
    }
}

/// Common header flag: this packet is a retransmission ([`Flags::RETRANSMIT`]).
pub const FLAG_RETRANSMIT: u8 = Flags::RETRANSMIT.bits();
/// Common header flag, in ACKs: a duplicate arrived ([`Flags::DUPLICATE`]).
pub const FLAG_DUPLICATE: u8 = Flags::DUPLICATE.bits();
/// Common header flag: the packet is sealed ([`Flags::SEALED`]).
pub const FLAG_SEALED: u8 = Flags::SEALED.bits();
/// Common header flag: acknowledge this packet at once ([`Flags::ACK_NOW`]).
pub const FLAG_ACK_NOW: u8 = Flags::ACK_NOW.bits();
