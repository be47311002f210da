//! The simulated network's packet work in a kernel thread of its own
//! (`--network-thread`).
//!
//! On one machine, a packet sent over a veth is received in the softirq of
//! the task that sent it: the router's forwarding and the peers' answers
//! (SYN-ACKs, echo replies) are then charged to the agent's CPU, as if it
//! did the work of every host it probes. On a real node the agent pays for
//! its own sends, and its receives run in the softirq of whatever the CPU
//! was doing when the NIC interrupted. With GRO on, a veth receives
//! through NAPI; with NAPI threaded, in a kernel thread
//! (`napi/<device>-<id>`). Set on the router's end of the agent's uplink,
//! everything past the agent node's own transmit runs in that thread,
//! whose CPU the benchmark reports beside the agent's, but the peers'
//! echoes: a thread of the lab answers them ([`crate::echo_peers`]).

use std::{ffi::c_void, fs, os::fd::AsRawFd as _, path::Path};

use anyhow::{Context as _, bail};
use health_agent::sys::netns::Netns;

/// `SIOCETHTOOL`, `<linux/sockios.h>`.
const SIOCETHTOOL: libc::c_ulong = 0x8946;
/// `ETHTOOL_SGRO`, `<linux/ethtool.h>`.
const ETHTOOL_SGRO: u32 = 0x2c;
/// `ETHTOOL_STSO`, `<linux/ethtool.h>`: every TSO feature.
const ETHTOOL_STSO: u32 = 0x1f;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// Receives on `dev` (in `ns`) through threaded NAPI: GRO on, then the
/// device's `threaded` attribute set; and TSO off on its peer `peer_dev`
/// (in `peer_ns`), without which a veth passes only the packets of local
/// sockets to NAPI and forwarded ones (the endpoint's probes) to the
/// sender's softirq.
pub(crate) fn threaded(
    (ns, dev): (&Netns, &str),
    (peer_ns, peer_dev): (&Netns, &str),
) -> anyhow::Result<()> {
    peer_ns
        .run(|| ethtool_set(peer_dev, ETHTOOL_STSO, 0))
        .context("entering the namespace of the uplink's sender")?
        .with_context(|| format!("TSO off on {peer_dev}"))?;
    ns.run(|| {
        ethtool_set(dev, ETHTOOL_SGRO, 1)?;
        set_threaded(dev)
    })
    .context("entering the router's namespace")?
    .with_context(|| format!("threaded NAPI on {dev}"))
}

/// One of ethtool's on/off settings `cmd` of `dev`, in the calling
/// thread's namespace.
fn ethtool_set(dev: &str, cmd: u32, data: u32) -> anyhow::Result<()> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").context("a socket for SIOCETHTOOL")?;
    let mut value = EthtoolValue { cmd, data };
    // SAFETY: an all-zero `ifreq` is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = dev.as_bytes();
    if name.len() >= req.ifr_name.len() {
        bail!("device name {dev:?} too long");
    }
    for (to, &from) in req.ifr_name.iter_mut().zip(name) {
        *to = libc::c_char::from_ne_bytes([from]);
    }
    req.ifr_ifru.ifru_data = std::ptr::from_mut(&mut value).cast::<c_void>().cast();
    // SAFETY: `req` names the device and points at `value`, both live for
    // the call; SIOCETHTOOL reads and writes only `value`.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL, &raw mut req) };
    if rc != 0 {
        bail!("SIOCETHTOOL {cmd:#x}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Writes 1 to `dev`'s `threaded` attribute through a sysfs mounted for
/// the calling thread's namespace (a sysfs shows the devices of the
/// namespace it was mounted from), unmounted after.
fn set_threaded(dev: &str) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(health_tests::names::unique("sysfs"));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mounted = nix::mount::mount(
        Some("sysfs"),
        &dir,
        Some("sysfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .with_context(|| format!("mounting sysfs on {}", dir.display()));
    let written = mounted.and_then(|()| {
        let attr = Path::new(&dir).join("class/net").join(dev).join("threaded");
        let r = fs::write(&attr, "1").with_context(|| format!("writing 1 to {}", attr.display()));
        let _ = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH);
        r
    });
    let _ = fs::remove_dir(&dir);
    written
}

/// The CPU the kernel threads of `dev`'s NAPI have used so far.
pub(crate) fn thread_cpu(dev: &str) -> std::time::Duration {
    let prefix = format!("napi/{dev}-");
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let comm = fs::read_to_string(entry.path().join("comm")).ok()?;
            comm.starts_with(&prefix).then_some(pid)
        })
        .filter_map(|pid| crate::usage::cpu_times(pid).ok())
        .map(|(user, system)| user + system)
        .sum()
}
