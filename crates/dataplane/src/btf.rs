//! The compiled program's own description of its types (BTF), read from its object without
//! loading it (no root): the tests tie the Rust tables that mirror lb.h's enums (the counters,
//! the route flags) to what the program was compiled with.

use anyhow::{anyhow, Result};
use libbpf_rs::btf::{types, Btf};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::AsRawLibbpf;

/// The members of `enum NAME` in the XDP program (lb.bpf.c), each name with its value, in order.
pub fn enum_members(name: &str) -> Result<Vec<(String, u32)>> {
    let mut storage = std::mem::MaybeUninit::uninit();
    let open = super::skel::LbSkelBuilder::default().open(&mut storage)?;
    // SAFETY: the open object lives as long as `open`, which outlives this borrow.
    let obj = unsafe { open.open_object().as_libbpf_object().as_ref() };
    let btf = Btf::from_bpf_object(obj)?.ok_or_else(|| anyhow!("the program has no BTF"))?;
    let e: types::Enum<'_> = btf.type_by_name(name).ok_or_else(|| anyhow!("no enum {name} in the program's BTF"))?;
    Ok(e.iter()
        .map(|m| (m.name.map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), m.value as u32))
        .collect())
}
