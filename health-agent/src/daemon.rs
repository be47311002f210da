//! `health-agent daemon`: the long-running agent.
//!
//! Start order: pidfile (stale ones from a crash cleared), node set (a bad
//! nodes file fails the start here, naming the line), masquerade settings
//! (checked against the node), prober, API socket
//! (which answers from here on, before the endpoint or any probe round
//! exists), the endpoint, the :4240 responders, then the controller, the
//! discovery watch, the node-set sync runner and the probe loop.
//! SIGINT/SIGTERM disconnects the endpoint and removes what was made.

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    sync::{Arc, Mutex as StdMutex, RwLock},
    time::Duration,
};

use anyhow::Context as _;
use tokio::{
    sync::{Mutex, Notify, mpsc, watch},
    task::JoinHandle,
};
use tracing::{debug, error, info, warn};

use crate::{
    api,
    cluster::{
        Node, NodeSet,
        discovery::{self, EtcdSource, FileSource, NodeSource, NodesView, SharedNodes},
        etcd::{self, EtcdConfig, Registration},
        nodes_file,
        routes::PeerRoutes,
        sync,
    },
    endpoint::{Endpoint, EndpointConfig, shared_view},
    errors::chain,
    hello,
    ipam::Ipv4Cidr,
    masquerade::{self, PortRange},
    netlink::watch_links,
    netns::Netns,
    pidfile::Pidfile,
    probe::{ProbeConfig, Prober},
    signals::wait_for_shutdown,
};

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub endpoint: EndpointConfig,
    pub socket: PathBuf,
    pub pidfile: PathBuf,
    pub controller_interval: Duration,
    pub keep_endpoint: bool,
    pub node_name: Option<String>,
    pub nodes_file: Option<PathBuf>,
    pub probe: ProbeConfig,
    pub initial_delay: Duration,
    pub sync: sync::Limits,
    /// etcd discovery (instead of the nodes file).
    pub etcd: Option<EtcdConfig>,
    /// This node's address as published in etcd (default: the source
    /// address of the route to etcd).
    pub node_ip: Option<Ipv4Addr>,
    /// Period of the CT garbage collector and the RTT loss sweep.
    pub ct_gc_interval: Duration,
    /// Masquerade mode (`None`: routed).
    pub masquerade: Option<MasqueradeFlags>,
}

/// Masquerade as asked on the command line; the node IP is found at start.
#[derive(Debug, Clone)]
pub struct MasqueradeFlags {
    pub health_range: Ipv4Cidr,
    pub uplink: Option<String>,
    pub ports: PortRange,
}

/// Runs until SIGINT or SIGTERM.
pub async fn run(cfg: DaemonConfig) -> anyhow::Result<()> {
    let _pidfile = Pidfile::acquire(&cfg.pidfile, &cfg.socket)?;
    raise_fd_limit();

    let (nodes_view, nodes_tx, nodes_rx) = initial_nodes(&cfg)?;
    let masquerade = resolve_masquerade(&cfg, &nodes_rx.borrow())?;
    let prober = Prober::new(cfg.probe.clone()).context("opening the ICMP probe socket")?;
    prober.set_nodes(nodes_rx.borrow().clone());

    let view = shared_view();
    let api_state = api::server::ApiState::new(view.clone(), prober.clone(), nodes_view.clone());
    let (_socket, api_task) = api::server::bind(&cfg.socket, api_state)?;
    info!(socket = %cfg.socket.display(), "API listening");
    enable_forwarding();

    let mut ep_cfg = cfg.endpoint.clone();
    ep_cfg.masquerade = masquerade;
    let endpoint = tokio::task::spawn_blocking(move || Endpoint::start(ep_cfg, view))
        .await
        .context("the endpoint task panicked")?
        .context("creating the health endpoint")?;
    let own_ip = endpoint.record().ipv4;
    info!(id = endpoint.record().id, ipv4 = %own_ip, netns = %endpoint.record().netns, "health endpoint ready");
    let endpoint = Arc::new(Mutex::new(endpoint));

    let port = cfg.probe.http_port;
    let node_hello = tokio::spawn(hello::serve(
        tokio::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
            .await
            .with_context(|| format!("binding the health responder on port {port}"))?,
    ));
    let ep_netns = Netns::named(&cfg.endpoint.netns_name)?;
    let ep_hello = Arc::new(StdMutex::new(Some(spawn_endpoint_hello(&ep_netns, port)?)));

    let mut tasks: Vec<JoinHandle<()>> = vec![api_task, node_hello];
    let (events_tx, events_rx) = mpsc::channel(1);
    let (sync_events_tx, sync_events_rx) = mpsc::channel(1);
    tasks.push(tokio::spawn(async move {
        if let Err(e) = watch_links(vec![events_tx, sync_events_tx]).await {
            warn!(
                "link events unavailable, relying on the interval alone: {}",
                chain(&e)
            );
        }
    }));
    tasks.push(tokio::spawn(controller(
        endpoint.clone(),
        cfg.controller_interval,
        events_rx,
        (ep_netns, port, ep_hello.clone()),
    )));
    let registration = Registration::default();
    if let Some(source) = node_source(&cfg, own_ip, &registration)? {
        debug!(source = source.describe(), "node discovery");
        tasks.push(tokio::spawn(
            source.run(nodes_view.clone(), nodes_tx.clone()),
        ));
    }
    let routes = Arc::new(StdMutex::new(PeerRoutes::default()));
    tasks.push(tokio::spawn(sync_nodes(
        cfg.sync,
        nodes_rx,
        prober.clone(),
        routes.clone(),
        cfg.node_name.clone(),
        own_ip,
        sync_events_rx,
    )));
    tasks.push(tokio::spawn(maintain_datapath(
        cfg.endpoint.pin_dir.clone(),
        cfg.ct_gc_interval,
        cfg.probe.timeout,
    )));
    tasks.push(tokio::spawn(probe_loop(prober, cfg.initial_delay)));

    let signal = wait_for_shutdown().await?;
    info!(signal, "shutting down");
    for t in &tasks {
        t.abort();
    }
    if let Some(t) = ep_hello.lock().ok().and_then(|mut h| h.take()) {
        t.abort();
    }
    if let Some(etcd) = &cfg.etcd {
        etcd::deregister(&etcd.endpoint, &registration).await;
    }
    let keep = cfg.keep_endpoint;
    let mut ep = endpoint.lock_owned().await;
    tokio::task::spawn_blocking(move || {
        if !keep && let Ok(mut r) = routes.lock() {
            r.clear();
        }
        ep.shutdown(keep, &format!("agent received {signal}"))
    })
    .await
    .context("the shutdown task panicked")??;
    Ok(())
}

/// The node set before discovery starts: a bad nodes file fails the start
/// here, naming the line.
fn initial_nodes(
    cfg: &DaemonConfig,
) -> anyhow::Result<(
    SharedNodes,
    watch::Sender<NodeSet>,
    watch::Receiver<NodeSet>,
)> {
    let view: SharedNodes = Arc::new(RwLock::new(NodesView {
        source: match (&cfg.nodes_file, &cfg.etcd) {
            (Some(p), _) => format!("file:{}", p.display()),
            (None, Some(e)) => format!("etcd:{}{}", e.endpoint, e.prefix),
            (None, None) => "none".into(),
        },
        ..NodesView::default()
    }));
    let (tx, rx) = watch::channel(NodeSet::new());
    if let Some(path) = &cfg.nodes_file {
        let nodes = nodes_file::load(path)?;
        info!(path = %path.display(), nodes = nodes.len(), "nodes file loaded");
        discovery::accept(&view, &tx, nodes);
    }
    Ok((view, tx, rx))
}

/// Masquerade settings checked against this node, or `None` in routed mode.
/// The node IP is `--node-ip`, or this node's entry in the initial node set.
fn resolve_masquerade(
    cfg: &DaemonConfig,
    nodes: &NodeSet,
) -> anyhow::Result<Option<masquerade::Masquerade>> {
    let Some(flags) = &cfg.masquerade else {
        return Ok(None);
    };
    let name = cfg.node_name.clone().unwrap_or_default();
    let node_ip = cfg
        .node_ip
        .or_else(|| nodes.iter().find(|n| n.name == name).map(|n| n.node_ip))
        .ok_or(masquerade::MasqueradeError::NoNodeIp { name })?;
    let m = masquerade::resolve(&masquerade::Request {
        node_ip,
        uplink: flags.uplink.clone(),
        health_cidr: cfg.endpoint.cidr,
        health_range: flags.health_range,
        ports: flags.ports,
    })?;
    info!(uplink = %m.uplink, %node_ip, ports = %flags.ports, "masquerade on");
    Ok(Some(m))
}

/// The :4240 responder inside the endpoint's namespace: the listening
/// socket is created there, then served from the runtime.
fn spawn_endpoint_hello(netns: &Netns, port: u16) -> anyhow::Result<JoinHandle<()>> {
    let std_listener = netns
        .run(|| std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))?
        .with_context(|| {
            format!(
                "binding the health responder on port {port} in {}",
                netns.path().display()
            )
        })?;
    std_listener.set_nonblocking(true)?;
    Ok(tokio::spawn(hello::serve(
        tokio::net::TcpListener::from_std(std_listener)?,
    )))
}

type EndpointHello = (Netns, u16, Arc<StdMutex<Option<JoinHandle<()>>>>);

/// Runs the endpoint's check-and-repair every `interval`, and shortly after
/// any link event in the node's namespace.
async fn controller(
    endpoint: Arc<Mutex<Endpoint>>,
    interval: Duration,
    mut events: mpsc::Receiver<()>,
    hello: EndpointHello,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; the endpoint was just made
    loop {
        let trigger = tokio::select! {
            _ = tick.tick() => "interval",
            Some(()) = events.recv() => {
                // Let a burst of events (a veth pair going away) settle.
                tokio::time::sleep(Duration::from_millis(100)).await;
                while events.try_recv().is_ok() {}
                "link event"
            }
        };
        let ep = endpoint.clone().lock_owned().await;
        let timeout = interval.clamp(Duration::from_millis(200), Duration::from_secs(1));
        let result = tokio::task::spawn_blocking(move || {
            let mut ep = ep;
            ep.check_and_repair(timeout)
        })
        .await;
        match result {
            Ok(Ok(run)) if run.repaired => {
                info!(trigger, missing = ?run.missing, "controller repaired the endpoint");
                if run.namespace_recreated {
                    rebind_endpoint_hello(&hello);
                }
            }
            Ok(Ok(_)) => debug!(trigger, "controller: endpoint in place"),
            Ok(Err(e)) => error!(
                trigger,
                "controller could not repair the endpoint: {}",
                chain(&e)
            ),
            Err(e) => error!(trigger, "controller task failed: {e}"),
        }
        // The run's own changes (a recreated veth, re-attached programs)
        // raise link events: they must not trigger the next run.
        tokio::time::sleep(Duration::from_millis(50)).await;
        while events.try_recv().is_ok() {}
    }
}

fn rebind_endpoint_hello((netns, port, slot): &EndpointHello) {
    match spawn_endpoint_hello(netns, *port) {
        Ok(task) => {
            if let Ok(mut s) = slot.lock()
                && let Some(old) = s.replace(task)
            {
                old.abort();
            }
        }
        Err(e) => error!("rebinding the endpoint's health responder: {e:#}"),
    }
}

/// Applies node-set changes through the bounded-frequency runner.
async fn sync_nodes(
    limits: sync::Limits,
    mut nodes: watch::Receiver<NodeSet>,
    prober: Arc<Prober>,
    routes: Arc<StdMutex<PeerRoutes>>,
    local_name: Option<String>,
    own_ip: Ipv4Addr,
    mut link_events: mpsc::Receiver<()>,
) {
    let wake = Arc::new(Notify::new());
    let waker = wake.clone();
    // A link going down takes its routes with it: re-check them.
    let link_waker = wake.clone();
    let relinks = tokio::spawn(async move {
        while link_events.recv().await.is_some() {
            link_waker.notify_one();
        }
    });
    let mut changes = nodes.clone();
    let forward = tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            waker.notify_one();
        }
    });
    // The first run installs routes for the initial set.
    wake.notify_one();
    sync::run(limits, &wake, || {
        let set = nodes.borrow_and_update().clone();
        let (prober, routes, local) = (prober.clone(), routes.clone(), local_name.clone());
        async move {
            let desired = PeerRoutes::desired(&set, local.as_deref(), own_ip);
            prober.set_nodes(set);
            let _ = tokio::task::spawn_blocking(move || {
                if let Ok(mut r) = routes.lock() {
                    r.apply(&desired);
                }
            })
            .await;
        }
    })
    .await;
    forward.abort();
    relinks.abort();
}

/// Collects expired CT entries and counts unanswered probes as RTT losses.
async fn maintain_datapath(pins: PathBuf, every: Duration, probe_timeout: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let dir = pins.clone();
        let done = tokio::task::spawn_blocking(move || {
            // NAT first: it removes pairs whose CT entry expired, which the
            // CT collector is about to delete.
            if let Err(e) = crate::datapath::nat::gc(&dir) {
                warn!("NAT garbage collection: {}", chain(&e));
            }
            let removed = crate::datapath::ct::gc(&dir);
            let lost = crate::datapath::rtt::sweep(&dir, probe_timeout);
            (removed, lost)
        })
        .await;
        match done {
            Ok((Ok(removed), Ok(lost))) => debug!(removed, lost, "datapath maintenance"),
            Ok((r, l)) => {
                for e in [r.err(), l.err()].into_iter().flatten() {
                    warn!("datapath maintenance: {}", chain(&e));
                }
            }
            Err(e) => warn!("datapath maintenance task failed: {e}"),
        }
    }
}

async fn probe_loop(prober: Arc<Prober>, initial_delay: Duration) {
    tokio::time::sleep(initial_delay).await;
    let mut tick = tokio::time::interval(prober.config().interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let status = prober.round().await;
        if let Some(r) = &status.round {
            debug!(
                probes = r.probes,
                duration_ms = r.duration_ms,
                reachable = status.reachable(),
                "probe round"
            );
        }
    }
}

/// The configured node source, if any.
fn node_source(
    cfg: &DaemonConfig,
    own_ip: Ipv4Addr,
    registration: &Registration,
) -> anyhow::Result<Option<Box<dyn NodeSource>>> {
    Ok(match (&cfg.nodes_file, &cfg.etcd) {
        (Some(path), _) => Some(Box::new(FileSource {
            path: path.clone(),
            poll: Duration::from_millis(500),
        })),
        (None, Some(etcd)) => {
            let node_ip = match cfg.node_ip {
                Some(ip) => ip,
                None => route_source_to(&etcd.endpoint).with_context(|| {
                    format!(
                        "finding this node's address toward etcd at {} (give --node-ip)",
                        etcd.endpoint
                    )
                })?,
            };
            let me = Node {
                name: cfg
                    .node_name
                    .clone()
                    .context("etcd discovery needs --node-name (or a hostname)")?,
                node_ip,
                health_ip: own_ip,
            };
            info!(name = %me.name, %node_ip, health_ip = %own_ip, "joining the cluster through etcd");
            Some(Box::new(EtcdSource {
                cfg: etcd.clone(),
                me,
                registration: registration.clone(),
            }))
        }
        (None, None) => None,
    })
}

/// The local address the kernel would use toward `endpoint` (`host:port`).
fn route_source_to(endpoint: &str) -> anyhow::Result<Ipv4Addr> {
    let sock = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    sock.connect(endpoint)?;
    match sock.local_addr()?.ip() {
        std::net::IpAddr::V4(ip) if !ip.is_unspecified() => Ok(ip),
        other => anyhow::bail!("no IPv4 source address toward {endpoint} (got {other})"),
    }
}

/// Probes to hundreds of peers hold a socket each: lift the soft limit.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        warn!("could not raise the open-file limit from {soft}: {e}");
    }
}

/// The node forwards between its uplink and the endpoint (routed mode).
fn enable_forwarding() {
    if let Err(e) = std::fs::write("/proc/sys/net/ipv4/ip_forward", "1") {
        warn!("could not enable IPv4 forwarding: {e}");
    }
}
