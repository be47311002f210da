//! `health-agent responder ...`

use std::net::Ipv4Addr;

use anyhow::Context as _;
use clap::Subcommand;
use tracing::{info, warn};

use super::{OutputFormat, PinArgs, parse_netns};
use health_agent::{
    datapath::{
        AttachMode, Datapath, EchoStats, Interface, KernelFeatures, TcPolicy, read_pinned_stats,
    },
    sys::netns::Netns,
    sys::signals::wait_for_shutdown,
};

/// Default attach mode: tc ingress (the fastest on a veth, `cargo xtask
/// bench echo`, BENCHMARKS.md) with tcx where the kernel has it, classic tc
/// elsewhere.
fn default_mode() -> anyhow::Result<AttachMode> {
    let kernel = KernelFeatures::probe()?;
    let hook = kernel.choose(TcPolicy::Auto)?;
    info!(kernel = %kernel.release, tcx = kernel.tcx, mode = %hook.echo_mode(), "attach mode chosen");
    Ok(hook.echo_mode())
}

#[derive(Debug, Subcommand)]
pub(crate) enum ResponderCommand {
    /// Load the responder, attach it, and keep it attached until SIGINT/SIGTERM.
    Run {
        /// Interface whose ingress gets the responder.
        #[arg(long)]
        iface: String,
        /// Network namespace of the interface: a name under /run/netns or a path.
        #[arg(long, value_parser = parse_netns)]
        netns: Option<Netns>,
        /// The endpoint address the responder answers for.
        #[arg(long)]
        address: Ipv4Addr,
        /// Default: tc ingress, with tcx where the kernel has it (>= 6.6) and
        /// classic tc (clsact + cls_bpf) elsewhere.
        #[arg(long, value_enum)]
        mode: Option<AttachMode>,
        /// Far end of the veth (xdp-native only): gets an XDP_PASS program so
        /// that XDP_TX replies are delivered.
        #[arg(long)]
        xdp_peer: Option<String>,
        /// Namespace of --xdp-peer (default: the caller's).
        #[arg(long, value_parser = parse_netns, requires = "xdp_peer")]
        xdp_peer_netns: Option<Netns>,
        #[command(flatten)]
        pins: PinArgs,
    },
    /// Print the responder's counters from the pinned maps (works whether or
    /// not an agent is running).
    Stats {
        #[command(flatten)]
        pins: PinArgs,
        #[arg(short, long, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

impl ResponderCommand {
    pub(crate) async fn run(self) -> anyhow::Result<()> {
        match self {
            Self::Run {
                iface,
                netns,
                address,
                mode,
                xdp_peer,
                xdp_peer_netns,
                pins,
            } => {
                let iface = Interface::new(iface, netns);
                let peer = xdp_peer.map(|p| Interface::new(p, xdp_peer_netns));
                let mode = match mode {
                    Some(m) => m,
                    None => default_mode()?,
                };
                if peer.is_some() && mode != AttachMode::XdpNative {
                    anyhow::bail!(
                        "--xdp-peer goes with --mode xdp-native (it gives the veth's far end the XDP program that XDP_TX replies need), not {mode}"
                    );
                }
                run(&iface, address, mode, peer.as_ref(), &pins).await
            }
            Self::Stats { pins, output } => {
                let stats = read_pinned_stats(&pins.dir).with_context(|| {
                    format!(
                        "no responder maps pinned under {} (`health-agent responder run` pins them)",
                        pins.dir.display()
                    )
                })?;
                super::out::print_line(&render_stats(&stats, output)?)?;
                Ok(())
            }
        }
    }
}

async fn run(
    iface: &Interface,
    address: Ipv4Addr,
    mode: AttachMode,
    peer: Option<&Interface>,
    pins: &PinArgs,
) -> anyhow::Result<()> {
    // The pins are this command's alone while it runs: a daemon's (or
    // another responder's) would be replaced by maps of other sizes.
    health_agent::datapath::ensure_pin_dir(&pins.dir)?;
    let _pins_held = health_agent::sys::pidfile::DirLock::take(&pins.dir, "--bpffs-dir")?;
    let mut responder = Datapath::load(&pins.dir)?;
    responder.set_echo_target(iface, address)?;
    if let Err(e) = responder.spawn_log_forwarder() {
        warn!("kernel log records will not be shown: {e}");
    }
    responder.attach_echo(iface, mode, peer)?;
    info!(%address, pins = %pins.dir.display(), "responder running; SIGINT or SIGTERM detaches it");
    let signal = wait_for_shutdown().await?;
    let stats = responder.echo_stats()?;
    info!(
        signal,
        answered = stats.answered,
        passed = stats.passed,
        malformed = stats.malformed,
        "detaching"
    );
    drop(responder);
    Ok(())
}

fn render_stats(stats: &EchoStats, output: OutputFormat) -> anyhow::Result<String> {
    Ok(match output {
        OutputFormat::Json => serde_json::to_string_pretty(stats)?,
        OutputFormat::Table => format!(
            "COUNTER     VALUE\nanswered    {}\npassed      {}\nmalformed   {}",
            stats.answered, stats.passed, stats.malformed
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_render_as_table_and_json() {
        let s = EchoStats {
            answered: 3,
            passed: 2,
            malformed: 1,
        };
        let table = render_stats(&s, OutputFormat::Table).expect("table");
        assert!(
            table.contains("answered    3") && table.contains("malformed   1"),
            "{table}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render_stats(&s, OutputFormat::Json).expect("json"))
                .expect("valid JSON");
        assert_eq!(json["answered"], 3);
        assert_eq!(json["passed"], 2);
        assert_eq!(json["malformed"], 1);
    }
}
