//! `health-agent daemon`: the long-running agent, its configuration and its supervised tasks.
//! Imported only by the binary; imports every other module.
//!
//! `health-agent daemon`: the long-running agent, as supervised tasks.
//!
//! Start order, each task ready before the next starts: signals are caught
//! first (a SIGTERM at any later moment is a clean stop), the pidfile is
//! locked, the flags are checked and the kernel probed (a bad combination
//! fails here, before anything is made), then
//!
//! | task | owns |
//! | --- | --- |
//! | `api` | the unix socket; answers from here on, within milliseconds of start at any cluster size |
//! | | (not a task) the nodes file is read and masquerade checked: a file that does not parse, or a bad masquerade flag, stops the agent here, the socket removed, before anything is made in the node's namespace |
//! | `web` | the metrics listener: `/metrics`, the connectivity page, read-only `/api` |
//! | `links` | link events of the node's namespace |
//! | `datapath` | pins, datapath configuration, masquerade, CT/NAT GC, RTT sweep |
//! | `endpoint` | the health endpoint, its :4240 hello server, its controller |
//! | `hello` | the node's :4240 hello server |
//! | `discovery` | the node set (file or etcd) |
//! | `sync` | node-set changes applied to the prober (all peers, or this node's subset) and the peer routes |
//! | `cluster-view` | with etcd: this node's round summaries published, everyone's watched, the cluster view assembled |
//! | `probe` | the probe rounds |
//!
//! A task that ends, fails or panics is logged, shown as degraded in
//! `/v1/healthz` and restarted (within the supervisor's budget; past it the
//! agent exits non-zero). SIGINT/SIGTERM stops the tasks in reverse order,
//! each removing what it made. SIGHUP re-reads the configuration
//! ([`reload`]). Started by systemd (`Type=notify`), the agent sends
//! `READY=1` once every task has started (the API serving first), and
//! `STOPPING=1` when it stops.

pub mod cluster_view;
pub mod config;
mod endpoint_names;
mod forwarding;
pub mod node_addr;
mod node_sync;
pub mod reload;
mod tasks;

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use health_common::maps::ProgId;
use sd_notify::NotifyState;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use self::config::{DaemonConfig, Discovery};
use crate::{
    api,
    cluster::view_cell::ClusterViewCell,
    datapath::{
        DatapathOwner,
        collect::LossTimeout,
        maintenance::{self, DatapathConfig},
        report::MapsReport,
        settings::MaintenanceStart,
    },
    encryption::EncryptionMonitor,
    endpoint::{EndpointConfig, controller::ControllerConfig, shared_view},
    membership::{
        Node, discovery::NodeSource, etcd::Registration, published::Nodes, routes::RouteBounds,
    },
    metrics::{self, Metrics},
    probe::{
        ProbeConfig, Prober, RESERVED_FILES, http::HEALTH_PORT, metrics::ProbeMetrics,
        settings::ProberStart,
    },
    supervisor::{Health, Supervisor, SupervisorError},
    sys::{
        netns::Netns,
        pidfile::{DirLock, Pidfile, PidfileError},
        signals::{Hangups, Signals},
    },
    util::errors::chain,
};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("catching SIGINT and SIGTERM")]
    Signals(#[source] std::io::Error),
    #[error(transparent)]
    Pidfile(#[from] PidfileError),
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Api(#[from] api::server::ServerError),
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    #[error("endpoint namespace name")]
    Netns(#[from] crate::sys::netns::NetnsError),
    #[error("this node's address for its etcd record")]
    NodeIp(#[from] node_addr::NodeAddrError),
    #[error("the pin directory (--bpffs-dir)")]
    Pins(#[source] crate::datapath::DatapathError),
}

/// Makes the pin directory (mounting bpffs where none is) and locks it.
fn pin_lock(dir: &std::path::Path) -> Result<DirLock, DaemonError> {
    crate::datapath::ensure_pin_dir(dir).map_err(DaemonError::Pins)?;
    Ok(DirLock::take(dir, "--bpffs-dir")?)
}

/// Runs the agent until SIGINT or SIGTERM (`Ok`), or until a task fails
/// for good (`Err`, naming it). On SIGHUP, `reload` (if any) re-reads the
/// configuration.
pub async fn run(cfg: DaemonConfig, reload: Option<reload::Reload>) -> Result<(), DaemonError> {
    let mut signals = Signals::install().map_err(DaemonError::Signals)?;
    let hangups = Hangups::install().map_err(DaemonError::Signals)?;
    let stop = CancellationToken::new();
    let stopper = stop.clone();
    tokio::spawn(async move {
        let signal = signals.recv().await;
        info!(signal, "shutting down");
        reload::notify(&[NotifyState::Stopping]);
        stopper.cancel();
    });
    run_inner(cfg, stop, Some((hangups, reload))).await
}

/// Runs the agent until `stop` is cancelled: the daemon without its signal
/// handling, for running it in-process.
pub async fn run_until(cfg: DaemonConfig, stop: CancellationToken) -> Result<(), DaemonError> {
    run_inner(cfg, stop, None).await
}

/// Starts a task and waits for it to be ready; `false` (stopped meanwhile)
/// returns `Ok`.
macro_rules! start {
    ($started:expr) => {
        if !$started.await? {
            return Ok(());
        }
    };
}

/// A failure once tasks run stops them (the socket goes with its task).
macro_rules! or_stop {
    ($sup:ident, $result:expr) => {
        match $result {
            Ok(value) => value,
            Err(e) => {
                $sup.stop().await;
                return Err(e.into());
            }
        }
    };
}

async fn run_inner(
    cfg: DaemonConfig,
    stop: CancellationToken,
    hangups: Option<(Hangups, Option<reload::Reload>)>,
) -> Result<(), DaemonError> {
    let s = &cfg.settings;
    let _pidfile = Pidfile::acquire(&s.process.pidfile, &s.socket.path)?;
    let _state = DirLock::take(&s.endpoint.state_dir, "--state-dir")?;
    let mut forwarding = None;
    let result = run_agent(cfg, stop, hangups, &mut forwarding).await;
    // What a task aborted at the stop deadline left (the endpoint) is
    // removed before forwarding is written back and the pidfile goes.
    let _ = tokio::task::spawn_blocking(|| crate::util::reclaim::wait(RECLAIM_PATIENCE)).await;
    drop(forwarding);
    result
}

/// The agent, its pidfile held.
async fn run_agent(
    cfg: DaemonConfig,
    stop: CancellationToken,
    hangups: Option<(Hangups, Option<reload::Reload>)>,
    forwarding: &mut Option<forwarding::Forwarding>,
) -> Result<(), DaemonError> {
    let s = &cfg.settings;
    let open_files = raise_fd_limit();
    let resolved = cfg.resolve()?;
    if stop.is_cancelled() {
        return Ok(());
    }
    // The pins are this agent's alone, held past their removal.
    let _pin_lock = pin_lock(&s.pins.dir)?;
    // Whatever ends the agent from here on, the pins go with it.
    let _pins = maintenance::PinsGuard {
        dir: s.pins.dir.clone(),
        keep: s.endpoint.keep_endpoint,
    };
    // The one owner of the kernel object (dropped before the pins).
    let kernel = DatapathOwner::new(s.pins.dir.clone(), map_sizes(&cfg))
        .with_programs(&programs(&cfg, &resolved));
    let health = Health::default();
    let stopping = stop.clone();
    let mut sup = Supervisor::new(s.process.supervisor(), health.clone(), stop);

    let nodes = Nodes::new(cfg.source_name()).with_max_nodes(s.cluster.max_nodes());
    let view = shared_view();
    let prober = Prober::new(probe_config(&cfg, open_files, &kernel, resolved.tc_hook)?);
    let probe_metrics = prober.config().metrics.clone().unwrap_or_default();
    // The prober in service; a reload that changes its settings replaces it.
    let (probers, prober) = watch::channel(prober);
    // The probe timeout for the RTT loss sweep, as reloads leave it.
    let (probe_timeout, probe_timeout_in_force) =
        watch::channel(LossTimeout::new(s.tuning.probe_timeout));

    let (api_state, cluster) = api_state(&cfg, &resolved, &view, &prober, &nodes, health);
    let (links, _) = broadcast::channel(16);
    let maps = MapsReport::default();
    let (api_state, web) = metrics_and_web(
        &cfg,
        &prober,
        probe_metrics,
        &nodes,
        &view,
        &maps,
        api_state,
    );
    // The socket first: it answers while the node set is read.
    start!(tasks::api(
        &mut sup,
        s.socket.path.clone(),
        s.process.socket_group.clone(),
        api_state
    ));
    let at_start = or_stop!(sup, initial_nodes(&cfg, &nodes, &prober));
    if let Some((addr, router)) = web {
        start!(tasks::web(&mut sup, addr, router));
    }
    start!(tasks::links(&mut sup, links.clone()));
    *forwarding = Some(forwarding::Forwarding::set(&s.endpoint));
    start!(tasks::datapath(
        &mut sup,
        datapath_config(&cfg, &resolved, &at_start, maps, probe_timeout_in_force),
        kernel.handle()
    ));
    let controller = controller_config(&cfg, &resolved);
    start!(tasks::endpoint(
        &mut sup,
        controller,
        kernel.handle(),
        view.clone(),
        links.clone()
    ));
    start!(tasks::hello(&mut sup, HEALTH_PORT, &cfg.node_name));
    let registration = Registration::default();
    let own = (endpoint_ip(&view), crate::endpoint::ipv6(&view));
    let source = or_stop!(sup, node_source(&cfg, &at_start, own, &registration));
    debug!(source = %cfg.source_name(), "node discovery");
    start!(tasks::discovery(&mut sup, source, nodes.clone()));
    if let Some(task) = cluster_view_task(&cfg, &registration, &prober, &nodes, cluster.as_ref()) {
        start!(tasks::cluster_view(&mut sup, task));
    }
    let own_ips = [
        endpoint_ip(&view).map(IpAddr::V4),
        crate::endpoint::ipv6(&view).map(IpAddr::V6),
    ];
    let sync = node_sync(
        &cfg,
        &prober,
        own_ips.into_iter().flatten().collect(),
        &nodes,
    );
    start!(tasks::sync(&mut sup, sync, nodes, links));
    start!(tasks::probe(&mut sup, prober, s.probe.probe_initial_delay));

    info!(node = %cfg.node_name, "agent running");
    reload::notify(&[NotifyState::Ready, NotifyState::Status("running")]);
    // SIGHUPs are answered while the agent runs; not once it stops.
    let reloads = hangups.map(|(hangups, reload)| {
        tokio::spawn(stopping.run_until_cancelled_owned(reload::run(
            hangups,
            reload,
            reload::Targets {
                probers: probers.clone(),
                probe_timeout: probe_timeout.clone(),
            },
        )))
    });
    let result = sup.run().await.map_err(DaemonError::from);
    if let Some(reloads) = reloads {
        reloads.abort();
    }
    result
}

/// The longest the agent waits, once stopped, for the removal of what its
/// aborted tasks left.
const RECLAIM_PATIENCE: Duration = Duration::from_secs(10);

/// Reads the node set at start ([`DaemonConfig::resolve_nodes`]) into
/// `nodes`, and gives the prober its peers from it.
fn initial_nodes(
    cfg: &DaemonConfig,
    nodes: &Nodes,
    prober: &watch::Receiver<std::sync::Arc<Prober>>,
) -> Result<config::NodesAtStart, config::ConfigError> {
    let mut at_start = cfg.resolve_nodes()?;
    nodes.accept(std::mem::take(&mut at_start.initial_nodes));
    prober.borrow().set_nodes(node_sync::probed(
        &nodes.current(),
        &cfg.node_name,
        cfg.settings.probe.probe_peers,
    ));
    Ok(at_start)
}

fn controller_config(cfg: &DaemonConfig, resolved: &config::Resolved) -> ControllerConfig {
    let e = &cfg.settings.endpoint;
    ControllerConfig::new(
        e,
        EndpointConfig::new(e, resolved.echo_mode, resolved.tc_hook),
        HEALTH_PORT,
    )
    .naming(&cfg.node_name)
}

/// The endpoint's IPv4 address once it exists, when it has one (its IPv6
/// address: [`crate::endpoint::ipv6`]).
fn endpoint_ip(view: &crate::endpoint::SharedView) -> Option<Ipv4Addr> {
    crate::endpoint::ipv4(view)
}

fn node_sync(
    cfg: &DaemonConfig,
    prober: &watch::Receiver<std::sync::Arc<Prober>>,
    own_ips: Vec<IpAddr>,
    nodes: &Nodes,
) -> node_sync::NodeSync {
    node_sync::NodeSync {
        limits: cfg.settings.cluster.sync_limits(),
        prober: prober.clone(),
        local_name: cfg.node_name.clone(),
        own_ips,
        keep_routes: cfg.settings.endpoint.keep_endpoint,
        set_comes_later: matches!(cfg.discovery, Discovery::Etcd(_)),
        peers: cfg.settings.probe.probe_peers,
        bounds: RouteBounds {
            range: cfg.settings.endpoint.health_range,
            range6: cfg.settings.endpoint.health_range6,
            protected: match &cfg.discovery {
                Discovery::Etcd(e) => e
                    .endpoints
                    .iter()
                    .filter_map(|e| endpoint_names::address_of(e))
                    .collect(),
                Discovery::File(_) | Discovery::None => Vec::new(),
            },
            // Set at each sync from the encryption check's device.
            tunnel: None,
        },
        source: nodes.clone(),
        endpoint_names: std::sync::Arc::new(match &cfg.discovery {
            Discovery::Etcd(e) => endpoint_names::EndpointNames::of(&e.endpoints),
            Discovery::File(_) | Discovery::None => endpoint_names::EndpointNames::default(),
        }),
    }
}

fn api_state(
    cfg: &DaemonConfig,
    resolved: &config::Resolved,
    view: &crate::endpoint::SharedView,
    prober: &watch::Receiver<std::sync::Arc<Prober>>,
    nodes: &Nodes,
    health: Health,
) -> (api::server::ApiState, Option<ClusterViewCell>) {
    let state = api::server::ApiState::new(
        view.clone(),
        prober.clone(),
        nodes.clone(),
        health,
        cfg.settings.process.supervisor().degraded_for,
    )
    .with_kernel(crate::datapath::KernelReport {
        features: resolved.kernel.clone(),
        policy: cfg.settings.datapath.attach,
        tc_hook: resolved.tc_hook,
        programs: Vec::new(),
    });
    // A cluster view only with etcd, where the summaries travel.
    match cfg.discovery {
        Discovery::Etcd(_) => {
            let cell = ClusterViewCell::default();
            (state.with_cluster(cell.clone()), Some(cell))
        }
        _ => (state, None),
    }
}

/// The metrics (also served on the socket by `api`) and, when
/// `--prometheus-serve-addr` is not `off`, the metrics listener's address
/// and routes.
fn metrics_and_web(
    cfg: &DaemonConfig,
    prober: &watch::Receiver<std::sync::Arc<Prober>>,
    probe: std::sync::Arc<ProbeMetrics>,
    nodes: &Nodes,
    view: &crate::endpoint::SharedView,
    maps: &MapsReport,
    api_state: api::server::ApiState,
) -> (
    api::server::ApiState,
    Option<(std::net::SocketAddr, axum::Router)>,
) {
    let metrics = std::sync::Arc::new(Metrics::new(metrics::Sources {
        prober: prober.clone(),
        probe,
        nodes: nodes.clone(),
        endpoint: view.clone(),
        pin_dir: cfg.settings.pins.dir.clone(),
        maps: maps.clone(),
        per_peer: cfg.settings.web.metrics_per_peer,
    }));
    let api_state = api_state.with_metrics(metrics.clone());
    let web = cfg.settings.web.serve_addr().map(|addr| {
        let allowed = cfg.settings.web.allowed_hosts();
        (
            addr,
            crate::web::router(metrics, api_state.clone(), allowed),
        )
    });
    (api_state, web)
}

/// The programs the agent's settings need for the datapath to start: the
/// endpoint's tracking and echo responder, masquerade. The encryption
/// check's counters load when a WireGuard device is there to count on,
/// and a failure there only degrades that check.
fn programs(cfg: &DaemonConfig, resolved: &config::Resolved) -> Vec<ProgId> {
    let mut programs = vec![ProgId::LxcIngress, ProgId::LxcEgress];
    programs.extend_from_slice(resolved.echo_mode.programs());
    if cfg.settings.datapath.masquerade() {
        programs.extend([ProgId::NatIngress, ProgId::NatEgress]);
    }
    programs
}

/// The sizes of the maps that grow with the cluster: for the probe flows
/// and the address families the endpoint has.
fn map_sizes(cfg: &DaemonConfig) -> health_common::maps::MapSizes {
    let s = &cfg.settings;
    let e = &s.endpoint;
    let families = u8::from(e.health_cidr.is_some()) + u8::from(e.health_cidr6.is_some());
    s.datapath.map_sizes(s.probe.probe_flows, families)
}

fn datapath_config(
    cfg: &DaemonConfig,
    resolved: &config::Resolved,
    at_start: &config::NodesAtStart,
    report: MapsReport,
    probe_timeout: watch::Receiver<LossTimeout>,
) -> DatapathConfig {
    DatapathConfig::new(
        &cfg.settings.datapath,
        MaintenanceStart {
            pin_dir: cfg.settings.pins.dir.clone(),
            keep_pins: cfg.settings.endpoint.keep_endpoint,
            masquerade: at_start.masquerade.clone(),
            tc_hook: resolved.tc_hook,
            report,
            probe_timeout,
            map_sizes: map_sizes(cfg),
        },
    )
}

fn probe_config(
    cfg: &DaemonConfig,
    open_files: u64,
    kernel: &DatapathOwner,
    tc_hook: crate::datapath::TcHook,
) -> Result<ProbeConfig, DaemonError> {
    let e = &cfg.settings.endpoint;
    let fd_budget = crate::probe::fd_budget(open_files);
    let families = crate::probe::family::Families::from_flags(
        e.health_cidr.is_some(),
        e.health_cidr6.is_some(),
    )
    .unwrap_or_default();
    let mut probe = ProbeConfig::new(
        &cfg.settings.probe,
        &cfg.settings.tuning,
        ProberStart {
            fd_budget,
            local_node: cfg.node_name.clone(),
            endpoint_netns: Some(Netns::named(&e.endpoint_netns)?),
            pin_dir: cfg.settings.pins.dir.clone(),
            families,
            mtu_probe: cfg.settings.probe.probe_mtu.resolve(),
        },
    );
    let enc = &cfg.settings.encryption;
    if enc.enabled() {
        probe.encryption = Some(std::sync::Arc::new(EncryptionMonitor::new(
            enc.clone(),
            Some(cfg.node_name.clone()),
            kernel.handle(),
            tc_hook,
            e.host_iface.clone(),
            crate::encryption::monitor::Families {
                ipv4: e.health_cidr.is_some(),
                ipv6: e.health_cidr6.is_some(),
            },
        )));
    }
    info!(
        max_in_flight = probe.max_in_flight,
        mtu_probe = ?probe.mtu_probe,
        open_files, "HTTP probes in flight at most"
    );
    if usize::try_from(open_files).unwrap_or(usize::MAX) < RESERVED_FILES + 1024 {
        warn!(
            open_files,
            reserved = RESERVED_FILES,
            max_in_flight = probe.max_in_flight,
            "the open-file limit leaves HTTP probes few descriptors beside the {RESERVED_FILES} kept for the agent's servers and the rest: a large round waits for slots (raise LimitNOFILE, or give the agent CAP_SYS_RESOURCE)"
        );
    }
    Ok(probe)
}

/// The cluster view's task, when nodes are discovered through etcd (the
/// summaries travel there).
fn cluster_view_task(
    cfg: &DaemonConfig,
    registration: &Registration,
    prober: &watch::Receiver<std::sync::Arc<Prober>>,
    nodes: &Nodes,
    cell: Option<&ClusterViewCell>,
) -> Option<cluster_view::ClusterViewTask> {
    let (Discovery::Etcd(etcd), Some(cell)) = (&cfg.discovery, cell) else {
        return None;
    };
    Some(cluster_view::ClusterViewTask {
        store: registration.store(etcd),
        prefix: cluster_view::summaries_prefix(&etcd.prefix),
        view_prefix: crate::cluster::published_view::view_prefix(&etcd.prefix),
        election: crate::cluster::published_view::election_name(&etcd.prefix),
        local: cfg.node_name.clone(),
        prober: prober.clone(),
        nodes: nodes.clone(),
        peers: cfg.settings.probe.probe_peers,
        cell: cell.clone(),
    })
}

/// The configured node source.
fn node_source(
    cfg: &DaemonConfig,
    at_start: &config::NodesAtStart,
    (own_ip, own_ip6): (Option<Ipv4Addr>, Option<std::net::Ipv6Addr>),
    registration: &Registration,
) -> Result<NodeSource, DaemonError> {
    Ok(match &cfg.discovery {
        Discovery::File(path) => NodeSource::File {
            path: path.clone(),
            poll: Duration::from_millis(500),
            local: cfg.local_node(),
            seen: at_start.file,
        },
        Discovery::Etcd(etcd) => {
            let (node_ip, node_ip6) = node_addr::resolve(
                &etcd.endpoints,
                node_addr::Wanted {
                    node_ip: at_start.node_ip,
                    node_ip6: at_start.node_ip6,
                    v4: own_ip.is_some(),
                    v6: own_ip6.is_some(),
                },
            )?;
            let me = Node {
                name: cfg.node_name.clone(),
                node_ip,
                health_ip: own_ip.filter(|_| node_ip.is_some()),
                node_ip6,
                health_ip6: own_ip6.filter(|_| node_ip6.is_some()),
                zone: cfg.settings.cluster.zone.clone(),
            };
            info!("joining the cluster through etcd as {me}");
            NodeSource::Etcd {
                cfg: etcd.clone(),
                me,
                local: cfg.local_node(),
                registration: registration.clone(),
            }
        }
        Discovery::None => NodeSource::None,
    })
}

/// The open-file limit the agent asks for: every HTTP probe of a round
/// holds a socket (40,000 at 10,000 dual-stack peers) and a round makes
/// them in one go only when all fit.
const WANTED_FILES: u64 = 1 << 20;

/// HTTP probes to thousands of peers hold a socket each: lifts the
/// open-file limit to `WANTED_FILES` (at most `fs.nr_open`), raising the
/// hard limit too when the agent may (`CAP_SYS_RESOURCE`), else the soft
/// limit to the hard one; returns the limit in force.
pub fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(WANTED_FILES);
    let wanted = WANTED_FILES.min(nr_open);
    if hard < wanted && setrlimit(Resource::RLIMIT_NOFILE, wanted, wanted).is_ok() {
        return wanted;
    }
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => hard,
        Err(e) => {
            warn!(
                "could not raise the open-file limit from {soft}: {}",
                chain(&e)
            );
            soft
        }
    }
}
