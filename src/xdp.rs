//! Putting an XDP program on an interface, shared by `lb attach` and `lb decap`: the privileges
//! it takes (which `lb status` and `lb detach` check too), the `--xdp-mode` choice with its
//! fallback, and the refusal to touch a program someone else attached.

use anyhow::{bail, Context, Result};

use lb::dataplane::link::{self, Interface, XdpMode};

use crate::log::{log, os_text};

/// `--xdp-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// In the driver: fastest; needs driver support (veth, most 10G+ NICs).
    Native,
    /// In the generic network stack: works everywhere, slower.
    Generic,
    /// Native, falling back to generic with a warning.
    Auto,
}

/// Needs CAP_NET_ADMIN (attaching, netlink), CAP_BPF (loading, maps) and CAP_PERFMON: the
/// verifier refuses the programs without it ("pointer comparison prohibited": they compare
/// packet pointers with NULL, which it allows only to a caller that may see pointers).
/// CAP_SYS_ADMIN stands for CAP_BPF and CAP_PERFMON.
pub(crate) fn check_privileges() -> Result<()> {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| eff & (1u64 << cap) != 0;
    let mut missing = Vec::new();
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_PERFMON");
    }
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !missing.is_empty() {
        bail!(
            "lb attach needs root, or the capabilities {} (missing: {})",
            "CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN",
            missing.join(", ")
        );
    }
    Ok(())
}

pub(crate) fn already_attached(ifc: &Interface, a: Option<link::Attached>) -> anyhow::Error {
    let what = a.map_or(String::new(), |a| format!(" (program id {}, {} mode)", a.prog_id, a.mode));
    anyhow::anyhow!(
        "{} already has an XDP program attached{what}; lb never replaces another program. \
         See it with `bpftool net show dev {}`; detach it yourself if it should go",
        ifc.name,
        ifc.name
    )
}

pub(crate) fn attach_with_mode(prog: std::os::fd::BorrowedFd<'_>, ifc: &Interface, mode: ModeArg) -> Result<link::XdpLink> {
    let refused = |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc_errno) if libc_errno == nix::errno::Errno::EBUSY as i32 || libc_errno == nix::errno::Errno::EEXIST as i32);
    let first = match mode {
        ModeArg::Native | ModeArg::Auto => XdpMode::Native,
        ModeArg::Generic => XdpMode::Generic,
    };
    match link::attach(prog, ifc.ifindex, first) {
        Ok(l) => Ok(l),
        // Someone attached a program since the check above.
        Err(e) if refused(&e) => Err(already_attached(ifc, link::attached(ifc.ifindex).ok().flatten())),
        Err(e) if mode == ModeArg::Auto => {
            log(format!("warning: native XDP is not available on {} ({}); falling back to generic mode, which is slower", ifc.name, os_text(&e)));
            link::attach(prog, ifc.ifindex, XdpMode::Generic)
                .with_context(|| format!("attaching the XDP program to {} in generic mode", ifc.name))
        }
        Err(e) => bail!(
            "attaching the XDP program to {} in {} mode: {} (--xdp-mode generic works on every interface)",
            ifc.name,
            first.as_str(),
            os_text(&e)
        ),
    }
}

/// The program goes with its interface: a serve loop that finds the interface gone (or its name
/// now on another one) stops with this error.
pub(crate) fn ensure_present(ifc: &Interface) -> Result<()> {
    if nix::net::if_::if_nametoindex(ifc.name.as_str()).ok() != Some(ifc.ifindex) {
        bail!("{} went away; the kernel detached the program with it", ifc.name);
    }
    Ok(())
}
