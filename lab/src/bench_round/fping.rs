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
        .stderr(Stdio::null());
    process::enter(&mut cmd, from);
    let t = Instant::now();
    let mut child = cmd
        .spawn()
        .context("starting fping (apt-get install fping)")?;
    if let Some(mut stdin) = child.stdin.take() {
        std::io::Write::write_all(&mut stdin, targets.as_bytes())?;
    }
    child.wait()?;
    Ok(t.elapsed())
}
