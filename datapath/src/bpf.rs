//! eBPF programs and maps through the `bpf()` syscall: no libbpf, no C toolchain, no ELF.
//!
//! The AF_XDP datapath needs one small XDP program, assembled here from a readable
//! instruction list: [`steer_udp_port`]. IPv4/UDP packets to the transport's port go to the
//! AF_XDP socket of their receive queue (through an XSKMAP); everything else passes to the
//! kernel untouched.
//!
//! The plumbing (the [`asm`] assembler, [`Map`], [`Program`], [`attach_xdp`]) is public so
//! that the test harness (`braid-netns`) can build its own programs, such as its fault
//! injector, on it; nothing test-only lives here.
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
/// `BPF_F_XDP_HAS_FRAGS`: the program handles frames in several buffers.
const PROG_F_XDP_HAS_FRAGS: u32 = 1 << 5;
/// `BPF_XDP` attach type.
const ATTACH_XDP: u32 = 37;
/// `BPF_MAP_TYPE_ARRAY`.
const MAP_ARRAY: u32 = 2;
/// `BPF_MAP_TYPE_XSKMAP`.
const MAP_XSKMAP: u32 = 17;

/// XDP action `XDP_DROP`: the program's return value that drops the packet.
pub const XDP_DROP: i32 = 1;
/// XDP action `XDP_PASS`: the program's return value that hands the packet to the kernel.
pub const XDP_PASS: i32 = 2;

/// Helper function numbers, for [`asm::call`].
pub mod helper {
    /// `bpf_map_lookup_elem`.
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    /// `bpf_get_prandom_u32`.
    pub const GET_PRANDOM_U32: i32 = 7;
    /// `bpf_redirect_map`.
    pub const REDIRECT_MAP: i32 = 51;
}

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
        Self::load_xdp_with(insns, name, maps, false)
    }

    /// [`Program::load_xdp`], declaring the program multi-buffer aware when `frags` is set
    /// (`BPF_F_XDP_HAS_FRAGS`, what the `xdp.frags` section means to libbpf): only such a
    /// program may be attached where frames span several buffers (a jumbo MTU on veth) or
    /// redirect those frames to an AF_XDP socket bound with `XDP_USE_SG`. The program itself
    /// still sees only the first buffer between `data` and `data_end`.
    pub fn load_xdp_with(
        insns: &[Insn],
        name: &str,
        maps: Vec<Map>,
        frags: bool,
    ) -> Result<Program, LoadError> {
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
                .u32(44, if frags { PROG_F_XDP_HAS_FRAGS } else { 0 })
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
const IP_FRAG: i16 = 20;
const IP_PROTO: i16 = 23;
const UDP_DPORT: i16 = 36;
const HEADERS: i32 = 42;

/// A big-endian 16-bit wire value as the program sees it after a (little-endian) `ldx H`.
pub fn wire16(v: u16) -> i32 {
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
    steer_udp_port_with(port, queues, false)
}

/// [`steer_udp_port`], loaded as multi-buffer aware when `frags` is set (see
/// [`Program::load_xdp_with`]): the headers it checks are always in the first buffer.
pub fn steer_udp_port_with(port: u16, queues: u32, frags: bool) -> Result<Program, LoadError> {
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
        call(helper::REDIRECT_MAP),
        exit(),
    ]);
    Program::load_xdp_with(&p, "braid_steer", vec![xsks], frags)
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
    fn the_steering_program_passes_the_verifier() {
        if !require_root("the_steering_program_passes_the_verifier") {
            return;
        }
        steer_udp_port(4791, 4).unwrap_or_else(|e| panic!("steer: {e}"));
        steer_udp_port(4791, 1).unwrap_or_else(|e| panic!("steer: {e}"));
        steer_udp_port_with(4791, 1, true).unwrap_or_else(|e| panic!("steer, frags: {e}"));
    }
}
