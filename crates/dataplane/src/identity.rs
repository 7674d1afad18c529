//! The identities a pinned data plane is known by: its layout (lb.h's structs, which decide
//! whether a restart adopts the pinned maps as they are) and its program. build.rs computes
//! them at build time through this same file (`#[path]`), so what is tested here is what ships.

/// FNV-1a, 64 bits: enough to tell two builds apart, and no dependency for the build script.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The layout identity of `header` (lb.h's text): the hash of its code, so that rewording a
/// comment or re-indenting does not make a pinned plane look foreign. `layout_test` is the
/// upgrade test's second build, which says it is another layout.
pub fn layout(header: &str, layout_test: bool) -> u64 {
    let id = fnv1a(code_of(header).as_bytes());
    if layout_test {
        fnv1a(&[&id.to_le_bytes()[..], b"layout-test"].concat())
    } else {
        id
    }
}

/// `header` as the compiler sees it: comments dropped, each run of white space one space.
/// (A string literal holding `//` or `/*` would be cut short too. lb.h has none; one added
/// there would have to be kept out of this, since two layouts that hash alike are reused
/// without their BTF being compared.)
fn code_of(header: &str) -> String {
    let mut code = String::with_capacity(header.len());
    let mut rest = header;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
            code.push(' ');
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
            code.push(' ');
        } else {
            code.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    code.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::layout;

    const HEADER: &str = include_str!("bpf/lb.h");

    #[test]
    fn comments_and_spacing_do_not_change_the_layout_but_code_does() {
        let id = layout(HEADER, false);
        let reworded = HEADER.replacen("/*", "/* reworded,", 1).replacen("//", "// another word", 1);
        assert_ne!(reworded, HEADER, "the header has comments of both kinds");
        assert_eq!(layout(&reworded, false), id);
        assert_eq!(layout(&HEADER.replace('\n', "\n\n  \t"), false), id);
        // A field more, or renamed, is another layout; so is the upgrade test's build.
        let grown = HEADER.replacen("struct lb_flow {", "struct lb_flow {\n\t__u32 extra;", 1);
        assert_ne!(grown, HEADER);
        assert_ne!(layout(&grown, false), id);
        assert_ne!(layout(HEADER, true), id);
    }

    /// The build's identity is this function of the header it compiled.
    #[test]
    fn the_build_uses_this_identity() {
        assert_eq!(super::super::LAYOUT_HASH.parse::<u64>().ok(), Some(layout(HEADER, cfg!(feature = "layout-test"))));
    }
}
