//! The etcd calls of an agent, as `KvStore` makes them: its connection,
//! its lease and the lease's keepalives, and its watch of the summaries.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use anyhow::{Context as _, ensure};
use etcd_client::{
    Client, ConnectOptions, LeaseKeepAliveStream, LeaseKeeper, WatchOptions, WatchStream,
};
use health_agent::membership::kvstore::REQUEST_TIMEOUT;
use tokio_util::sync::CancellationToken;

use super::{LEASE_TTL, measure::Shared};

pub(super) async fn connect(endpoint: &str) -> anyhow::Result<Client> {
    // The agent's options (`KvStore`).
    let opts = ConnectOptions::new()
        .with_connect_timeout(REQUEST_TIMEOUT)
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
        .with_keep_alive_while_idle(false);
    Client::connect([format!("http://{endpoint}")], Some(opts))
        .await
        .with_context(|| format!("connecting to etcd at {endpoint}"))
}

/// An agent's lease, granted, and its keepalive stream.
pub(super) async fn lease(
    client: Client,
) -> anyhow::Result<(i64, LeaseKeeper, LeaseKeepAliveStream)> {
    let mut leases = client.lease_client();
    let ttl = i64::try_from(LEASE_TTL.as_secs()).unwrap_or(i64::MAX);
    let id = tokio::time::timeout(REQUEST_TIMEOUT, leases.grant(ttl, None))
        .await
        .context("granting a lease: no answer")??
        .id();
    let (keeper, answers) = tokio::time::timeout(REQUEST_TIMEOUT, leases.keep_alive(id))
        .await
        .context("keeping a lease alive: no answer")??;
    Ok((id, keeper, answers))
}

/// Keeps a lease alive every third of its TTL (as `KvStore`), until `stop`.
pub(super) async fn keep_alive(
    mut keeper: LeaseKeeper,
    mut answers: LeaseKeepAliveStream,
    stop: CancellationToken,
    shared: Arc<Shared>,
) {
    let mut tick = tokio::time::interval(LEASE_TTL / 3);
    tick.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => if keeper.keep_alive().await.is_err() {
                shared.keepalive_errors.fetch_add(1, Ordering::Relaxed);
            },
            msg = answers.message() => if !matches!(msg, Ok(Some(ref r)) if r.ttl() > 0) {
                shared.keepalive_errors.fetch_add(1, Ordering::Relaxed);
                return;
            },
        }
    }
}

/// A watch of the summaries prefix from `revision`, once etcd has created it.
pub(super) async fn open_watch(
    client: Client,
    prefix: String,
    revision: i64,
) -> anyhow::Result<WatchStream> {
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision);
    let mut stream = tokio::time::timeout(
        REQUEST_TIMEOUT,
        client.watch_client().watch(prefix, Some(opts)),
    )
    .await
    .context("opening a watch: no answer")??;
    let first = tokio::time::timeout(REQUEST_TIMEOUT, stream.message())
        .await
        .context("creating a watch: no answer")??
        .context("the watch ended before it was created")?;
    ensure!(
        first.created() && !first.canceled() && first.events().is_empty(),
        "the watch was not created: {}",
        first.cancel_reason()
    );
    Ok(stream)
}
