//! `health-agent daemon`: the long-running agent.
//!
//! Order matters: the pidfile and API socket come first (stale ones from a
//! crash are cleared), so the socket answers while the endpoint is still
//! being created; then the endpoint; then the controller, which runs every
//! interval and on every link event; SIGINT/SIGTERM disconnects.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use tokio::sync::{Mutex, mpsc};
use tracing::{debug, error, info, warn};

use crate::{
    api,
    endpoint::{Endpoint, EndpointConfig, shared_view},
    errors::chain,
    netlink::watch_links,
    pidfile::Pidfile,
    signals::wait_for_shutdown,
};

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub endpoint: EndpointConfig,
    pub socket: PathBuf,
    pub pidfile: PathBuf,
    pub controller_interval: Duration,
    pub keep_endpoint: bool,
}

/// Runs until SIGINT or SIGTERM.
pub async fn run(cfg: DaemonConfig) -> anyhow::Result<()> {
    let _pidfile = Pidfile::acquire(&cfg.pidfile, &cfg.socket)?;
    let view = shared_view();
    let (_socket, api_task) = api::server::bind(&cfg.socket, view.clone())?;
    info!(socket = %cfg.socket.display(), "API listening");

    let ep_cfg = cfg.endpoint.clone();
    let endpoint = tokio::task::spawn_blocking(move || Endpoint::start(ep_cfg, view))
        .await
        .context("the endpoint task panicked")?
        .context("creating the health endpoint")?;
    info!(
        id = endpoint.record().id,
        ipv4 = %endpoint.record().ipv4,
        netns = %endpoint.record().netns,
        "health endpoint ready"
    );
    let endpoint = Arc::new(Mutex::new(endpoint));

    let (events_tx, events_rx) = mpsc::channel(1);
    let watcher = tokio::spawn(async move {
        if let Err(e) = watch_links(events_tx).await {
            warn!("link events unavailable, relying on the interval alone: {e}");
        }
    });
    let controller = tokio::spawn(controller(
        endpoint.clone(),
        cfg.controller_interval,
        events_rx,
    ));

    let signal = wait_for_shutdown().await?;
    info!(signal, "shutting down");
    controller.abort();
    watcher.abort();
    let keep = cfg.keep_endpoint;
    let mut ep = endpoint.lock_owned().await;
    tokio::task::spawn_blocking(move || ep.shutdown(keep, &format!("agent received {signal}")))
        .await
        .context("the shutdown task panicked")??;
    api_task.abort();
    Ok(())
}

/// Runs the endpoint's check-and-repair every `interval`, and shortly after
/// any link event in the node's namespace.
async fn controller(
    endpoint: Arc<Mutex<Endpoint>>,
    interval: Duration,
    mut events: mpsc::Receiver<()>,
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
