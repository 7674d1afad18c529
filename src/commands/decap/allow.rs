//! `lb decap`'s allow-list: the prefixes of outer sources it unwraps packets from, read from
//! the flags and judged as a whole (a list that covers half of a family is as good as none).

use std::net::IpAddr;

use anyhow::{bail, Result};

use lb::dataplane::decap::ANY_SOURCE;

use super::Args;

/// `10.0.0.0/24`, `fd00::1/128`, `10.0.0.7`: a prefix of outer sources, as (network address,
/// length). Host bits set below the length are refused rather than cleared: `10.0.0.7/8` is
/// more likely a typo for a /32 than a wish to trust a /8.
pub(super) fn source_prefix(s: &str) -> Result<(IpAddr, u8), String> {
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: IpAddr = a.trim().parse().map_err(|_| format!("`{a}` is not an IPv4 or IPv6 address"))?;
    let full: u8 = if addr.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => full,
        Some(l) => match l.trim().parse::<u8>() {
            Ok(n) if n <= full => n,
            _ => return Err(format!("`/{l}`: expected a prefix length from 0 to {full}")),
        },
    };
    let network = match addr {
        // A shift by the whole width (length 0) leaves no bits: checked_shl says None.
        IpAddr::V4(v4) => IpAddr::V4((u32::from(v4) & u32::MAX.checked_shl(32 - len as u32).unwrap_or(0)).into()),
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & u128::MAX.checked_shl(128 - len as u32).unwrap_or(0)).into()),
    };
    if network != addr {
        return Err(format!("{s} has bits set after the first {len}: did you mean {network}/{len} or {addr}/{full}?"));
    }
    Ok((addr, len))
}

/// The address family ("IPv4", "IPv6") more than half of whose addresses `prefixes` cover
/// together, if one is: a /0, 0.0.0.0/1 with 128.0.0.0/1, or any set whose union is that broad,
/// however it is cut up. (A list of second-chance hops that names half of the Internet names its
/// routers too.)
pub(super) fn broad_family(prefixes: &[(IpAddr, u8)]) -> Option<&'static str> {
    for (family, bits, v6) in [("IPv4", 32u32, false), ("IPv6", 128u32, true)] {
        // Each prefix as its first and last address, in order of the first.
        let mut ranges: Vec<(u128, u128)> = prefixes
            .iter()
            .filter(|(addr, _)| addr.is_ipv6() == v6)
            .map(|&(addr, len)| {
                let base = match addr {
                    IpAddr::V4(a) => u128::from(u32::from(a)),
                    IpAddr::V6(a) => u128::from(a),
                };
                let host_bits = bits.saturating_sub(u32::from(len));
                let span = if host_bits >= 128 { u128::MAX } else { (1u128 << host_bits) - 1 };
                (base & !span, (base & !span) | span)
            })
            .collect();
        ranges.sort_unstable();
        // The addresses the union covers, each counted once (saturating: a /0 of IPv6 is 2^128).
        let mut covered = 0u128;
        let mut next = 0u128; // the first address not counted yet
        let mut done = false; // the last address counted
        for (first, end) in ranges {
            if done || end < next {
                continue;
            }
            let from = first.max(next);
            covered = covered.saturating_add((end - from).saturating_add(1));
            if end == u128::MAX {
                done = true;
            } else {
                next = end + 1;
            }
        }
        if covered > 1u128 << (bits - 1) {
            return Some(family);
        }
    }
    None
}

/// The allow-list `a` asks for, or the error that names the flags when it asks for none.
pub(super) fn allowed(a: &Args) -> Result<Vec<(IpAddr, u8)>> {
    if let (true, Some(family)) = (a.second_chance, broad_family(&a.allow_from)) {
        bail!(
            "--second-chance sends packets on only to hosts of the allow-list, and the --allow-from prefixes together \
             name more than half of all {family} addresses: give --allow-from the load balancers' and the backends' prefixes"
        );
    }
    if a.allow_any && a.second_chance {
        bail!(
            "--second-chance sends packets on only to hosts of the allow-list, and --allow-any would make that every \
             host: give --allow-from PREFIX with the load balancers' and the backends' addresses"
        );
    }
    if a.allow_any {
        return Ok(ANY_SOURCE.to_vec());
    }
    if a.allow_from.is_empty() {
        bail!(
            "lb decap needs to know whom to trust: give --allow-from PREFIX (repeatable) with the load balancers' \
             encapsulation sources (their --encap-source, or their interface's address), or --allow-any to unwrap \
             packets from any source"
        );
    }
    Ok(a.allow_from.clone())
}
