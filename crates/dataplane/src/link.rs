//! The network interface `lb attach` serves, and attaching the XDP program to it through a BPF
//! link: the kernel detaches a link's program when the last descriptor of the link closes, so a
//! process that dies in any way never leaves a stale program behind.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use anyhow::{bail, Result};
use libbpf_rs::libbpf_sys;
use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;

/// ARPHRD_ETHER: the only link type L2 direct server return can rewrite.
const ARPHRD_ETHER: u16 = 1;

#[derive(Debug, Clone)]
pub struct Interface {
    pub name: String,
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub up: bool,
    /// The addresses configured on it.
    pub addresses: Vec<IpAddr>,
}

/// Looks `name` up; a clear error names the interfaces that do exist.
pub fn interface(name: &str) -> Result<Interface> {
    let mut found: Option<(u32, u16, Option<[u8; 6]>, bool)> = None;
    let mut addresses = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for ifa in getifaddrs()? {
        if !names.contains(&ifa.interface_name) {
            names.push(ifa.interface_name.clone());
        }
        if ifa.interface_name != name {
            continue;
        }
        let Some(addr) = ifa.address else { continue };
        if let Some(link) = addr.as_link_addr() {
            found = Some((link.ifindex() as u32, link.hatype(), link.addr(), ifa.flags.contains(InterfaceFlags::IFF_UP)));
        } else if let Some(a) = addr.as_sockaddr_in() {
            addresses.push(IpAddr::V4(a.ip()));
        } else if let Some(a) = addr.as_sockaddr_in6() {
            addresses.push(IpAddr::V6(a.ip()));
        }
    }
    let Some((ifindex, hatype, mac, up)) = found else {
        bail!("no such interface `{name}` (this network namespace has: {})", names.join(", "));
    };
    let mac = match mac {
        Some(m) if hatype == ARPHRD_ETHER => m,
        _ => bail!(
            "`{name}` is not an Ethernet interface (link type {hatype}); L2 direct server return rewrites Ethernet addresses, so lb needs an Ethernet link"
        ),
    };
    Ok(Interface { name: name.to_string(), ifindex, mac, up, addresses })
}

/// The current MAC of the interface with index `ifindex`, or None when it is gone or not Ethernet.
/// Read by index, not name, so a renamed interface is still found; through netlink
/// (getifaddrs), so it is always this network namespace's interface.
pub fn current_mac(ifindex: u32) -> Option<[u8; 6]> {
    getifaddrs().ok()?.find_map(|ifa| {
        let link = *ifa.address?.as_link_addr()?;
        (link.ifindex() as u32 == ifindex && link.hatype() == ARPHRD_ETHER).then(|| link.addr()).flatten()
    })
}

/// The interface that holds `addr` in this namespace, if any (for "this VIP arrives elsewhere").
pub fn owner_of(addr: IpAddr) -> Option<String> {
    getifaddrs().ok()?.find_map(|ifa| {
        let a = ifa.address?;
        let held = a.as_sockaddr_in().map(|s| IpAddr::V4(s.ip())).or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))?;
        (held == addr).then_some(ifa.interface_name)
    })
}

pub fn mac_text(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// How the program runs on the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver, before any socket buffer exists: the fast path.
    Native,
    /// After the kernel built a socket buffer: works on every interface, slower.
    Generic,
}

impl XdpMode {
    pub fn as_str(self) -> &'static str {
        match self {
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
        }
    }

    fn flag(self) -> u32 {
        match self {
            XdpMode::Native => libbpf_sys::XDP_FLAGS_DRV_MODE,
            XdpMode::Generic => libbpf_sys::XDP_FLAGS_SKB_MODE,
        }
    }
}

/// An XDP program some other owner attached to the interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    pub prog_id: u32,
    pub mode: &'static str,
}

/// The XDP program already attached to `ifindex`, in any mode.
pub fn attached(ifindex: u32) -> Result<Option<Attached>> {
    let mut opts = libbpf_sys::bpf_xdp_query_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_xdp_query_opts>() as _,
        ..Default::default()
    };
    // SAFETY: `opts` is a properly sized, initialized bpf_xdp_query_opts that lives across the
    // call; libbpf only writes into it.
    let rc = unsafe { libbpf_sys::bpf_xdp_query(ifindex as i32, 0, &mut opts) };
    if rc < 0 {
        return Err(io::Error::from_raw_os_error(-rc).into());
    }
    let found = [(opts.drv_prog_id, "native"), (opts.skb_prog_id, "generic"), (opts.hw_prog_id, "offloaded")]
        .into_iter()
        .find(|&(id, _)| id != 0)
        .or((opts.prog_id != 0).then_some((opts.prog_id, "unknown")));
    Ok(found.map(|(prog_id, mode)| Attached { prog_id, mode }))
}

/// A BPF link of `prog` to interface `ifindex` at hook `attach_type`, with `flags`: the link's
/// descriptor (closing it detaches the program). The XDP attachment below, and the probes' TCX
/// egress programs (probe_path.rs).
pub(crate) fn link_create(prog: BorrowedFd<'_>, ifindex: u32, attach_type: libbpf_sys::bpf_attach_type, flags: u32) -> io::Result<OwnedFd> {
    let opts = libbpf_sys::bpf_link_create_opts { sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _, flags, ..Default::default() };
    // SAFETY: plain descriptors and a properly sized, initialized options struct that outlives
    // the call.
    let rc = unsafe { libbpf_sys::bpf_link_create(prog.as_raw_fd(), ifindex as i32, attach_type, &opts) };
    if rc < 0 {
        return Err(io::Error::from_raw_os_error(-rc));
    }
    // SAFETY: a non-negative return of bpf_link_create is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc) })
}

/// A program attached through a BPF link. Dropping it detaches the program.
pub struct XdpLink {
    fd: OwnedFd,
    pub mode: XdpMode,
    pub link_id: u32,
    pub prog_id: u32,
}

impl AsFd for XdpLink {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Attaches `prog` to `ifindex` in `mode`. Never replaces a program that is already there: the
/// kernel refuses a link on an interface that has one (EBUSY / EEXIST).
pub fn attach(prog: BorrowedFd<'_>, ifindex: u32, mode: XdpMode) -> io::Result<XdpLink> {
    let fd = link_create(prog, ifindex, libbpf_sys::BPF_XDP, mode.flag())?;
    let mut info = libbpf_sys::bpf_link_info::default();
    let mut len = std::mem::size_of::<libbpf_sys::bpf_link_info>() as u32;
    // SAFETY: `info` is a writable bpf_link_info and `len` its size; the kernel writes at most
    // `len` bytes.
    let rc = unsafe { libbpf_sys::bpf_link_get_info_by_fd(fd.as_raw_fd(), &mut info, &mut len) };
    let (link_id, prog_id) = if rc == 0 { (info.id, info.prog_id) } else { (0, 0) };
    Ok(XdpLink { fd, mode, link_id, prog_id })
}
