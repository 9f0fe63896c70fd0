//! eBPF programs and maps through the `bpf()` syscall: no libbpf, no C toolchain, no ELF.
//!
//! Braid needs two small XDP programs, both assembled here from readable instruction lists:
//!
//! - [`steer_udp_port`]: the AF_XDP datapath's program. IPv4/UDP packets to the transport's
//!   port go to the AF_XDP socket of their receive queue (through an XSKMAP); everything
//!   else passes to the kernel untouched.
//! - [`netem`]: a fault injector for test networks. On IPv4/UDP packets it drops a fraction,
//!   marks a fraction of the ECN-capable ones Congestion Experienced (fixing the IP checksum),
//!   or drops everything (black hole), and counts what it did in an array map.
//!
//! Programs are attached with a BPF link ([`XdpLink`]), which detaches when dropped, so a
//! crashed process never leaves a program behind.
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// One eBPF instruction, in the kernel's `struct bpf_insn` layout.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    /// Opcode.
    pub code: u8,
    /// Destination register (low nibble) and source register (high nibble).
    pub regs: u8,
    /// Signed offset.
    pub off: i16,
    /// Signed immediate.
    pub imm: i32,
}

/// A tiny assembler: constructors for the instructions Braid's programs use. Registers are
/// `0..=10` (r10 is the read-only frame pointer).
pub mod asm {
    use super::Insn;

    const ALU64: u8 = 0x07;
    const JMP: u8 = 0x05;
    const K: u8 = 0x00;
    const X: u8 = 0x08;
    const MEM: u8 = 0x60;
    const LDX: u8 = 0x01;
    const ST: u8 = 0x02;
    const STX: u8 = 0x03;

    /// Byte width of a load or store.
    #[derive(Copy, Clone, Debug)]
    pub enum Size {
        /// 1 byte.
        B = 0x10,
        /// 2 bytes.
        H = 0x08,
        /// 4 bytes.
        W = 0x00,
        /// 8 bytes.
        Dw = 0x18,
    }

    fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: (dst & 0xf) | (src << 4),
            off,
            imm,
        }
    }

    /// `dst = imm`.
    pub fn mov_imm(dst: u8, imm: i32) -> Insn {
        insn(ALU64 | 0xb0 | K, dst, 0, 0, imm)
    }
    /// `dst = src`.
    pub fn mov_reg(dst: u8, src: u8) -> Insn {
        insn(ALU64 | 0xb0 | X, dst, src, 0, 0)
    }
    /// `dst += imm`.
    pub fn add_imm(dst: u8, imm: i32) -> Insn {
        insn(ALU64 | K, dst, 0, 0, imm)
    }
    /// `dst += src`.
    pub fn add_reg(dst: u8, src: u8) -> Insn {
        insn(ALU64 | X, dst, src, 0, 0)
    }
    /// `dst &= imm`.
    pub fn and_imm(dst: u8, imm: i32) -> Insn {
        insn(ALU64 | 0x50 | K, dst, 0, 0, imm)
    }
    /// `dst |= imm`.
    pub fn or_imm(dst: u8, imm: i32) -> Insn {
        insn(ALU64 | 0x40 | K, dst, 0, 0, imm)
    }
    /// `dst ^= imm`.
    pub fn xor_imm(dst: u8, imm: i32) -> Insn {
        insn(ALU64 | 0xa0 | K, dst, 0, 0, imm)
    }
    /// `dst >>= imm` (logical).
    pub fn rsh_imm(dst: u8, imm: i32) -> Insn {
        insn(ALU64 | 0x70 | K, dst, 0, 0, imm)
    }
    /// `dst = *(size *)(src + off)`.
    pub fn ldx(size: Size, dst: u8, src: u8, off: i16) -> Insn {
        insn(LDX | MEM | size as u8, dst, src, off, 0)
    }
    /// `*(size *)(dst + off) = src`.
    pub fn stx(size: Size, dst: u8, off: i16, src: u8) -> Insn {
        insn(STX | MEM | size as u8, dst, src, off, 0)
    }
    /// `*(size *)(dst + off) = imm`.
    pub fn st_imm(size: Size, dst: u8, off: i16, imm: i32) -> Insn {
        insn(ST | MEM | size as u8, dst, 0, off, imm)
    }
    /// `lock *(u64 *)(dst + off) += src`.
    pub fn atomic_add64(dst: u8, off: i16, src: u8) -> Insn {
        insn(STX | 0xc0 | Size::Dw as u8, dst, src, off, 0)
    }
    /// `dst = map` (two instructions: a 64-bit immediate load of a map file descriptor).
    pub fn ld_map_fd(dst: u8, fd: i32) -> [Insn; 2] {
        [insn(0x18, dst, 1, 0, fd), insn(0, 0, 0, 0, 0)]
    }
    /// `if dst == imm goto +off`.
    pub fn jeq_imm(dst: u8, imm: i32, off: i16) -> Insn {
        insn(JMP | 0x10 | K, dst, 0, off, imm)
    }
    /// `if dst != imm goto +off`.
    pub fn jne_imm(dst: u8, imm: i32, off: i16) -> Insn {
        insn(JMP | 0x50 | K, dst, 0, off, imm)
    }
    /// `if dst >= imm goto +off` (unsigned).
    pub fn jge_imm(dst: u8, imm: i32, off: i16) -> Insn {
        insn(JMP | 0x30 | K, dst, 0, off, imm)
    }
    /// `if dst > src goto +off` (unsigned).
    pub fn jgt_reg(dst: u8, src: u8, off: i16) -> Insn {
        insn(JMP | 0x20 | X, dst, src, off, 0)
    }
    /// `goto +off`.
    pub fn ja(off: i16) -> Insn {
        insn(JMP, 0, 0, off, 0)
    }
    /// Calls helper number `helper`.
    pub fn call(helper: i32) -> Insn {
        insn(JMP | 0x80, 0, 0, 0, helper)
    }
    /// Returns `r0`.
    pub fn exit() -> Insn {
        insn(JMP | 0x90, 0, 0, 0, 0)
    }
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;

/// `BPF_PROG_TYPE_XDP`.
const PROG_TYPE_XDP: u32 = 6;
/// `BPF_XDP` attach type.
const ATTACH_XDP: u32 = 37;
/// `BPF_MAP_TYPE_ARRAY`.
const MAP_ARRAY: u32 = 2;
/// `BPF_MAP_TYPE_XSKMAP`.
const MAP_XSKMAP: u32 = 17;

/// XDP actions.
const XDP_DROP: i32 = 1;
const XDP_PASS: i32 = 2;

/// Helper function numbers.
const HELPER_MAP_LOOKUP: i32 = 1;
const HELPER_PRANDOM_U32: i32 = 7;
const HELPER_REDIRECT_MAP: i32 = 51;

/// A zeroed `union bpf_attr` large enough for every command used here.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Attr {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Attr {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn name(&mut self, off: usize, name: &str) -> &mut Attr {
        let n = name.len().min(15);
        self.0[off..off + n].copy_from_slice(&name.as_bytes()[..n]);
        self
    }
}

fn sys_bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, writable, 8-aligned buffer of the size passed; the kernel
    // reads (and for some commands writes) only within that size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            attr.0.len() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this new file descriptor to us; nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

/// A BPF map.
#[derive(Debug)]
pub struct Map {
    fd: OwnedFd,
    key_size: usize,
    value_size: usize,
}

impl Map {
    fn create(
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        name: &str,
    ) -> io::Result<Map> {
        let mut a = Attr::new();
        a.u32(0, map_type)
            .u32(4, key_size)
            .u32(8, value_size)
            .u32(12, max_entries)
            .name(28, name);
        let fd = sys_bpf(BPF_MAP_CREATE, &mut a)?;
        Ok(Map {
            fd: owned(fd),
            key_size: key_size as usize,
            value_size: value_size as usize,
        })
    }

    /// An XSKMAP with `entries` slots (one per receive queue): key = queue, value = AF_XDP
    /// socket fd.
    pub fn xskmap(entries: u32) -> io::Result<Map> {
        Map::create(MAP_XSKMAP, 4, 4, entries, "braid_xsks")
    }

    /// An array of `entries` u64 counters.
    pub fn counters(entries: u32) -> io::Result<Map> {
        Map::create(MAP_ARRAY, 4, 8, entries, "braid_counters")
    }

    /// Sets `key` to `value`.
    pub fn update(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        if key.len() != self.key_size || value.len() != self.value_size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "wrong key or value size for this map",
            ));
        }
        let mut a = Attr::new();
        a.u32(0, self.fd.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64)
            .u64(16, value.as_ptr() as u64)
            .u64(24, 0);
        sys_bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(|_| ())
    }

    /// Removes `key`.
    pub fn delete(&self, key: &[u8]) -> io::Result<()> {
        if key.len() != self.key_size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "wrong key size for this map",
            ));
        }
        let mut a = Attr::new();
        a.u32(0, self.fd.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64);
        sys_bpf(BPF_MAP_DELETE_ELEM, &mut a).map(|_| ())
    }

    /// Reads `key` into `value`.
    pub fn lookup(&self, key: &[u8], value: &mut [u8]) -> io::Result<()> {
        if key.len() != self.key_size || value.len() != self.value_size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "wrong key or value size for this map",
            ));
        }
        let mut a = Attr::new();
        a.u32(0, self.fd.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64)
            .u64(16, value.as_mut_ptr() as u64);
        sys_bpf(BPF_MAP_LOOKUP_ELEM, &mut a).map(|_| ())
    }

    /// Reads counter `index` of a [`Map::counters`] map.
    pub fn counter(&self, index: u32) -> io::Result<u64> {
        let mut v = [0u8; 8];
        self.lookup(&index.to_ne_bytes(), &mut v)?;
        Ok(u64::from_ne_bytes(v))
    }

    /// The map's file descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Why the kernel refused a program: the errno and the verifier's log.
#[derive(Debug)]
pub struct LoadError {
    /// The syscall error (EPERM without privileges, EINVAL from the verifier, ...).
    pub error: io::Error,
    /// The verifier log, if it wrote one.
    pub log: String,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BPF program load failed: {}", self.error)?;
        if !self.log.is_empty() {
            write!(f, "; verifier log:\n{}", self.log)?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<LoadError> for io::Error {
    fn from(e: LoadError) -> io::Error {
        io::Error::new(e.error.kind(), e.to_string())
    }
}

/// A loaded XDP program. The maps it uses are kept alive with it.
#[derive(Debug)]
pub struct Program {
    fd: OwnedFd,
    maps: Vec<Map>,
}

impl Program {
    /// Loads an XDP program (GPL-licensed, as the helpers it calls require).
    pub fn load_xdp(insns: &[Insn], name: &str, maps: Vec<Map>) -> Result<Program, LoadError> {
        let license = CString::new("GPL").expect("no NUL");
        let mut log = vec![0u8; 64 * 1024];
        let attempt = |level: u32, log: &mut [u8]| {
            let mut a = Attr::new();
            a.u32(0, PROG_TYPE_XDP)
                .u32(4, insns.len() as u32)
                .u64(8, insns.as_ptr() as u64)
                .u64(16, license.as_ptr() as u64)
                .u32(24, level)
                .u32(28, if level > 0 { log.len() as u32 } else { 0 })
                .u64(
                    32,
                    if level > 0 {
                        log.as_mut_ptr() as u64
                    } else {
                        0
                    },
                )
                .name(48, name)
                .u32(68, ATTACH_XDP);
            sys_bpf(BPF_PROG_LOAD, &mut a)
        };
        match attempt(0, &mut log) {
            Ok(fd) => Ok(Program {
                fd: owned(fd),
                maps,
            }),
            Err(error) => {
                // Load again with the verifier log on, to say why.
                let _ = attempt(1, &mut log);
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                Err(LoadError {
                    error,
                    log: String::from_utf8_lossy(&log[..end]).trim_end().to_string(),
                })
            }
        }
    }

    /// The program's file descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The maps the program uses, in the order given at load.
    pub fn maps(&self) -> &[Map] {
        &self.maps
    }
}

/// How an XDP program is attached.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum XdpMode {
    /// Let the kernel choose: native if the driver supports it, else generic.
    #[default]
    Auto,
    /// In the driver (veth supports it).
    Native,
    /// Generic (SKB) mode: works on every interface, slower.
    Generic,
}

/// An attached XDP program (a BPF link). Dropping it detaches the program.
#[derive(Debug)]
pub struct XdpLink {
    _fd: OwnedFd,
    ifindex: u32,
}

impl XdpLink {
    /// The interface it is attached to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }
}

/// Attaches `prog` to interface `ifindex` through a BPF link.
pub fn attach_xdp(prog: &Program, ifindex: u32, mode: XdpMode) -> io::Result<XdpLink> {
    let flags = match mode {
        XdpMode::Auto => 0,
        XdpMode::Native => 1 << 2,
        XdpMode::Generic => 1 << 1,
    };
    let mut a = Attr::new();
    a.u32(0, prog.fd() as u32)
        .u32(4, ifindex)
        .u32(8, ATTACH_XDP)
        .u32(12, flags);
    let fd = sys_bpf(BPF_LINK_CREATE, &mut a)?;
    Ok(XdpLink {
        _fd: owned(fd),
        ifindex,
    })
}

/// The index of interface `name`.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
    // SAFETY: `c` is a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(i)
    }
}

/// Offsets into a frame: Ethernet (14) + IPv4 without options (20) + UDP (8).
const ETH_TYPE: i16 = 12;
const IP_VER_IHL: i16 = 14;
const IP_TOS: i16 = 15;
const IP_FRAG: i16 = 20;
const IP_PROTO: i16 = 23;
const IP_CSUM: i16 = 24;
const UDP_DPORT: i16 = 36;
const HEADERS: i32 = 42;

/// A big-endian 16-bit wire value as the program sees it after a (little-endian) `ldx H`.
fn wire16(v: u16) -> i32 {
    i32::from(u16::from_le_bytes(v.to_be_bytes()))
}

/// The AF_XDP steering program: IPv4/UDP packets (no IP options, not fragments) to `port` go
/// to the XSKMAP slot of their receive queue; if that slot is empty, or for any other packet,
/// `XDP_PASS`.
///
/// ```text
/// r6 = ctx; r2 = ctx->data; r3 = ctx->data_end
/// if data + 42 > data_end          -> pass
/// if eth.type != IPv4              -> pass
/// if ip.ver_ihl != 0x45            -> pass
/// if ip.proto != UDP               -> pass
/// if ip.frag & 0x3fff != 0         -> pass
/// if udp.dport != port             -> pass
/// return bpf_redirect_map(xsks, ctx->rx_queue_index, XDP_PASS)
/// pass: return XDP_PASS
/// ```
pub fn steer_udp_port(port: u16, queues: u32) -> Result<Program, LoadError> {
    use asm::*;
    let xsks = Map::xskmap(queues.max(1)).map_err(|error| LoadError {
        error,
        log: String::new(),
    })?;
    let mut p = vec![
        mov_reg(6, 1),
        ldx(Size::W, 2, 1, 0),
        ldx(Size::W, 3, 1, 4),
        mov_reg(4, 2),
        add_imm(4, HEADERS),
        jgt_reg(4, 3, 0), // -> pass
        ldx(Size::H, 5, 2, ETH_TYPE),
        jne_imm(5, wire16(0x0800), 0), // -> pass
        ldx(Size::B, 5, 2, IP_VER_IHL),
        jne_imm(5, 0x45, 0), // -> pass
        ldx(Size::B, 5, 2, IP_PROTO),
        jne_imm(5, 17, 0), // -> pass
        ldx(Size::H, 5, 2, IP_FRAG),
        and_imm(5, wire16(0x3fff)),
        jne_imm(5, 0, 0), // -> pass
        ldx(Size::H, 5, 2, UDP_DPORT),
        jne_imm(5, wire16(port), 0), // -> pass
        ja(2),                       // -> redirect
    ];
    let pass = p.len();
    for (i, insn) in p.iter_mut().enumerate() {
        if insn.code & 0x07 == 0x05 && insn.code != asm::ja(0).code {
            insn.off = (pass - i - 1) as i16;
        }
    }
    // pass:
    p.extend([mov_imm(0, XDP_PASS), exit()]);
    // redirect:
    p.extend(ld_map_fd(1, xsks.fd()));
    p.extend([
        ldx(Size::W, 2, 6, 16),
        mov_imm(3, XDP_PASS),
        call(HELPER_REDIRECT_MAP),
        exit(),
    ]);
    Program::load_xdp(&p, "braid_steer", vec![xsks])
}

/// Counter slots of the [`netem`] program's map.
pub mod netem_counter {
    /// IPv4/UDP packets seen.
    pub const SEEN: u32 = 0;
    /// Packets dropped (loss or black hole).
    pub const DROPPED: u32 = 1;
    /// Packets marked CE.
    pub const MARKED: u32 = 2;
}

/// What a [`netem`] program does to IPv4/UDP packets (other traffic always passes).
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct NetemConfig {
    /// Fraction of packets dropped, 0.0 to 1.0 (resolution 1/65536).
    pub loss: f64,
    /// Fraction of ECN-capable packets marked Congestion Experienced, 0.0 to 1.0.
    pub ce_mark: f64,
    /// Drop every packet.
    pub blackhole: bool,
}

fn per_65536(p: f64) -> i32 {
    if p.is_nan() || p <= 0.0 {
        0
    } else {
        (p.min(1.0) * 65536.0).round() as i32
    }
}

/// A fault-injecting XDP program for test networks, with a counter map
/// ([`netem_counter`]) as its first map and a control map as its second: a nonzero value at
/// index 0 black-holes the path at once, without re-attaching ([`set_netem_blackhole`]).
///
/// ```text
/// if not IPv4/UDP (or too short)          -> pass
/// count SEEN
/// if control[0] != 0                      -> count DROPPED; drop
/// if blackhole or prandom16 < loss        -> count DROPPED; drop
/// if ip.tos & 3 in {1, 2} and prandom16 < ce:
///     ip.tos |= 3; fix ip.csum incrementally (RFC 1624); count MARKED
/// pass
/// ```
pub fn netem(cfg: NetemConfig) -> Result<Program, LoadError> {
    netem_program(cfg, true)
}

/// Like [`netem`], but for every IPv4 packet, whatever its protocol (TCP too), so kernel TCP
/// and MPTCP baselines meet the same loss and marks as Braid. Its counters count IPv4
/// packets.
pub fn netem_ipv4(cfg: NetemConfig) -> Result<Program, LoadError> {
    netem_program(cfg, false)
}

fn netem_program(cfg: NetemConfig, udp_only: bool) -> Result<Program, LoadError> {
    use asm::*;
    let counters = Map::counters(3).map_err(|error| LoadError {
        error,
        log: String::new(),
    })?;
    let control = Map::counters(1).map_err(|error| LoadError {
        error,
        log: String::new(),
    })?;
    let cfd = counters.fd();
    let ctl = control.fd();
    let loss = if cfg.blackhole {
        65536
    } else {
        per_65536(cfg.loss)
    };
    let ce = per_65536(cfg.ce_mark);
    // Counts slot `key` (clobbers r0-r5).
    let count = |key: i32| -> Vec<Insn> {
        let mut v = vec![st_imm(Size::W, 10, -4, key), mov_reg(2, 10), add_imm(2, -4)];
        v.extend(ld_map_fd(1, cfd));
        v.extend([
            call(HELPER_MAP_LOOKUP),
            jeq_imm(0, 0, 2),
            mov_imm(1, 1),
            atomic_add64(0, 0, 1),
        ]);
        v
    };
    // r7 = data, r8 = data_end survive helper calls (callee-saved).
    let mut p = vec![
        ldx(Size::W, 7, 1, 0),
        ldx(Size::W, 8, 1, 4),
        mov_reg(4, 7),
        add_imm(4, HEADERS),
        jgt_reg(4, 8, 0), // patched -> pass
        ldx(Size::H, 5, 7, ETH_TYPE),
        jne_imm(5, wire16(0x0800), 0), // patched -> pass
        ldx(Size::B, 5, 7, IP_VER_IHL),
        jne_imm(5, 0x45, 0), // patched -> pass
        ldx(Size::B, 5, 7, IP_PROTO),
        if udp_only {
            jne_imm(5, 17, 0) // patched -> pass
        } else {
            add_imm(5, 0) // any protocol: a no-op in its place keeps the offsets
        },
    ];
    let to_pass: &[usize] = if udp_only { &[4, 6, 8, 10] } else { &[4, 6, 8] };
    p.extend(count(netem_counter::SEEN as i32));
    // The run-time black hole switch.
    let switch_drop: Vec<Insn> = {
        let mut d = count(netem_counter::DROPPED as i32);
        d.extend([mov_imm(0, XDP_DROP), exit()]);
        d
    };
    p.extend([st_imm(Size::W, 10, -4, 0), mov_reg(2, 10), add_imm(2, -4)]);
    p.extend(ld_map_fd(1, ctl));
    p.extend([
        call(HELPER_MAP_LOOKUP),
        jeq_imm(0, 0, 2 + switch_drop.len() as i16),
        ldx(Size::Dw, 1, 0, 0),
        jeq_imm(1, 0, switch_drop.len() as i16),
    ]);
    p.extend(switch_drop);
    // Loss.
    let mut loss_branch = vec![];
    if loss > 0 {
        loss_branch.push(call(HELPER_PRANDOM_U32));
        loss_branch.push(rsh_imm(0, 16));
        let drop_block: Vec<Insn> = {
            let mut d = count(netem_counter::DROPPED as i32);
            d.extend([mov_imm(0, XDP_DROP), exit()]);
            d
        };
        if loss < 65536 {
            loss_branch.push(jge_imm(0, loss, drop_block.len() as i16));
        }
        loss_branch.extend(drop_block);
    }
    p.extend(loss_branch);
    // CE marking of ECT(0)/ECT(1) packets.
    if ce > 0 {
        let mut mark = vec![
            // r9 = the 16-bit word holding version/IHL and TOS, as loaded.
            ldx(Size::H, 9, 7, IP_VER_IHL),
            ldx(Size::B, 5, 7, IP_TOS),
            and_imm(5, 3),
            jeq_imm(5, 0, 0), // patched -> pass (not ECT)
            jeq_imm(5, 3, 0), // patched -> pass (already CE)
            call(HELPER_PRANDOM_U32),
            rsh_imm(0, 16),
            jge_imm(0, ce, 0), // patched -> pass
            // new word: TOS is the second byte, the high byte of the loaded u16.
            mov_reg(4, 9),
            or_imm(4, 0x0300),
            // HC' = ~(~HC + ~m + m'), folded twice.
            ldx(Size::H, 3, 7, IP_CSUM),
            xor_imm(3, 0xffff),
            mov_reg(5, 9),
            xor_imm(5, 0xffff),
            add_reg(3, 5),
            add_reg(3, 4),
            mov_reg(5, 3),
            rsh_imm(5, 16),
            and_imm(3, 0xffff),
            add_reg(3, 5),
            mov_reg(5, 3),
            rsh_imm(5, 16),
            and_imm(3, 0xffff),
            add_reg(3, 5),
            xor_imm(3, 0xffff),
            stx(Size::H, 7, IP_CSUM, 3),
            stx(Size::H, 7, IP_VER_IHL, 4),
        ];
        mark.extend(count(netem_counter::MARKED as i32));
        let base = p.len();
        let end = base + mark.len();
        for i in [3usize, 4, 7] {
            mark[i].off = (end - (base + i) - 1) as i16;
        }
        p.extend(mark);
    }
    // pass:
    let pass = p.len();
    for &i in to_pass {
        p[i].off = (pass - i - 1) as i16;
    }
    p.extend([mov_imm(0, XDP_PASS), exit()]);
    Program::load_xdp(&p, "braid_netem", vec![counters, control])
}

/// Turns the run-time black hole of a [`netem`] program on or off (takes effect at the next
/// packet).
pub fn set_netem_blackhole(prog: &Program, on: bool) -> io::Result<()> {
    let control = prog
        .maps()
        .get(1)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a netem program"))?;
    control.update(&0u32.to_ne_bytes(), &u64::from(on).to_ne_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// Root-only: under CI (CI set) a missing privilege fails the test instead of skipping it.
    fn require_root(test: &str) -> bool {
        if is_root() {
            return true;
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: needs root, and CI runs as root"
        );
        eprintln!("SKIPPED {test}: needs root (CAP_BPF, CAP_NET_ADMIN)");
        false
    }

    #[test]
    fn instruction_encoding_matches_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        let i = asm::ldx(asm::Size::H, 5, 2, 12);
        assert_eq!((i.code, i.regs, i.off), (0x69, 0x25, 12));
        let [lo, hi] = asm::ld_map_fd(1, 7);
        assert_eq!((lo.code, lo.regs, lo.imm, hi.code), (0x18, 0x11, 7, 0));
        assert_eq!(asm::call(51).code, 0x85);
        assert_eq!(asm::exit().code, 0x95);
        assert_eq!(asm::atomic_add64(0, 0, 1).code, 0xdb);
        assert_eq!(wire16(0x0800), 0x0008);
    }

    #[test]
    fn programs_pass_the_verifier() {
        if !require_root("programs_pass_the_verifier") {
            return;
        }
        steer_udp_port(4791, 4).unwrap_or_else(|e| panic!("steer: {e}"));
        for cfg in [
            NetemConfig::default(),
            NetemConfig {
                loss: 0.05,
                ..Default::default()
            },
            NetemConfig {
                ce_mark: 0.2,
                ..Default::default()
            },
            NetemConfig {
                loss: 0.01,
                ce_mark: 1.0,
                blackhole: false,
            },
            NetemConfig {
                blackhole: true,
                ..Default::default()
            },
        ] {
            netem(cfg).unwrap_or_else(|e| panic!("netem {cfg:?}: {e}"));
            netem_ipv4(cfg).unwrap_or_else(|e| panic!("netem_ipv4 {cfg:?}: {e}"));
        }
    }

    /// The UDP-only netem lets TCP through; the IPv4 one drops and counts it too.
    #[test]
    fn netem_ipv4_reaches_tcp_and_netem_does_not() {
        if !require_root("netem_ipv4_reaches_tcp_and_netem_does_not") {
            return;
        }
        in_private_netns(|lo| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let at = listener.local_addr().expect("addr");
            let wait = std::time::Duration::from_millis(300);
            let hole = NetemConfig {
                blackhole: true,
                ..Default::default()
            };
            let prog = netem(hole).expect("load");
            let link = attach_xdp(&prog, lo, XdpMode::Generic).expect("attach");
            std::net::TcpStream::connect_timeout(&at, wait).expect("TCP passes a UDP netem");
            assert_eq!(
                prog.maps()[0].counter(netem_counter::SEEN).expect("read"),
                0
            );
            drop(link);
            let prog = netem_ipv4(hole).expect("load");
            let _link = attach_xdp(&prog, lo, XdpMode::Generic).expect("attach");
            assert!(
                std::net::TcpStream::connect_timeout(&at, wait).is_err(),
                "a TCP connection crossed an IPv4 black hole"
            );
            assert!(
                prog.maps()[0]
                    .counter(netem_counter::DROPPED)
                    .expect("read")
                    > 0
            );
        });
    }

    /// In a private network namespace (only `lo`), attach both programs in generic mode and
    /// see a black-holing netem drop and count real UDP packets, then detach on drop.
    #[test]
    fn netem_drops_and_counts_real_packets_then_detaches() {
        if !require_root("netem_drops_and_counts_real_packets_then_detaches") {
            return;
        }
        in_private_netns(|lo| {
            let rx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
            rx.set_read_timeout(Some(std::time::Duration::from_millis(200)))
                .expect("timeout");
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
            let dest = rx.local_addr().expect("addr");
            let prog = netem(NetemConfig {
                blackhole: true,
                ..Default::default()
            })
            .expect("load");
            let link = attach_xdp(&prog, lo, XdpMode::Generic).expect("attach");
            for _ in 0..20 {
                tx.send_to(b"x", dest).expect("send");
            }
            let mut buf = [0u8; 8];
            assert!(
                rx.recv_from(&mut buf).is_err(),
                "a black hole let a packet through"
            );
            let c = &prog.maps()[0];
            assert_eq!(c.counter(netem_counter::SEEN).expect("read"), 20);
            assert_eq!(c.counter(netem_counter::DROPPED).expect("read"), 20);
            drop(link);
            tx.send_to(b"y", dest).expect("send");
            assert_eq!(rx.recv_from(&mut buf).expect("delivered after detach").0, 1);
            // The run-time switch black-holes a harmless program without re-attaching it.
            let prog = netem(NetemConfig::default()).expect("load");
            let _link = attach_xdp(&prog, lo, XdpMode::Generic).expect("attach");
            tx.send_to(b"z", dest).expect("send");
            assert_eq!(rx.recv_from(&mut buf).expect("passes").0, 1);
            set_netem_blackhole(&prog, true).expect("switch on");
            tx.send_to(b"z", dest).expect("send");
            assert!(
                rx.recv_from(&mut buf).is_err(),
                "the switch let a packet through"
            );
            assert_eq!(
                prog.maps()[0]
                    .counter(netem_counter::DROPPED)
                    .expect("read"),
                1
            );
            set_netem_blackhole(&prog, false).expect("switch off");
            tx.send_to(b"y", dest).expect("send");
            assert_eq!(rx.recv_from(&mut buf).expect("passes again").0, 1);
        });
    }

    /// Brings `lo` up in a fresh network namespace (it starts down).
    fn lo_up() {
        // SAFETY: plain socket syscall; the descriptor is closed below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
        assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        // SAFETY: `req` is a valid ifreq for these ioctls and `fd` a valid socket; the flags
        // union member is the one SIOCGIFFLAGS fills.
        unsafe {
            assert_eq!(libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req), 0);
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            assert_eq!(libc::ioctl(fd, libc::SIOCSIFFLAGS, &mut req), 0);
            libc::close(fd);
        }
    }

    /// In a private namespace, runs `f` with `lo` up and its index.
    fn in_private_netns(f: impl FnOnce(u32) + Send + 'static) {
        std::thread::spawn(move || {
            // SAFETY: unshare affects only this thread's network namespace.
            assert_eq!(
                unsafe { libc::unshare(libc::CLONE_NEWNET) },
                0,
                "unshare: {}",
                io::Error::last_os_error()
            );
            lo_up();
            f(ifindex("lo").expect("lo exists"));
        })
        .join()
        .expect("netns thread");
    }

    /// CE marking rewrites the TOS byte and the IP checksum so the receiving kernel still
    /// accepts the packet; loss drops about the configured fraction; both are counted.
    #[test]
    fn netem_marks_ce_with_a_valid_checksum_and_drops_its_fraction() {
        if !require_root("netem_marks_ce_with_a_valid_checksum_and_drops_its_fraction") {
            return;
        }
        in_private_netns(|lo| {
            use crate::udp::{UdpConfig, UdpDatapath};
            use crate::{Datapath, Ecn, RecvBatch, Transmit};
            let rx = UdpDatapath::bind(UdpConfig::new("127.0.0.1:0".parse().expect("addr"), 1))
                .expect("rx");
            let tx = UdpDatapath::bind(UdpConfig::new("127.0.0.1:0".parse().expect("addr"), 1))
                .expect("tx");
            let send = |n: usize, ecn: Ecn| {
                for _ in 0..n {
                    let t = Transmit {
                        dest: rx.local_addr(),
                        path: 0,
                        ecn,
                        contents: b"ce?",
                    };
                    assert_eq!(tx.send(&[t]).expect("send"), 1);
                }
            };
            let mut batch = RecvBatch::new(64, 64);
            let mut recv_all = || {
                let mut got = Vec::new();
                while let Ok(n) = rx.recv(&mut batch, Some(std::time::Duration::from_millis(100))) {
                    if n == 0 {
                        break;
                    }
                    got.extend(batch.metas[..n].iter().map(|m| m.ecn));
                }
                got
            };
            let prog = netem(NetemConfig {
                ce_mark: 1.0,
                ..Default::default()
            })
            .expect("load");
            let link = attach_xdp(&prog, lo, XdpMode::Generic).expect("attach");
            send(50, Ecn::Ect0);
            send(10, Ecn::NotEct);
            let got = recv_all();
            assert_eq!(
                got.len(),
                60,
                "marked packets must keep a valid IP checksum"
            );
            assert_eq!(got.iter().filter(|&&e| e == Ecn::Ce).count(), 50);
            assert_eq!(
                got.iter().filter(|&&e| e == Ecn::NotEct).count(),
                10,
                "non-ECT packets are never marked"
            );
            assert_eq!(
                prog.maps()[0].counter(netem_counter::MARKED).expect("read"),
                50
            );
            drop(link);

            let prog = netem(NetemConfig {
                loss: 0.25,
                ..Default::default()
            })
            .expect("load");
            let _link = attach_xdp(&prog, lo, XdpMode::Generic).expect("attach");
            send(2000, Ecn::Ect0);
            let got = recv_all().len();
            let dropped = prog.maps()[0]
                .counter(netem_counter::DROPPED)
                .expect("read");
            assert_eq!(got as u64 + dropped, 2000);
            assert!(
                (400..600).contains(&dropped),
                "25% of 2000 dropped, got {dropped}"
            );
        });
    }
}
