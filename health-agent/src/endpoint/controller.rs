//! The endpoint's controller, as Cilium's: it creates (or restores) the
//! endpoint, serves the endpoint's own :4240 hello server inside its
//! namespace, checks and repairs everything every interval and shortly
//! after any link event, and on shutdown removes the endpoint (or keeps it
//! for the next agent).

use std::time::Duration;

use tokio::{net::TcpListener, sync::broadcast, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

use super::{ControllerRun, Endpoint, EndpointConfig, EndpointError, SharedView};
use crate::{
    datapath::DatapathHandle,
    probe::hello,
    supervisor::Problem,
    sys::netns::Netns,
    util::{
        errors::chain,
        reclaim::{Owned, Remove},
    },
};

/// While the record cannot be saved, the controller runs (and tries the
/// save again) this often.
const SAVE_AGAIN: Duration = Duration::from_secs(2);

/// What the controller needs besides the endpoint's configuration.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub endpoint: EndpointConfig,
    /// Period of the check-and-repair.
    pub interval: Duration,
    /// Port of the endpoint's hello server.
    pub http_port: u16,
    /// The node its hello server's answers name (none: they name none).
    pub node: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("binding the hello server on port {port} in {netns}")]
    Bind {
        port: u16,
        netns: String,
        source: std::io::Error,
    },
    #[error("endpoint work panicked: {0}")]
    Panicked(String),
}

/// Runs the endpoint until `shutdown`, its programs attached through
/// `kernel`; `ready` is called once it is ready and its hello server
/// listens.
pub async fn run(
    cfg: ControllerConfig,
    kernel: DatapathHandle,
    view: SharedView,
    mut link_events: broadcast::Receiver<()>,
    problem: Problem,
    shutdown: CancellationToken,
    ready: impl FnOnce() + Send,
) -> Result<(), ControllerError> {
    let ep_cfg = cfg.endpoint.clone();
    let stop = shutdown.clone();
    let started = blocking(move || {
        let mut endpoint = Endpoint::start(ep_cfg, kernel, view)?;
        if stop.is_cancelled() {
            // Asked to stop while starting: past the shutdown deadline this
            // task's future is gone and only this closure is left (the
            // runtime waits for it), so it removes what it made.
            endpoint.shutdown("the agent stopped while the endpoint started")?;
            return Ok(None);
        }
        Ok(Some(endpoint))
    })
    .await?;
    let Some(endpoint) = started else {
        return Ok(());
    };
    // From here the endpoint goes with this task if it is aborted.
    let mut endpoint = Owned::new(endpoint);
    info!(
        id = endpoint.record().id,
        addresses = %endpoint.record().addresses(),
        netns = %endpoint.record().netns,
        "health endpoint ready"
    );
    let netns = Netns::named(&cfg.endpoint.netns_name).map_err(EndpointError::from)?;
    let mut hello = match Hello::serve(netns, (cfg.http_port, &cfg.node), &shutdown) {
        Ok(r) => r,
        Err(e) => {
            // Nothing may stay behind a failed start.
            let _ =
                blocking(move || endpoint.release().shutdown("the endpoint could not start")).await;
            return Err(e);
        }
    };
    ready();
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; the endpoint was just made
    let mut unsaved = false;
    let result = loop {
        let trigger = tokio::select! {
            () = shutdown.cancelled() => break Ok(()),
            _ = tick.tick() => "interval",
            () = tokio::time::sleep(SAVE_AGAIN), if unsaved => "record not saved",
            Ok(()) = link_events.recv() => {
                // Let a burst of events (a veth pair going away) settle.
                tokio::time::sleep(Duration::from_millis(100)).await;
                drain(&mut link_events);
                "link event"
            }
        };
        let timeout = cfg
            .interval
            .clamp(Duration::from_millis(200), Duration::from_secs(1));
        let (ep, result) = match check_and_repair(endpoint, timeout).await {
            Ok(done) => done,
            // The endpoint's state went with the panic; its plumbing stays
            // for the restarted task, which restores it (and binds the
            // hello server again: this one goes).
            Err(e) => {
                hello.server.abort();
                return Err(ControllerError::Panicked(e.to_string()));
            }
        };
        endpoint = ep;
        unsaved = endpoint.unsaved().is_some();
        problem.set(endpoint.unsaved().map(|e| {
            format!(
                "the endpoint's record is not saved ({e}): the endpoint runs on, but an agent \
                 restarted now could not prove its objects its own"
            )
        }));
        after_run(result, trigger);
        let proven = endpoint
            .record()
            .owned
            .as_ref()
            .and_then(|o| o.netns.as_ref())
            .map(|p| (p.dev, p.ino));
        hello.follow(proven, &shutdown);
        // The run's own changes (a recreated veth, re-attached programs)
        // raise link events: they must not trigger the next run.
        tokio::time::sleep(Duration::from_millis(50)).await;
        drain(&mut link_events);
    };
    hello.server.abort();
    let reason = if result.is_ok() {
        "the agent is stopping"
    } else {
        "the controller failed"
    };
    blocking(move || {
        let _mark = crate::util::reclaim::busy();
        endpoint.release().shutdown(reason)
    })
    .await?;
    result
}

impl Remove for Endpoint {
    fn remove(mut self, why: &str) {
        if let Err(e) = self.shutdown(why) {
            error!("removing the endpoint: {}", chain(&e));
        }
    }
}

/// The endpoint's hello server, and the namespace it listens in: bound
/// again whenever the endpoint's name comes to stand for another (a
/// repair made it anew), whether or not the rest of that repair went
/// through.
struct Hello {
    server: JoinHandle<()>,
    netns: Netns,
    port: u16,
    node: String,
    bound_in: Option<(u64, u64)>,
}

impl Hello {
    fn serve(
        netns: Netns,
        (port, node): (u16, &str),
        shutdown: &CancellationToken,
    ) -> Result<Self, ControllerError> {
        let bound_in = netns_identity(&netns);
        let server = serve_hello(&netns, (port, node), shutdown)?;
        Ok(Self {
            server,
            netns,
            port,
            node: node.to_owned(),
            bound_in,
        })
    }

    /// Binds the server again when the endpoint's namespace is another
    /// than the one it listens in, and the one the record proves (`proven`:
    /// a namespace someone else put at the name is never served in); one
    /// that cannot be bound is tried again at the next call.
    fn follow(&mut self, proven: Option<(u64, u64)>, shutdown: &CancellationToken) {
        let now_in = netns_identity(&self.netns);
        if now_in.is_none() || now_in == self.bound_in || now_in != proven {
            return;
        }
        self.server.abort();
        match serve_hello(&self.netns, (self.port, &self.node), shutdown) {
            Ok(server) => {
                self.server = server;
                self.bound_in = now_in;
                info!("the endpoint's hello server listens in its new namespace");
            }
            Err(e) => {
                error!("binding the endpoint's hello server again: {}", chain(&e));
                self.bound_in = None;
            }
        }
    }
}

/// The namespace `netns` names now (the device and inode of its nsfs
/// file): `None` while it names none.
fn netns_identity(netns: &Netns) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(netns.path())
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// A controller run's outcome, logged.
fn after_run(result: Result<ControllerRun, EndpointError>, trigger: &str) {
    match result {
        Ok(run) if run.repaired => {
            info!(trigger, missing = ?run.missing, "controller repaired the endpoint");
        }
        Ok(_) => debug!(trigger, "controller: endpoint in place"),
        Err(e) => error!(
            trigger,
            "controller could not repair the endpoint: {}",
            chain(&e)
        ),
    }
}

fn drain(events: &mut broadcast::Receiver<()>) {
    while !matches!(
        events.try_recv(),
        Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed)
    ) {}
}

/// One controller run on a blocking thread. Stopped past its deadline
/// meanwhile, this task is gone and the run's output with it: the
/// endpoint is then removed (`Owned`). The run is marked busy, so that the
/// agent waits for it, and for that removal, before it lets go of its
/// pidfile.
async fn check_and_repair(
    mut ep: Owned<Endpoint>,
    timeout: Duration,
) -> Result<(Owned<Endpoint>, Result<ControllerRun, EndpointError>), tokio::task::JoinError> {
    tokio::task::spawn_blocking(move || {
        let mark = crate::util::reclaim::busy();
        let r = ep.check_and_repair(timeout);
        (ep, r, mark)
    })
    .await
    .map(|(ep, r, _mark)| (ep, r))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, EndpointError> + Send + 'static,
) -> Result<T, ControllerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ControllerError::Panicked(e.to_string()))?
        .map_err(ControllerError::from)
}

/// The :4240 hello server inside the endpoint's namespace: the listening
/// socket is created there, then served from the runtime.
fn serve_hello(
    netns: &Netns,
    (port, node): (u16, &str),
    shutdown: &CancellationToken,
) -> Result<JoinHandle<()>, ControllerError> {
    let bind_err = |source| ControllerError::Bind {
        port,
        netns: netns.path().display().to_string(),
        source,
    };
    let std_listener = netns
        .run(|| hello::listen(port))
        .map_err(EndpointError::from)?
        .map_err(bind_err)?;
    let listener = TcpListener::from_std(std_listener).map_err(bind_err)?;
    let (shutdown, node) = (shutdown.child_token(), node.to_owned());
    Ok(tokio::spawn(async move {
        hello::serve(listener, shutdown, &node).await;
    }))
}
