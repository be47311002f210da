//! An etcd election (etcd's v3election API through `etcd-client`) on a
//! short lease of its own, apart from the agent's registration lease: a
//! candidate killed with SIGKILL loses the role when that lease ends, in
//! seconds; one that stops resigns at once.
//!
//! [`KvStore::campaign`] runs one candidate for as long as it is asked to:
//! it grants the lease, keeps it alive, campaigns (waiting while another
//! candidate leads), publishes [`Role::Leader`] once elected, and starts
//! over (with backoff) when the lease or the connection is lost.
//! [`KvStore::put_if_leader`] writes a key only while the leader's
//! election key still exists with its creation revision: a transaction,
//! so that a deposed leader that does not know it yet never writes.

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, LeaderKey, PutOptions, ResignOptions, Txn, TxnOp};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{BACKOFF_MIN, KvError, KvStore, call_error, timed};

/// The shortest election lease (etcd raises shorter ones to about this).
pub const MIN_ELECTION_TTL: Duration = Duration::from_secs(2);

/// This candidate's place in the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Campaigning, or not connected: another candidate may lead.
    Candidate,
    /// Elected: its election key and that key's creation revision.
    Leader(Leadership),
}

/// What a leader holds: the proof [`KvStore::put_if_leader`] checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub name: Vec<u8>,
    pub key: Vec<u8>,
    pub rev: i64,
    pub lease: i64,
}

/// Why a conditional write was not made.
#[derive(Debug, thiserror::Error)]
pub enum LeaderPutError {
    #[error("no longer the leader: the election key {key:?} is gone or replaced")]
    Deposed { key: String },
    #[error(transparent)]
    Kv(#[from] KvError),
}

impl KvStore {
    /// Campaigns in election `name` with `value` (the candidate's name) on
    /// a lease of `ttl` until `stop`, publishing the role in `role`; then
    /// resigns (if leading) and revokes the election lease.
    pub async fn campaign(
        &self,
        name: &[u8],
        value: &[u8],
        ttl: Duration,
        role: &watch::Sender<Role>,
        deposed: &Notify,
        stop: &CancellationToken,
    ) {
        let ttl = ttl.max(MIN_ELECTION_TTL);
        let (mut backoff, mut down) = (BACKOFF_MIN, false);
        // Failing since the last attempt that held a lease for a TTL: the
        // first failure is a warning (etcd away, no permission for the
        // election's prefix), the retries are not.
        let mut failing = false;
        loop {
            let started = Instant::now();
            // Not raced with `stop`: it resigns when stopped.
            let outcome = Box::pin(self.campaign_once(name, value, ttl, role, deposed, stop)).await;
            role.send_replace(Role::Candidate);
            match outcome {
                Ok(()) => return,
                Err(e) => {
                    if started.elapsed() > ttl {
                        backoff = BACKOFF_MIN;
                        failing = false;
                    }
                    let election = String::from_utf8_lossy(name);
                    if failing {
                        debug!("election {election:?}: {e}");
                    } else {
                        warn!(
                            "election {election:?}: {e}; campaigning again with backoff (logged once until it holds)"
                        );
                        failing = true;
                    }
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                next = self.back_off(backoff, &mut down) => backoff = next,
            }
        }
    }

    /// One lease: granted, kept alive while campaigning and leading, and
    /// given up (resigned, revoked) at `stop`. Ends with the lease.
    async fn campaign_once(
        &self,
        name: &[u8],
        value: &[u8],
        ttl: Duration,
        role: &watch::Sender<Role>,
        deposed: &Notify,
        stop: &CancellationToken,
    ) -> Result<(), KvError> {
        let setup = async {
            let client = self.ready_client().await?;
            let mut leases = client.lease_client();
            let ttl_s = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
            let lease = timed("granting the election lease", leases.grant(ttl_s, None))
                .await?
                .id();
            let kept = timed("keeping the election lease alive", leases.keep_alive(lease)).await?;
            Ok::<_, KvError>((client, leases, lease, kept))
        };
        // Stopped before a lease was granted: nothing to give up.
        let (client, mut leases, lease, (mut keeper, mut stream)) = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            r = setup => r?,
        };
        let mut elections = client.election_client();
        let campaign = elections.campaign(name.to_vec(), value.to_vec(), lease);
        tokio::pin!(campaign);
        let mut leader: Option<LeaderKey> = None;
        let mut tick = tokio::time::interval(ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut answered = Instant::now();
        let result = loop {
            tokio::select! {
                () = stop.cancelled() => break Ok(()),
                () = deposed.notified(), if leader.is_some() => break Err(KvError::Call {
                    op: "leading".into(),
                    detail: "deposed (the election key gone or replaced), or handing the role over"
                        .into(),
                }),
                r = &mut campaign, if leader.is_none() => {
                    let key = r
                        .map_err(call_error("campaigning"))?
                        .take_leader()
                        .ok_or_else(|| KvError::Call {
                            op: "campaigning".into(),
                            detail: "etcd named no leader key".into(),
                        })?;
                    info!(
                        election = %String::from_utf8_lossy(name),
                        key = %String::from_utf8_lossy(key.key()),
                        "elected"
                    );
                    // A deposal told of an earlier leadership (its leader's
                    // write refused after this campaign had ended) is no
                    // news of this one.
                    {
                        let stale = deposed.notified();
                        tokio::pin!(stale);
                        stale.as_mut().enable();
                    }
                    role.send_replace(Role::Leader(Leadership {
                        name: key.name().to_vec(),
                        key: key.key().to_vec(),
                        rev: key.rev(),
                        lease: key.lease(),
                    }));
                    leader = Some(key);
                }
                _ = tick.tick() => {
                    if answered.elapsed() > ttl {
                        break Err(KvError::KeepaliveSilent { lease, waited: ttl });
                    }
                    if let Err(e) = keeper.keep_alive().await {
                        break Err(call_error("keeping the election lease alive")(e));
                    }
                }
                msg = stream.message() => match msg {
                    Ok(Some(r)) if r.ttl() <= 0 => break Err(KvError::LeaseExpired { lease }),
                    Ok(Some(_)) => answered = Instant::now(),
                    Ok(None) => break Err(KvError::StreamEnded { what: "election lease keepalive" }),
                    Err(e) => break Err(call_error("keeping the election lease alive")(e)),
                },
            }
        };
        if result.is_err() {
            // A lease that still lives (a deposed leader) goes now.
            let _ = timed("revoking the election lease", leases.revoke(lease)).await;
            if leader.is_some() {
                warn!(
                    election = %String::from_utf8_lossy(name),
                    "no longer the leader: the election lease lost, the key gone, or the role handed over"
                );
            }
            return result;
        }
        // Stopping: hand the role over at once rather than after the TTL.
        role.send_replace(Role::Candidate);
        if let Some(key) = leader {
            let mut resigner = client.election_client();
            let resign = resigner.resign(Some(ResignOptions::new().with_leader(key)));
            if let Err(e) = timed("resigning", resign).await {
                warn!("election: {e}");
            }
        }
        let _ = timed("revoking the election lease", leases.revoke(lease)).await;
        Ok(())
    }

    /// Puts `key` = `value` on the election lease (the key goes with the
    /// role) if `leader`'s election key still exists with its creation
    /// revision.
    pub async fn put_if_leader(
        &self,
        leader: &Leadership,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<(), LeaderPutError> {
        let key = key.into();
        let client = self.client().await?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                leader.key.clone(),
                CompareOp::Equal,
                leader.rev,
            )])
            .and_then([TxnOp::put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(leader.lease)),
            )]);
        let r = timed(
            format!("writing {}", String::from_utf8_lossy(&key)),
            client.kv_client().txn(txn),
        )
        .await?;
        if r.succeeded() {
            Ok(())
        } else {
            Err(LeaderPutError::Deposed {
                key: String::from_utf8_lossy(&leader.key).into_owned(),
            })
        }
    }
}
