//! A small rtnetlink client: the three questions `lb attach` asks the kernel's network stack.
//!
//! - Which way does the kernel route an address (`ip route get`)? L2 direct server return only
//!   works for backends on the interface's own link, with no gateway in between.
//! - Which MAC does the neighbour table hold for an address (`ip neigh`)?
//! - What changes in the neighbour table (`ip monitor neigh`), so a backend whose MAC changes is
//!   re-resolved without polling?
//!
//! Messages are built and parsed by hand: three request types do not earn a dependency, and the
//! layouts are fixed kernel ABI (linux/netlink.h, linux/rtnetlink.h, linux/neighbour.h).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{bind, recv, send, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
pub(crate) const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_REPLACE: u16 = 0x100;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// Who added an address (Linux 6.1+); older kernels ignore it and never report it.
const IFA_PROTO: u16 = 11;
/// lb's mark on the addresses it adds (`ip -d addr` shows `proto 76`); the kernel's own marks
/// are 1 to 3, and nothing else is known to use this one.
pub const ADDR_PROTO_LB: u8 = 76;
/// ifa_flags: no duplicate address detection (an IPv6 VIP is usable at once).
const IFA_F_NODAD: u8 = 0x02;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFF_UP: u32 = 1;

const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
pub(crate) const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
pub(crate) const RTM_NEWNEIGH: u16 = 28;
pub(crate) const RTM_DELNEIGH: u16 = 29;
const RTM_GETNEIGH: u16 = 30;

const RTA_DST: u16 = 1;
pub(crate) const RTA_OIF: u16 = 4;
pub(crate) const RTA_GATEWAY: u16 = 5;
const RTA_VIA: u16 = 18;
pub(crate) const NDA_DST: u16 = 1;
pub(crate) const NDA_LLADDR: u16 = 2;

/// The multicast group of neighbour-table changes (1 << (RTNLGRP_NEIGH - 1)).
const RTMGRP_NEIGH: u32 = 4;
/// The multicast groups of IPv4 and IPv6 routing-table changes.
const RTMGRP_IPV4_ROUTE: u32 = 0x40;
const RTMGRP_IPV6_ROUTE: u32 = 0x400;
pub(crate) const RTM_DELROUTE: u16 = 25;

pub(crate) const AF_INET: u8 = 2;
pub(crate) const AF_INET6: u8 = 10;

/// Route types (rtm_type).
pub const RTN_UNICAST: u8 = 1;
pub const RTN_LOCAL: u8 = 2;

/// Neighbour states (ndm_state).
pub const NUD_INCOMPLETE: u16 = 0x01;
pub const NUD_REACHABLE: u16 = 0x02;
pub const NUD_STALE: u16 = 0x04;
pub const NUD_DELAY: u16 = 0x08;
pub const NUD_PROBE: u16 = 0x10;
pub const NUD_FAILED: u16 = 0x20;
pub const NUD_NOARP: u16 = 0x40;
pub const NUD_PERMANENT: u16 = 0x80;

/// States in which the entry's link-layer address is the one the kernel itself would use.
const NUD_VALID: u16 = NUD_PERMANENT | NUD_NOARP | NUD_REACHABLE | NUD_PROBE | NUD_STALE | NUD_DELAY;

/// The kernel's answer to `ip route get ADDR`.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelRoute {
    /// rtm_type: RTN_UNICAST, RTN_LOCAL, ...
    pub kind: u8,
    /// The output interface.
    pub oif: Option<u32>,
    /// The next hop, when the address is not on a directly connected link.
    pub gateway: Option<IpAddr>,
}

/// One entry of the neighbour table.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighbour {
    pub ifindex: u32,
    pub addr: IpAddr,
    /// Present only in states where the kernel itself would use it.
    pub mac: Option<[u8; 6]>,
    pub state: u16,
    /// True for an RTM_DELNEIGH event.
    pub deleted: bool,
}

/// Human name of a neighbour state, for logs.
pub fn state_name(state: u16) -> &'static str {
    match state {
        NUD_INCOMPLETE => "incomplete",
        NUD_REACHABLE => "reachable",
        NUD_STALE => "stale",
        NUD_DELAY => "delay",
        NUD_PROBE => "probe",
        NUD_FAILED => "failed",
        NUD_NOARP => "noarp",
        NUD_PERMANENT => "permanent",
        _ => "none",
    }
}

pub struct Socket {
    fd: OwnedFd,
    seq: u32,
    /// A route was added or removed since [`Socket::take_route_changes`] was last asked.
    routes_changed: bool,
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Socket {
    /// A socket for requests.
    pub fn open() -> io::Result<Socket> {
        Self::open_groups(0, SockFlag::SOCK_CLOEXEC)
    }

    /// A non-blocking socket that receives every neighbour-table change, and hears of every
    /// routing-table change (see [`Socket::take_route_changes`]).
    pub fn neighbour_events() -> io::Result<Socket> {
        Self::open_groups(RTMGRP_NEIGH | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK)
    }

    /// Whether a route changed since the last call (seen while draining events).
    pub fn take_route_changes(&mut self) -> bool {
        std::mem::take(&mut self.routes_changed)
    }

    fn open_groups(groups: u32, flags: SockFlag) -> io::Result<Socket> {
        let fd = socket(AddressFamily::Netlink, SockType::Raw, flags, SockProtocol::NetlinkRoute)?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
        Ok(Socket { fd, seq: 0, routes_changed: false })
    }

    /// `ip route get ADDR`. Err(ENETUNREACH) and the like when the kernel has no route.
    pub fn route_get(&mut self, addr: IpAddr) -> io::Result<KernelRoute> {
        let (family, bytes) = family_bytes(addr);
        // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type; u32 flags.
        let mut body = vec![family, (bytes.len() * 8) as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        push_attr(&mut body, RTA_DST, &bytes);
        let mut route = None;
        self.request(RTM_GETROUTE, NLM_F_REQUEST, &body, |ty, payload| {
            if ty == RTM_NEWROUTE && payload.len() >= 12 {
                let mut r = KernelRoute { kind: payload[7], oif: None, gateway: None };
                for (at, data) in attrs(&payload[12..]) {
                    match at {
                        RTA_OIF if data.len() >= 4 => r.oif = Some(u32::from_ne_bytes([data[0], data[1], data[2], data[3]])),
                        RTA_GATEWAY => r.gateway = addr_of(family, data),
                        // An IPv4 route via an IPv6 next hop: struct rtvia { family u16; addr }.
                        RTA_VIA if data.len() > 2 => r.gateway = addr_of(data[0], &data[2..]),
                        _ => {}
                    }
                }
                route = Some(r);
            }
        })?;
        route.ok_or_else(|| io::Error::other("the kernel answered without a route"))
    }

    /// Adds `addr` as a host address (/32 or /128) of `ifindex`, marked as lb's
    /// ([`ADDR_PROTO_LB`]); one that is there already is fine (the request replaces it).
    pub fn addr_add(&mut self, ifindex: u32, addr: IpAddr) -> io::Result<()> {
        let mut body = ifaddr(ifindex, addr);
        push_attr(&mut body, IFA_PROTO, &[ADDR_PROTO_LB]);
        self.request(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, &body, |_, _| {})
    }

    /// Removes host address `addr` from `ifindex`; one that is not there is fine.
    pub fn addr_del(&mut self, ifindex: u32, addr: IpAddr) -> io::Result<()> {
        let body = ifaddr(ifindex, addr);
        match self.request(RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, &body, |_, _| {}) {
            Err(e) if matches!(e.raw_os_error(), Some(c) if c == Errno::EADDRNOTAVAIL as i32 || c == Errno::ENOENT as i32) => Ok(()),
            r => r,
        }
    }

    /// The addresses of `ifindex` marked with `proto` (IFA_PROTO), both families. A kernel
    /// older than 6.1 reports no marks, so the answer there is empty.
    pub fn addrs_marked(&mut self, ifindex: u32, proto: u8) -> io::Result<Vec<IpAddr>> {
        let mut out = Vec::new();
        // struct ifaddrmsg: family (any), prefix length, flags, scope, index.
        let mut body = vec![0u8; 8];
        body[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        self.request(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, &body, |ty, payload| {
            if let Some((index, a, p)) = parse_addr(ty, payload) {
                if index == ifindex && p == Some(proto) {
                    out.push(a);
                }
            }
        })?;
        Ok(out)
    }

    /// `ip link add NAME type dummy`.
    pub fn link_add_dummy(&mut self, name: &str) -> io::Result<()> {
        let mut body = vec![0u8; 16]; // struct ifinfomsg
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        push_attr(&mut body, IFLA_IFNAME, &n);
        let mut kind = Vec::new();
        push_attr(&mut kind, IFLA_INFO_KIND, b"dummy");
        push_attr(&mut body, IFLA_LINKINFO | 0x8000, &kind);
        self.request(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, &body, |_, _| {})
    }

    /// `ip link set up` for `ifindex`.
    pub fn link_set_up(&mut self, ifindex: u32) -> io::Result<()> {
        // struct ifinfomsg: family, pad, type, index, flags, change.
        let mut body = vec![0u8; 16];
        body[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
        body[8..12].copy_from_slice(&IFF_UP.to_ne_bytes());
        body[12..16].copy_from_slice(&IFF_UP.to_ne_bytes());
        self.request(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, &body, |_, _| {})
    }

    /// Every neighbour entry on `ifindex`, both families.
    pub fn neighbours(&mut self, ifindex: u32) -> io::Result<Vec<Neighbour>> {
        let mut out = Vec::new();
        // struct ndmsg: family u8, pad u8, pad u16, ifindex i32, state u16, flags u8, type u8.
        let mut body = vec![0u8; 12];
        body[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
        self.request(RTM_GETNEIGH, NLM_F_REQUEST | NLM_F_DUMP, &body, |ty, payload| {
            if let Some(n) = parse_neighbour(ty, payload) {
                // Older kernels ignore the ifindex filter of a dump; filter here too.
                if n.ifindex == ifindex {
                    out.push(n);
                }
            }
        })?;
        Ok(out)
    }

    /// Reads every pending event from a [`Socket::neighbour_events`] socket without blocking.
    /// Err(ENOBUFS) means events were lost: re-read the whole table.
    pub fn drain_neighbour_events(&mut self) -> io::Result<Vec<Neighbour>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(n) => n,
                Err(Errno::EAGAIN) => return Ok(out),
                // Events were lost: routes may have changed too.
                Err(Errno::ENOBUFS) => {
                    self.routes_changed = true;
                    return Err(Errno::ENOBUFS.into());
                }
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            for (ty, _, payload) in messages(&buf[..n]) {
                if ty == RTM_NEWROUTE || ty == RTM_DELROUTE {
                    self.routes_changed = true;
                } else if let Some(nb) = parse_neighbour(ty, payload) {
                    out.push(nb);
                }
            }
        }
    }

    /// Sends one request and feeds every reply message to `each` until the kernel is done.
    pub(crate) fn request(&mut self, ty: u16, flags: u16, body: &[u8], mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut msg = Vec::with_capacity(NLMSG_HDRLEN + body.len());
        msg.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&ty.to_ne_bytes());
        msg.extend_from_slice(&flags.to_ne_bytes());
        msg.extend_from_slice(&seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(body);
        send(self.fd.as_raw_fd(), &msg, MsgFlags::empty())?;

        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "netlink socket closed"));
            }
            for (mty, mseq, payload) in messages(&buf[..n]) {
                if mseq != seq {
                    continue;
                }
                match mty {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let code = payload.get(..4).map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        if code == 0 {
                            return Ok(()); // an acknowledgement
                        }
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                    _ => {
                        each(mty, payload);
                        if !dump {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}

/// struct ifaddrmsg and the address attributes of a host address.
fn ifaddr(ifindex: u32, addr: IpAddr) -> Vec<u8> {
    let (family, bytes) = family_bytes(addr);
    let flags = if family == AF_INET6 { IFA_F_NODAD } else { 0 };
    // family, prefix length, flags, scope (universe), index.
    let mut body = vec![family, (bytes.len() * 8) as u8, flags, 0];
    body.extend_from_slice(&ifindex.to_ne_bytes());
    push_attr(&mut body, IFA_LOCAL, &bytes);
    push_attr(&mut body, IFA_ADDRESS, &bytes);
    body
}

/// An RTM_NEWADDR message: (interface index, address, IFA_PROTO if reported).
fn parse_addr(ty: u16, payload: &[u8]) -> Option<(u32, IpAddr, Option<u8>)> {
    if ty != RTM_NEWADDR || payload.len() < 8 {
        return None;
    }
    let (family, index) = (payload[0], u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]));
    let (mut local, mut address, mut proto) = (None, None, None);
    for (at, data) in attrs(&payload[8..]) {
        match at {
            IFA_LOCAL => local = addr_of(family, data),
            IFA_ADDRESS => address = addr_of(family, data),
            IFA_PROTO => proto = data.first().copied(),
            _ => {}
        }
    }
    // IFA_LOCAL is the address itself; IFA_ADDRESS is the peer's on point-to-point links.
    Some((index, local.or(address)?, proto))
}

pub(crate) fn family_bytes(addr: IpAddr) -> (u8, Vec<u8>) {
    match addr {
        IpAddr::V4(a) => (AF_INET, a.octets().to_vec()),
        IpAddr::V6(a) => (AF_INET6, a.octets().to_vec()),
    }
}

fn addr_of(family: u8, data: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => <[u8; 4]>::try_from(data.get(..4)?).ok().map(|b| IpAddr::V4(Ipv4Addr::from(b))),
        AF_INET6 => <[u8; 16]>::try_from(data.get(..16)?).ok().map(|b| IpAddr::V6(Ipv6Addr::from(b))),
        _ => None,
    }
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

pub(crate) fn push_attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    buf.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    buf.resize(align4(buf.len()), 0);
}

/// The (type, seq, payload) of each message in a datagram; stops at anything malformed.
fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, u32, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        let seq = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]);
        let payload = &buf[NLMSG_HDRLEN..len];
        buf = &buf[align4(len).min(buf.len())..];
        Some((ty, seq, payload))
    })
}

/// The (type, data) of each route attribute; stops at anything malformed.
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        if len < 4 || len > buf.len() {
            return None;
        }
        // The top bits are the nested and byte-order flags.
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        let data = &buf[4..len];
        buf = &buf[align4(len).min(buf.len())..];
        Some((ty, data))
    })
}

fn parse_neighbour(ty: u16, payload: &[u8]) -> Option<Neighbour> {
    if (ty != RTM_NEWNEIGH && ty != RTM_DELNEIGH) || payload.len() < 12 {
        return None;
    }
    let family = payload[0];
    let ifindex = i32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]) as u32;
    let state = u16::from_ne_bytes([payload[8], payload[9]]);
    let mut addr = None;
    let mut mac = None;
    for (at, data) in attrs(&payload[12..]) {
        match at {
            NDA_DST => addr = addr_of(family, data),
            NDA_LLADDR if data.len() == 6 => mac = <[u8; 6]>::try_from(data).ok(),
            _ => {}
        }
    }
    let deleted = ty == RTM_DELNEIGH;
    if deleted || state & NUD_VALID == 0 {
        mac = None;
    }
    Some(Neighbour { ifindex, addr: addr?, mac, state, deleted })
}

/// Makes the kernel resolve `addr`'s MAC: one empty UDP datagram to the discard port. Sending
/// anything to a neighbour without a valid entry starts ARP or neighbour discovery; the
/// datagram itself is harmless (at worst the backend answers with ICMP port unreachable).
pub fn prime(addr: IpAddr) {
    let bind: std::net::SocketAddr = match addr {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    if let Ok(sock) = std::net::UdpSocket::bind(bind) {
        // An error (no route, unreachable) only means the address cannot be resolved yet;
        // the caller keeps reporting it as unresolved.
        let _ = sock.send_to(&[], (addr, 9));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(ty: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(payload);
        m.resize(align4(m.len()), 0);
        m
    }

    fn ndmsg(family: u8, ifindex: i32, state: u16, dst: &[u8], mac: Option<[u8; 6]>) -> Vec<u8> {
        let mut p = vec![family, 0, 0, 0];
        p.extend_from_slice(&ifindex.to_ne_bytes());
        p.extend_from_slice(&state.to_ne_bytes());
        p.extend_from_slice(&[0, 0]);
        push_attr(&mut p, NDA_DST, dst);
        if let Some(m) = mac {
            push_attr(&mut p, NDA_LLADDR, &m);
        }
        p
    }

    #[test]
    fn address_messages_give_the_address_and_who_added_it() {
        let mut marked = ifaddr(7, "10.77.0.100".parse().expect("addr"));
        push_attr(&mut marked, IFA_PROTO, &[ADDR_PROTO_LB]);
        assert_eq!(parse_addr(RTM_NEWADDR, &marked), Some((7, "10.77.0.100".parse().expect("addr"), Some(ADDR_PROTO_LB))));
        let plain = ifaddr(7, "fd00::1".parse().expect("addr"));
        assert_eq!(parse_addr(RTM_NEWADDR, &plain), Some((7, "fd00::1".parse().expect("addr"), None)));
        assert_eq!(parse_addr(RTM_NEWNEIGH, &plain), None);
        assert_eq!(parse_addr(RTM_NEWADDR, &plain[..6]), None);
    }

    #[test]
    fn neighbour_messages_parse_with_state_rules() {
        let mac = [2, 0, 0, 0, 0, 7];
        let mut buf = msg(RTM_NEWNEIGH, 1, &ndmsg(AF_INET, 3, NUD_REACHABLE, &[10, 0, 0, 7], Some(mac)));
        buf.extend(msg(RTM_NEWNEIGH, 1, &ndmsg(AF_INET, 3, NUD_FAILED, &[10, 0, 0, 8], Some(mac))));
        let v6: Ipv6Addr = "fd00::9".parse().unwrap();
        buf.extend(msg(RTM_DELNEIGH, 1, &ndmsg(AF_INET6, 4, NUD_STALE, &v6.octets(), Some(mac))));
        let got: Vec<Neighbour> = messages(&buf).filter_map(|(t, _, p)| parse_neighbour(t, p)).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], Neighbour { ifindex: 3, addr: "10.0.0.7".parse().unwrap(), mac: Some(mac), state: NUD_REACHABLE, deleted: false });
        assert_eq!(got[1].mac, None, "a failed entry's address is not usable");
        assert_eq!(got[2].addr, IpAddr::V6(v6));
        assert!(got[2].deleted && got[2].mac.is_none());
    }

    #[test]
    fn truncated_messages_and_attributes_stop_cleanly() {
        let full = msg(RTM_NEWNEIGH, 1, &ndmsg(AF_INET, 3, NUD_REACHABLE, &[10, 0, 0, 7], Some([1; 6])));
        for len in 0..full.len() {
            // Never panics; a cut message is skipped or its cut attribute ignored.
            let _: Vec<_> = messages(&full[..len]).filter_map(|(t, _, p)| parse_neighbour(t, p)).collect();
        }
        assert_eq!(messages(&full).count(), 1);
    }
}
