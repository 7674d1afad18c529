//! The byte encodings that cross the kernel boundary, mirrored from lb.h: service keys, the VIP
//! index, routes, addresses, names and flags, each read back the way it was written. The structs
//! themselves come from the skeleton's generated `types`; only the encoding of their fields
//! lives here.

use std::net::IpAddr;

use lb_core::config::{Forward, HashMode, Protocol};
use lb_core::plan;

use super::types;

pub(super) const LB_BACKEND_MAC_KNOWN: u8 = types::lb_backend_flags::LB_BACKEND_MAC_KNOWN.0 as u8;
pub(super) const LB_BACKEND_ALIVE: u8 = types::lb_backend_flags::LB_BACKEND_ALIVE.0 as u8;
pub(super) const LB_BACKEND_IN_POOL: u8 = types::lb_backend_flags::LB_BACKEND_IN_POOL.0 as u8;
/// lb_meta's magic number: a pinned lb_meta without it has a format this build does not know.
pub(super) const LB_META_MAGIC: u64 = 0x3130_4154_454d_424c;

/// Views a map key or value from the skeleton's types as bytes.
pub(super) fn bytes_of<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: only used with the skeleton's #[repr(C)] types from lb.h, whose fields are
    // integers and byte arrays with explicit padding, so every byte is initialized; the slice
    // borrows `v` and cannot outlive it.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}

/// Reads a map value of one of the skeleton's plain types (or an integer) from the bytes the kernel returned
/// (for tools and tests that read a running program's maps).
pub fn value_of<T: Copy + Default>(bytes: &[u8]) -> T {
    if bytes.len() < std::mem::size_of::<T>() {
        return T::default();
    }
    // SAFETY: the length was checked above; `T` is a #[repr(C)] skeleton type made of integers
    // and byte arrays, for which every bit pattern is a valid value; read_unaligned copes with
    // any alignment of the kernel's buffer.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) }
}

/// A name as the maps keep it: at most 63 bytes, NUL-padded.
pub(super) fn name_bytes(name: &str) -> [std::ffi::c_char; 64] {
    let mut out = [0 as std::ffi::c_char; 64];
    for (o, b) in out.iter_mut().zip(name.bytes().take(63)) {
        *o = b as std::ffi::c_char;
    }
    out
}

/// A name the maps kept.
pub fn name_text(name: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = name.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The routes-array (and services-map) value of a route.
pub(super) fn route_value(r: &plan::Route) -> types::lb_service {
    types::lb_service {
        key: service_key(r.key.addr, r.key.port, r.key.proto),
        base: r.base,
        slots: r.slots,
        hash_mode: match r.spec.hash {
            HashMode::ClientIp => types::lb_hash_mode::LB_HASH_CLIENT_IP.0,
            HashMode::Flow => types::lb_hash_mode::LB_HASH_FLOW.0,
        },
        // enum lb_service_flags, bit for bit (checked against the program's BTF).
        flags: r.spec.flags.bits(),
        forward: match r.spec.forward {
            Forward::L2 => types::lb_forward::LB_FWD_L2.0,
            Forward::Ipip => types::lb_forward::LB_FWD_IPIP.0,
            Forward::Gue => types::lb_forward::LB_FWD_GUE.0,
        },
        gue_port: r.spec.gue_port.to_be(),
        pad: [0; 2],
        table_len: r.table_len,
    }
}

/// The route a routes-array (or services-map) value holds; None for a key this build cannot read.
pub(super) fn route_of(r: &types::lb_service) -> Option<plan::Route> {
    Some(plan::Route {
        key: key_of(&r.key)?,
        base: r.base,
        slots: r.slots,
        spec: plan::RouteSpec {
            hash: if r.hash_mode == types::lb_hash_mode::LB_HASH_FLOW.0 { HashMode::Flow } else { HashMode::ClientIp },
            forward: match r.forward {
                x if x == types::lb_forward::LB_FWD_IPIP.0 => Forward::Ipip,
                x if x == types::lb_forward::LB_FWD_GUE.0 => Forward::Gue,
                _ => Forward::L2,
            },
            gue_port: u16::from_be(r.gue_port),
            flags: plan::Flags::from_bits_truncate(r.flags),
        },
        table_len: r.table_len,
    })
}

/// The bits of a 32-bit word past its first `fixed` bits, as a mask in network order.
pub(super) fn host_mask_be(fixed: u8, width: u8) -> u32 {
    let fixed = fixed.min(width) as u32;
    let host = if fixed == 0 { u32::MAX } else { u32::MAX.checked_shr(fixed).unwrap_or(0) };
    host.to_be()
}

/// An address as the data plane's four words (network order) and family.
pub fn addr_words(a: IpAddr) -> ([u32; 4], u8) {
    let mut addr = [0u32; 4];
    match a {
        IpAddr::V4(a) => {
            addr[0] = u32::from_ne_bytes(a.octets());
            (addr, types::lb_family::LB_FAMILY_V4.0 as u8)
        }
        IpAddr::V6(a) => {
            for (i, c) in a.octets().chunks(4).enumerate() {
                addr[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            }
            (addr, types::lb_family::LB_FAMILY_V6.0 as u8)
        }
    }
}

/// The address that four words and a family encode (the inverse of [`addr_words`]).
pub(super) fn addr_of(words: &[u32; 4], family: u8) -> Option<IpAddr> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    match family {
        f if f == types::lb_family::LB_FAMILY_V4.0 as u8 => Some(IpAddr::from([bytes[0], bytes[1], bytes[2], bytes[3]])),
        f if f == types::lb_family::LB_FAMILY_V6.0 as u8 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

/// The vip_index entry that the service key (vip, port, protocol) uses: for tests that need keys
/// which share an entry, and for the planner, which allocates the entries.
pub fn vip_index_of(vip: IpAddr, port: u16, proto: Protocol) -> u32 {
    vip_index(&service_key(vip, port, proto))
}

/// The services-map key of (vip, port, protocol), as bytes.
pub fn service_key_bytes(vip: IpAddr, port: u16, proto: Protocol) -> Vec<u8> {
    bytes_of(&service_key(vip, port, proto)).to_vec()
}

/// The vip_index entry of a key: the same function as lb_vip_index() in crates/dataplane/src/bpf/route.h, on the same
/// raw (network-order) words. If the two disagreed, no service would ever be found, which every
/// forwarding packet fixture would catch.
fn vip_index(k: &types::lb_service_key) -> u32 {
    let bits = types::lb_vip_index_layout::LB_VIP_INDEX_BITS.0;
    // The key's last word (port, protocol, family) as its bytes read in native order, like
    // every address word.
    let port = k.port.to_ne_bytes();
    let tail = u32::from_ne_bytes([port[0], port[1], k.proto, k.family]);
    let mut h = k.addr[0] ^ k.addr[1] ^ k.addr[2] ^ k.addr[3] ^ tail;
    h ^= h >> 16;
    h = h.wrapping_mul(0x9e37_79b1);
    h >> (32 - bits)
}

/// The services-map key of (vip, port, protocol).
pub(super) fn service_key(vip: IpAddr, port: u16, proto: Protocol) -> types::lb_service_key {
    let (addr, family) = addr_words(vip);
    types::lb_service_key {
        addr,
        port: port.to_be(),
        proto: match proto {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
        },
        family,
    }
}

/// The (vip, port, protocol) that a services-map key encodes.
pub(super) fn key_of(k: &types::lb_service_key) -> Option<plan::RouteKey> {
    let proto = match k.proto {
        6 => Protocol::Tcp,
        17 => Protocol::Udp,
        _ => return None,
    };
    Some(plan::RouteKey { addr: addr_of(&k.addr, k.family)?, port: u16::from_be(k.port), proto })
}

/// The service key of a route key.
pub(super) fn service_key_of(k: &plan::RouteKey) -> types::lb_service_key {
    service_key(k.addr, k.port, k.proto)
}

#[cfg(test)]
mod route_flags {
    use lb_core::plan::Flags;

    /// The route flags word is lb.h's enum lb_service_flags bit for bit: every member of the
    /// compiled program's enum is a named flag at its value, and every flag is a member.
    #[test]
    fn the_route_flags_are_the_programs_enum() {
        let members = crate::btf::enum_members("lb_service_flags").expect("the program's BTF");
        let named: Vec<(String, u32)> = Flags::NAMED.iter().map(|(f, _, member)| (member.to_string(), f.bits())).collect();
        assert_eq!(named, members);
    }
}
