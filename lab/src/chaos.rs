//! `cargo xtask chaos`: faults injected into a local cluster over a
//! 3-member etcd cluster (`health_tests::chaos`), the invariants checked
//! every second; a row per scenario and `N passed, M failed`. Ctrl-C ends
//! the scenario under way and removes everything.

use std::sync::atomic::Ordering;

use anyhow::bail;
use health_tests::chaos::{self, Chaos, SCENARIOS};

#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// One scenario (default: every one, in this order): leader-killed,
    /// agent-cut-off, agent-kill-loop, etcd-down, uplink-flap,
    /// state-read-only, bpffs-unmounted, node-replaced.
    #[arg(long, value_parser = SCENARIOS)]
    pub scenario: Option<String>,
    /// How long an outage lasts: every etcd member stopped, an agent cut
    /// off from etcd.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Nodes of the cluster (2 to 63).
    #[arg(long, default_value_t = 12)]
    pub nodes: usize,
    /// Times the kill loop kills the agent (2 s apart).
    #[arg(long, default_value_t = 50)]
    pub kills: usize,
    /// Times the flapping uplink is deleted and made again, in a minute.
    #[arg(long, default_value_t = 100)]
    pub flaps: usize,
}

extern "C" fn on_signal(_: libc::c_int) {
    chaos::STOP.store(true, Ordering::Relaxed);
}

pub(crate) fn run(opts: &Options) -> anyhow::Result<()> {
    // One node more joins when a node is replaced.
    let most = health_tests::cluster::MAX_NODES - 1;
    if !(2..=most).contains(&opts.nodes) {
        bail!("--nodes {} is out of range (2 to {most})", opts.nodes);
    }
    if opts.seconds == 0 {
        bail!("--seconds must be at least 1");
    }
    if !(1..=6000).contains(&opts.flaps) {
        bail!(
            "--flaps {} is out of range (1 to 6000 in a minute)",
            opts.flaps
        );
    }
    crate::stop::install_with(on_signal)?;
    let scenarios: Vec<&str> = match &opts.scenario {
        Some(s) => vec![s.as_str()],
        None => SCENARIOS.to_vec(),
    };
    println!(
        "chaos: {} nodes (namespaces on a bridge, 198.18.0.0/15) over a 3-member etcd cluster \
         (each member in a namespace of its own)",
        opts.nodes
    );
    println!(
        "the agents run the product's defaults (lease TTL, thresholds, timeouts) except \
         --probe-interval {}: a round a second, so that the checks are quick",
        chaos::PROBE_INTERVAL
    );
    println!(
        "invariants, checked every second: nobody calls an up node down; every agent keeps \
         every node (its last set during an etcd outage); resync within {}s of the fault's end",
        chaos::resync_bound().as_secs()
    );
    let mut bench = Chaos::start(opts.nodes);
    println!(
        "cluster up: logs and sockets in {}",
        bench.cluster.dir.display()
    );
    let options = chaos::Options {
        outage: std::time::Duration::from_secs(opts.seconds),
        kills: opts.kills,
        flaps: opts.flaps,
    };
    let mut rows = Vec::new();
    for s in scenarios {
        if chaos::STOP.load(Ordering::Relaxed) {
            break;
        }
        println!("running {s}...");
        let row = bench.run(s, options);
        print!(
            "{}",
            chaos::render(std::slice::from_ref(&row))
                .lines()
                .take_while(|l| !l.ends_with("failed"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        println!();
        rows.push(row);
    }
    println!("\nstopping the agents and etcd, removing namespaces, pins and files...");
    drop(bench);
    println!();
    print!("{}", chaos::render(&rows));
    let failed = rows.iter().filter(|r| !r.passed()).count();
    if failed > 0 {
        bail!("{failed} scenario(s) failed");
    }
    if chaos::STOP.load(Ordering::Relaxed) {
        bail!("stopped before every scenario ran");
    }
    Ok(())
}
