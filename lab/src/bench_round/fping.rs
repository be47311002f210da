//! The reference: `fping` over the same ICMP targets, from the agent's
//! node, in the same run.

use std::{
    fmt::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use health_agent::sys::netns::Netns;
use health_tests::process;

use super::peers::peer_ips;

/// Wall time of `fping -i0 -q -t 1000 -r 0` over every node and health IP.
pub(super) fn fping(from: &Netns, n: usize) -> anyhow::Result<Duration> {
    let mut targets = String::with_capacity(n * 32);
    for k in 0..n {
        let (a, b) = peer_ips(k);
        let _ = writeln!(targets, "{a}\n{b}");
    }
    let mut cmd = Command::new("fping");
    cmd.args(["-i0", "-q", "-t", "1000", "-r", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    process::enter(&mut cmd, from);
    let t = Instant::now();
    let mut child = cmd
        .spawn()
        .context("starting fping (apt-get install fping)")?;
    let fed = child.stdin.take().map_or(Ok(()), |mut stdin| {
        std::io::Write::write_all(&mut stdin, targets.as_bytes())
    });
    if let Err(e) = fed {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e).context("writing fping's targets");
    }
    let out = child.wait_with_output().context("waiting for fping")?;
    let took = t.elapsed();
    // 0: every target answered; 1: some did not (the silent peers). Any
    // other status (a bad argument, no raw socket, an unknown target) is
    // no sweep to compare with.
    if !matches!(out.status.code(), Some(0 | 1)) {
        anyhow::bail!(
            "fping failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(took)
}
