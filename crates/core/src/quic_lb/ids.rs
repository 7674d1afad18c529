//! Server IDs as pool files write them (hex) and as lb derives them when a file does not.

/// The server ID lb gives a backend whose `server_id` the pool file leaves out: the first `len`
/// octets of xxh64 of its identity under seeds 0x51554943 ("QUIC"), + 1, ... (8 octets each),
/// big-endian. A pure function of the identity, so every node and version derives the same ID,
/// and a backend keeps its ID whatever else changes in the pool.
pub fn derived_server_id(identity: &str, len: usize) -> Vec<u8> {
    (0u64..)
        .flat_map(|i| xxhash_rust::xxh64::xxh64(identity.as_bytes(), 0x5155_4943 + i).to_be_bytes())
        .take(len)
        .collect()
}

/// Lowercase hex of `bytes`, without a prefix.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The octets of an even number of hex digits (either case); None for anything else.
pub fn parse_hex(digits: &str) -> Option<Vec<u8>> {
    if digits.is_empty() || digits.len() % 2 != 0 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..digits.len()).step_by(2).map(|i| u8::from_str_radix(&digits[i..i + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_a_function_of_the_identity_alone() {
        // Pinned: a change here moves every derived server ID, which breaks every QUIC
        // connection of every pool that relies on derivation.
        assert_eq!(hex(&derived_server_id("b1", 2)), hex(&derived_server_id("b1", 16)[..2]));
        assert_eq!(derived_server_id("b1", 15).len(), 15);
        assert_ne!(derived_server_id("b1", 4), derived_server_id("b2", 4));
        assert_eq!(hex(&derived_server_id("10.1.0.1", 8)), format!("{:016x}", xxhash_rust::xxh64::xxh64(b"10.1.0.1", 0x5155_4943)));
    }

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        assert_eq!(parse_hex("0A1b"), Some(vec![0x0a, 0x1b]));
        assert_eq!(hex(&[0x0a, 0x1b]), "0a1b");
        for bad in ["", "0", "0g", "0a1", " 0a"] {
            assert_eq!(parse_hex(bad), None, "{bad:?}");
        }
    }
}
