//! `cargo xtask run`: a local cluster on this machine. N namespaces play
//! nodes on a bridge in 198.18.0.0/15 and/or `2001:2::/48` (`--ip-family`),
//! each running the real
//! `health-agent daemon` with its own health endpoint, discovering the
//! others through a shared nodes file or an etcd run as in production (TLS
//! with a CA made at start, authentication with a user and a role per node
//! that writes only that node's keys); a live status view refreshes until
//! Ctrl-C, which stops the agents and removes everything.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::bail;

use health_tests::{
    cluster::{Cluster, ETCD_ENDPOINT, ETCD_IP, ETCD_PREFIX, Family, Settings},
    etcd::NodeGrants,
};

#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// Number of nodes (1 to 64).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Probe interval of the agents.
    #[arg(long, default_value = "2s")]
    pub probe_interval: String,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Print every view below the previous one instead of redrawing.
    #[arg(long)]
    pub no_redraw: bool,
    /// Discover nodes through a local etcd (started in the fabric
    /// namespace, with TLS and a user per node) instead of the nodes file.
    #[arg(long, value_parser = ["file", "etcd"], default_value = "file")]
    pub kvstore: String,
    /// How endpoints reach peers: routes only, or masquerade (SNAT to the
    /// node IP in BPF) toward node IPs.
    #[arg(long, value_parser = ["routed", "masquerade"], default_value = "routed")]
    pub routing: String,
    /// Address families of nodes and health endpoints: IPv4 only, IPv6
    /// only, or both (every peer probed over both).
    #[arg(long, value_parser = ["ipv4", "ipv6", "dual"], default_value = "dual")]
    pub ip_family: String,
}

pub(crate) fn run(opts: &Options) -> anyhow::Result<()> {
    let most = health_tests::cluster::MAX_NODES;
    if !(1..=most).contains(&opts.nodes) {
        bail!("--nodes {} is out of range (1 to {most})", opts.nodes);
    }
    health_agent::util::duration::parse(&opts.probe_interval)
        .map_err(|e| anyhow::anyhow!("--probe-interval: {e}"))?;
    let family = family(opts)?;
    println!(
        "starting a {}-node cluster (namespaces on a bridge, {})...",
        opts.nodes,
        match family {
            Family::V4 => "198.18.0.0/15",
            Family::V6 => "2001:2::/48",
            Family::Dual => "198.18.0.0/15 and 2001:2::/48",
        }
    );
    let interval: &'static str = Box::leak(opts.probe_interval.clone().into_boxed_str());
    let mut settings = Settings::local(
        opts.nodes,
        interval,
        opts.kvstore == "etcd",
        opts.routing == "masquerade",
        family,
    );
    // The host's port for node 1's page, taken first: the agents answer
    // to the address a browser on the host names.
    let page_port = page_port(&mut settings);
    let mut cluster = Cluster::start(&settings);
    println!("agents' logs and sockets: {}", cluster.dir.display());
    print!("{}", what_differs(opts));
    if opts.kvstore == "etcd" {
        print!("{}", etcd_setup(&cluster));
    }
    let page = page_port
        .map(|l| forward_page(&cluster, l))
        .unwrap_or_default();
    let end = opts
        .seconds
        .map(|s| Instant::now() + Duration::from_secs(s));
    while !crate::stop::requested() && end.is_none_or(|e| Instant::now() < e) {
        let mut view = String::new();
        for node in &cluster.nodes {
            match node.status() {
                // Node 1's view as its operator sees it: `health-agent status`.
                Some(_) if node.name == cluster.nodes[0].name => view.push_str(&node.status_text()),
                Some(s) => {
                    let _ = writeln!(
                        view,
                        "  {} sees {}/{} reachable",
                        node.name,
                        s.reachable(),
                        s.nodes.len()
                    );
                }
                None => {
                    let _ = writeln!(view, "  {}: agent not answering yet", node.name);
                }
            }
        }
        if opts.kvstore == "etcd" {
            // The cluster view every agent assembles from the summaries.
            let _ = write!(view, "\n{}", cluster.nodes[0].cluster_text());
        }
        if opts.routing == "masquerade"
            && let Ok(rows) = health_agent::datapath::nat::list(&cluster.nodes[0].pins)
        {
            let _ = writeln!(
                view,
                "\n  {} masquerade: {} NAT pairs (health-agent bpf nat list --bpffs-dir {})",
                cluster.nodes[0].name,
                rows.len() / 2,
                cluster.nodes[0].pins.display()
            );
        }
        if opts.no_redraw {
            println!("{view}");
        } else {
            // Clear the screen and draw the view at the top.
            print!(
                "\x1b[2J\x1b[H{} (Ctrl-C stops and tears down){page}\n\n{view}",
                cluster.nodes[0].name
            );
        }
        if crate::stop::sleep(Duration::from_secs(1)).is_err() {
            break;
        }
    }
    println!("\nstopping the agents (SIGTERM) and removing namespaces, pins and files...");
    cluster.stop_agents();
    drop(cluster);
    println!("done");
    Ok(())
}

/// What the demo's agents run differently from the product's defaults,
/// and why.
fn what_differs(opts: &Options) -> String {
    let mut out = format!(
        "the agents run the product's defaults except --probe-interval {} (60s by default: a \
         round every few seconds shows changes live) and --sync-min-interval 200ms (1s by \
         default: node-set changes applied at once)\n",
        opts.probe_interval
    );
    if opts.kvstore == "etcd" {
        out.push_str(
            "registration lease: the agent's default (--kvstore-lease-ttl 15m): a node whose \
             uplink or agent goes down stays in every node set and is called down; an agent \
             stopped cleanly (SIGTERM) leaves at once\n",
        );
    }
    out
}

/// What the demo's etcd runs with: TLS, and a user and a role per node.
fn etcd_setup(cluster: &Cluster) -> String {
    let mut out = format!("etcd: https://{ETCD_ENDPOINT} in the fabric namespace\n");
    if let Some(pki) = cluster.etcd_pki() {
        let _ = writeln!(
            out,
            "  TLS: a CA made at start ({}), etcd's certificate for {ETCD_IP} and 127.0.0.1, \
             client certificates required ({})",
            pki.path("ca.pem").display(),
            pki.path("client.pem").display()
        );
    }
    let _ = writeln!(
        out,
        "  authentication on: user root (role root), and a user and a role per node, \
         each agent logging in as its node (--kvstore-user, --kvstore-password-file):"
    );
    for node in &cluster.nodes {
        let g = NodeGrants::new(ETCD_PREFIX, &node.name);
        let _ = writeln!(
            out,
            "    {0}: role {0} writes {1}, {2} and {5} only, campaigns under {6}*, reads {3}*, {4}*, {8}* and {7}*",
            node.name,
            g.write[0],
            g.write[1],
            g.read[0],
            g.read[1],
            g.assemble[0],
            g.assemble[1],
            g.assemble[2],
            g.read[2]
        );
    }
    let _ = writeln!(
        out,
        "  health allocations: each node's --health-cidr, --health-cidr6, --node-ip and \
         --node-ip6 written by root at {}<name>, which no node's role may write; the agents run \
         --kvstore-allocations, taking a peer's health address only inside its node's \
         allocation and a node address only from the node it is allocated to",
        health_agent::membership::kvstore::beside(ETCD_PREFIX, "allocations")
    );
    out
}

/// The cluster's address families: `--ip-family`, IPv4 only with
/// masquerade (IPv4 only in the agent), refused where it cannot work.
fn family(opts: &Options) -> anyhow::Result<Family> {
    let family: Family = opts
        .ip_family
        .parse()
        .map_err(|e| anyhow::anyhow!("--ip-family: {e}"))?;
    if family == Family::V6 && opts.kvstore == "etcd" {
        bail!(
            "--kvstore etcd runs etcd on the fabric's IPv4 address: use --ip-family dual or ipv4 with it"
        );
    }
    if opts.routing != "masquerade" {
        return Ok(family);
    }
    match family {
        Family::V6 => bail!(
            "--routing masquerade is IPv4 only (the agent refuses IPv6 masquerade): use --ip-family ipv4 with it"
        ),
        Family::Dual => {
            println!("--routing masquerade is IPv4 only: the cluster runs IPv4 only");
            Ok(Family::V4)
        }
        Family::V4 => Ok(family),
    }
}

/// Listens on the host's loopback, port 9962 or any free one, for node 1's
/// page, and has the agents answer to that address (`--web-allowed-hosts`:
/// a listener answers only to the names it is given, so that a page on
/// another site cannot read it through DNS rebinding). `None`, said so,
/// when no port could be had.
fn page_port(settings: &mut Settings) -> Option<std::net::TcpListener> {
    let local = std::net::SocketAddr::from(([127, 0, 0, 1], health_tests::cluster::WEB_PORT));
    match crate::forward::bind(local).and_then(|l| l.local_addr().map(|a| (l, a.port()))) {
        Ok((listener, port)) => {
            settings.extra_args.extend([
                "--web-allowed-hosts".to_owned(),
                format!("127.0.0.1:{port},localhost:{port}"),
            ]);
            Some(listener)
        }
        Err(e) => {
            println!("could not listen on the host's loopback for node 1's page: {e}");
            None
        }
    }
}

/// Forwards `listener` to node 1's metrics listener, prints the page's and
/// the metrics' addresses, and returns them for the header of the live
/// view.
fn forward_page(cluster: &Cluster, listener: std::net::TcpListener) -> String {
    let first = &cluster.nodes[0];
    match crate::forward::start(listener, &cluster.fabric, first.web_addr()) {
        Ok(local) => {
            println!(
                "{} connectivity page: http://{local}/ (forwarded to {} in its namespace)",
                first.name,
                first.web_url()
            );
            println!("{} metrics: http://{local}/metrics", first.name);
            format!("\npage: http://{local}/  metrics: http://{local}/metrics")
        }
        Err(e) => {
            println!(
                "could not forward {}'s page to the host's loopback: {e}",
                first.name
            );
            String::new()
        }
    }
}
