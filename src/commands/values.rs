//! Parsers of flag values that clap cannot type alone, shared by the commands' arguments.

use std::net::IpAddr;
use std::time::Duration;

/// `10.0.0.1`, `10.1.0.0/24`, `fd00::1`, `fd00:1::/96`: an address and how many leading bits
/// stay fixed (all of them without a length).
pub(crate) fn address_prefix(s: &str) -> Result<(IpAddr, u8), String> {
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: IpAddr = a.trim().parse().map_err(|_| format!("`{a}` is not an IPv4 or IPv6 address"))?;
    let full = if addr.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => full,
        Some(l) => match l.trim().parse::<u8>() {
            Ok(n) if n <= full && n >= full - 32 => n,
            _ => return Err(format!("`/{l}`: expected a prefix length from {} to {full} (at most 32 bits vary)", full - 32)),
        },
    };
    if addr.is_unspecified() || addr.is_multicast() {
        return Err(format!("{addr} is not a unicast address"));
    }
    Ok((addr, len))
}

/// A duration in seconds, such as `5` or `0.5`.
pub(crate) fn seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(v > 0.0 && v <= 86400.0) {
        return Err(format!("{s} seconds is out of range (0, 86400]"));
    }
    Ok(Duration::from_secs_f64(v))
}

pub(crate) fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?} is neither on nor off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_as_they_are_parsed() {
        assert_eq!(address_prefix("10.0.0.1"), Ok(("10.0.0.1".parse().expect("v4"), 32)));
        assert_eq!(address_prefix("fd00:1::/96"), Ok(("fd00:1::".parse().expect("v6"), 96)));
        assert!(address_prefix("fd00:1::/95").is_err(), "at most 32 bits vary");
        assert!(address_prefix("10.0.0.0/33").is_err());
        assert!(address_prefix("0.0.0.0").is_err());
        assert!(address_prefix("ff02::1").is_err());
        assert_eq!(seconds("0.5"), Ok(Duration::from_millis(500)));
        assert!(seconds("0").is_err() && seconds("86401").is_err() && seconds("x").is_err());
        assert_eq!(on_off("off"), Ok(false));
        assert!(on_off("yes").is_err());
    }
}
