//! `cargo xtask run`: two namespaces playing two nodes; node b runs the real
//! `health-agent` binary (inside its namespace), which answers echo in the
//! kernel while b's own stack ignores echo; node a probes it live.

use std::{
    path::PathBuf,
    process::{Child, Command},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use health_agent::responder::read_pinned_stats;

use crate::{
    pinger::{check_reply, ping},
    pins::PinDir,
    topology::{A_IF, A_IP, B_IF, B_IP, TwoNodes},
};

#[derive(Debug, clap::Args)]
pub struct Options {
    /// Probe interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// Stop after this many probes (default: run until Ctrl-C).
    #[arg(long)]
    pub count: Option<u32>,
    /// Attach mode for the agent (default: the agent's own default).
    #[arg(long)]
    pub mode: Option<String>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    install_stop_handler()?;
    let nodes = TwoNodes::new();
    let pins = PinDir::new();
    TwoNodes::sysctl(&nodes.b, "net/ipv4/icmp_echo_ignore_all", "1");
    println!("node a: {A_IP} on {A_IF} in {}", nodes.a.path().display());
    println!(
        "node b: {B_IP} on {B_IF} in {} (kernel echo disabled)",
        nodes.b.path().display()
    );

    let mut agent = Agent::start(&nodes, &pins, opts.mode.as_deref())?;
    // Wait until the agent has pinned its maps and attached.
    let ready = Instant::now() + Duration::from_secs(10);
    while read_pinned_stats(pins.path()).is_err() {
        if let Some(status) = agent.child.try_wait()? {
            bail!("health-agent exited before attaching ({status})");
        }
        if Instant::now() > ready {
            bail!("health-agent did not pin its maps within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    println!(
        "probing {B_IP} from node a every {} ms; Ctrl-C stops and tears down",
        opts.interval_ms
    );

    let mut seq_total = 0u32;
    while !STOP.load(Ordering::Relaxed) && opts.count.is_none_or(|c| seq_total < c) {
        let ex = ping(&nodes.a, B_IP, 0xd3e0, 1, Duration::from_secs(1))?.remove(0);
        let stats = read_pinned_stats(pins.path())?;
        let verdict = match (&ex.rtt, check_reply(&ex, 0xd3e0)) {
            (Some(rtt), Ok(())) => {
                format!("reply in {:.3} ms, checksums ok", rtt.as_secs_f64() * 1e3)
            }
            (_, Err(e)) => format!("FAILED: {e}"),
            (None, Ok(())) => "no reply".into(),
        };
        println!(
            "probe {seq_total:>4}: {verdict:<40} answered in kernel={} passed={} malformed={}",
            stats.answered, stats.passed, stats.malformed
        );
        seq_total += 1;
        sleep_unless_stopped(Duration::from_millis(opts.interval_ms));
    }
    println!("stopping: SIGTERM to health-agent, then removing the namespaces and pins");
    agent.stop()?;
    Ok(())
}

struct Agent {
    child: Child,
}

impl Agent {
    fn start(nodes: &TwoNodes, pins: &PinDir, mode: Option<&str>) -> anyhow::Result<Self> {
        let bin = sibling_binary("health-agent")?;
        let mut cmd = Command::new(&bin);
        cmd.args([
            "responder",
            "run",
            "--iface",
            B_IF,
            "--address",
            &B_IP.to_string(),
        ])
        .args(["--xdp-peer", A_IF, "--xdp-peer-netns"])
        .arg(nodes.a.path())
        .arg("--bpffs-dir")
        .arg(pins.path());
        if let Some(m) = mode {
            cmd.args(["--mode", m]);
        }
        // The agent runs as node b's agent, inside its namespace.
        crate::process::enter(&mut cmd, &nodes.b);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self { child })
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let status = self.child.wait()?;
        println!("health-agent exited: {status}");
        Ok(())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A binary built next to this one (`cargo build` puts them together).
fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let path = me.with_file_name(name);
    if !path.exists() {
        bail!(
            "{} not found: build it first (`cargo build -p health-agent`)",
            path.display()
        );
    }
    Ok(path)
}

fn install_stop_handler() -> anyhow::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(())
}

fn sleep_unless_stopped(total: Duration) {
    let end = Instant::now() + total;
    while !STOP.load(Ordering::Relaxed) && Instant::now() < end {
        std::thread::sleep(
            Duration::from_millis(20).min(end.saturating_duration_since(Instant::now())),
        );
    }
}
