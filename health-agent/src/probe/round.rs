use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use tokio::{sync::Semaphore, task::JoinSet};

use super::{
    error::ProbeError,
    http::{self, HEALTH_PORT},
    icmp::IcmpProber,
    path::{Outcome, PathState, RttSource, Thresholds},
    status::{ClusterStatus, Connectivity, NodeStatus, RoundInfo},
};
use crate::{
    cluster::{Node, NodeSet},
    datapath::rtt::KernelRtt,
};

#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub thresholds: Thresholds,
    /// Probe starts are spread uniformly over this window.
    pub spread: Duration,
    /// Probes in flight at once.
    pub max_in_flight: usize,
    pub http_port: u16,
    pub local_node: Option<String>,
    /// Namespace the probes leave from (the health endpoint's); the
    /// caller's when `None`.
    pub source_netns: Option<crate::sys::netns::Netns>,
    /// bpffs directory of the datapath maps: RTTs are taken from the
    /// kernel's samples when there are any.
    pub kernel_rtt: Option<std::path::PathBuf>,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(1),
            thresholds: Thresholds::default(),
            spread: Duration::from_millis(100),
            max_in_flight: 1024,
            http_port: HEALTH_PORT,
            local_node: None,
            source_netns: None,
            kernel_rtt: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Host,
    Endpoint,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Proto {
    Icmp,
    Http,
}

type PathKey = (String, Target, Proto);

/// The IP protocol whose kernel RTT stands for a path's.
const fn key_proto(key: &PathKey) -> u8 {
    match key.2 {
        Proto::Icmp => health_common::headers::IPPROTO_ICMP,
        Proto::Http => health_common::ct::IPPROTO_TCP,
    }
}

pub struct Prober {
    cfg: ProbeConfig,
    /// The ICMP socket, with the inode of the namespace it was opened in:
    /// reopened when the endpoint's namespace is recreated.
    icmp: Mutex<Option<(u64, Arc<IcmpProber>)>>,
    nodes: RwLock<NodeSet>,
    paths: Mutex<BTreeMap<PathKey, PathState>>,
    /// One round at a time: kubelet counters must see each round once.
    round_lock: tokio::sync::Mutex<()>,
    /// Numbers rounds in the order they start: publishing compares these,
    /// never wall-clock times (which NTP may step back).
    round_seq: std::sync::atomic::AtomicU64,
    published: RwLock<Arc<ClusterStatus>>,
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Prober {
    /// Needs a tokio runtime (the ICMP receive task). Sockets are opened
    /// when the first round needs them.
    #[must_use]
    pub fn new(cfg: ProbeConfig) -> Arc<Self> {
        Arc::new(Self {
            icmp: Mutex::new(None),
            nodes: RwLock::default(),
            paths: Mutex::default(),
            round_lock: tokio::sync::Mutex::new(()),
            round_seq: std::sync::atomic::AtomicU64::new(0),
            published: RwLock::new(Arc::new(ClusterStatus {
                local_node: cfg.local_node.clone(),
                probe_interval_ms: ms(cfg.interval),
                probe_timeout_ms: ms(cfg.timeout),
                round: None,
                nodes: Vec::new(),
            })),
            cfg,
        })
    }

    #[must_use]
    pub const fn config(&self) -> &ProbeConfig {
        &self.cfg
    }

    /// The published status (cached; never waits for a round).
    #[must_use]
    pub fn status(&self) -> Arc<ClusterStatus> {
        self.published
            .read()
            .map_or_else(|p| p.into_inner().clone(), |s| s.clone())
    }

    #[must_use]
    pub fn nodes(&self) -> NodeSet {
        self.nodes.read().map(|n| n.clone()).unwrap_or_default()
    }

    /// Replaces the node set: removed nodes' paths are forgotten, new ones
    /// start Unknown, and the published status shows the new set at once.
    pub fn set_nodes(&self, nodes: NodeSet) {
        if let Ok(mut paths) = self.paths.lock() {
            paths.retain(|(name, _, _), _| nodes.contains(name));
        }
        if let Ok(mut n) = self.nodes.write() {
            *n = nodes;
        }
        let round = self.status().round.clone();
        self.publish(self.snapshot(round), true);
    }

    fn snapshot(&self, round: Option<RoundInfo>) -> ClusterStatus {
        let paths = self.paths.lock().map(|p| p.clone()).unwrap_or_default();
        let get = |node: &Node, t, p| {
            paths
                .get(&(node.name.clone(), t, p))
                .cloned()
                .unwrap_or_default()
        };
        let nodes = self
            .nodes()
            .iter()
            .map(|n| NodeStatus {
                name: n.name.clone(),
                host: Connectivity {
                    ip: n.node_ip,
                    icmp: get(n, Target::Host, Proto::Icmp),
                    http: get(n, Target::Host, Proto::Http),
                },
                endpoint: Connectivity {
                    ip: n.health_ip,
                    icmp: get(n, Target::Endpoint, Proto::Icmp),
                    http: get(n, Target::Endpoint, Proto::Http),
                },
            })
            .collect();
        ClusterStatus {
            local_node: self.cfg.local_node.clone(),
            probe_interval_ms: ms(self.cfg.interval),
            probe_timeout_ms: ms(self.cfg.timeout),
            round,
            nodes,
        }
    }

    /// Publishes `status` unless a round that started later is already
    /// published (`force`: a node-set change, which keeps the round info).
    fn publish(&self, status: ClusterStatus, force: bool) {
        let Ok(mut published) = self.published.write() else {
            return;
        };
        let newer = match (&status.round, &published.round) {
            (Some(new), Some(old)) => new.seq >= old.seq,
            (Some(_), None) => true,
            (None, _) => force,
        };
        if newer || force {
            *published = Arc::new(status);
        }
    }

    /// The ICMP prober for the source namespace as it is now.
    fn icmp(&self) -> Result<Arc<IcmpProber>, ProbeError> {
        use std::os::unix::fs::MetadataExt as _;
        let ino = match &self.cfg.source_netns {
            Some(ns) => std::fs::metadata(ns.path())
                .map_err(|e| {
                    ProbeError::Namespace(format!("probe namespace {}: {e}", ns.path().display()))
                })?
                .ino(),
            None => 0,
        };
        let mut slot = self.icmp.lock().map_err(|_| ProbeError::ReceiverStopped)?;
        if let Some((at, p)) = slot.as_ref()
            && *at == ino
        {
            return Ok(p.clone());
        }
        let p = Arc::new(
            IcmpProber::new(self.cfg.source_netns.as_ref())
                .map_err(|e| ProbeError::io("ICMP socket", &e))?,
        );
        *slot = Some((ino, p.clone()));
        Ok(p)
    }

    /// Runs one round over the current node set and publishes it.
    pub async fn round(self: &Arc<Self>) -> Arc<ClusterStatus> {
        let _one_at_a_time = self.round_lock.lock().await;
        let seq = self
            .round_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let started = SystemTime::now();
        let started_mono = crate::datapath::monotonic_ns().unwrap_or(0);
        let t0 = Instant::now();
        let nodes = self.nodes();
        let sem = Arc::new(Semaphore::new(self.cfg.max_in_flight.max(1)));
        let mut tasks = JoinSet::new();
        for node in nodes.iter() {
            for (target, ip) in [
                (Target::Host, node.node_ip),
                (Target::Endpoint, node.health_ip),
            ] {
                for proto in [Proto::Icmp, Proto::Http] {
                    let me = self.clone();
                    let sem = sem.clone();
                    let key = (node.name.clone(), target, proto);
                    let jitter = self.cfg.spread.mul_f64(fastrand::f64());
                    tasks.spawn(async move {
                        tokio::time::sleep(jitter).await;
                        let _permit = sem.acquire().await;
                        let outcome = me.probe(ip, proto).await;
                        (key, ip, outcome)
                    });
                }
            }
        }
        // The kernel's RTT map, opened once for the whole round.
        let kernel = self.cfg.kernel_rtt.as_deref().and_then(KernelRtt::open);
        let mut outcomes = Vec::with_capacity(tasks.len());
        while let Some(res) = tasks.join_next().await {
            if let Ok((key, ip, outcome)) = res {
                let proto = key_proto(&key);
                outcomes.push((
                    key,
                    with_kernel_rtt(kernel.as_ref(), ip, proto, outcome, started_mono),
                ));
            }
        }
        let at = epoch_ms(SystemTime::now());
        let probes = outcomes.len();
        // A node removed during the round is not brought back.
        let current = self.nodes();
        if let Ok(mut paths) = self.paths.lock() {
            for (key, outcome) in outcomes {
                if current.contains(&key.0) {
                    paths
                        .entry(key)
                        .or_default()
                        .record(outcome, self.cfg.thresholds, at);
                }
            }
        }
        let status = self.snapshot(Some(RoundInfo {
            seq,
            started_ms: epoch_ms(started),
            duration_ms: ms(t0.elapsed()),
            probes,
        }));
        self.publish(status, false);
        self.status()
    }

    async fn probe(&self, ip: Ipv4Addr, proto: Proto) -> Outcome {
        match proto {
            Proto::Icmp => {
                let icmp = match self.icmp() {
                    Ok(p) => p,
                    Err(e) => return Outcome::Failed(e),
                };
                match icmp.echo(ip, self.cfg.timeout).await {
                    Ok(rtt) => Outcome::Ok {
                        rtt,
                        warning: None,
                        source: RttSource::Userspace,
                    },
                    Err(e) => Outcome::Failed(e),
                }
            }
            Proto::Http => {
                http::probe(
                    ip,
                    self.cfg.http_port,
                    self.cfg.timeout,
                    self.cfg.source_netns.as_ref(),
                )
                .await
            }
        }
    }
}

/// Replaces a user-space RTT by the kernel's sample of the same round
/// (ICMP: the echo; HTTP: the TCP handshake), when there is one.
fn with_kernel_rtt(
    kernel: Option<&KernelRtt>,
    ip: Ipv4Addr,
    proto: u8,
    outcome: Outcome,
    since: u64,
) -> Outcome {
    match (outcome, kernel) {
        (Outcome::Ok { warning, rtt, .. }, Some(k)) => {
            match k.last_sample_since(ip, proto, since) {
                Some(kernel_rtt) => Outcome::Ok {
                    rtt: kernel_rtt,
                    warning,
                    source: RttSource::Kernel,
                },
                None => Outcome::Ok {
                    rtt,
                    warning,
                    source: RttSource::Userspace,
                },
            }
        }
        (other, _) => other,
    }
}
