//! The kv store client: a generic etcd client (one lease, leased keys, prefix watches), its config.
//! Imported by membership's etcd discovery and by the layers above that keep keys in etcd.
//!
//! The agent's etcd client: etcd's v3 gRPC API through the `etcd-client`
//! crate, over one HTTP/2 connection for the agent's life (tonic
//! reconnects it underneath; the sessions below re-establish what lives on
//! it, with backoff). Optionally TLS (a CA, and a client certificate for
//! etcd's `--client-cert-auth`) and etcd's user/password authentication.
//!
//! A small generic API, shared by everything the agent keeps in etcd:
//!
//! - [`KvStore::run`] keeps **one lease** for this agent alive (the
//!   lease-keepalive stream) and every key written with
//!   [`KvStore::put_leased`] attached to it. When the lease is lost (etcd
//!   away longer than its TTL) a new one is granted and every leased key
//!   is written again (a lease kept through an outage gets only the keys
//!   that changed meanwhile); when the agent leaves, [`KvStore::revoke`]
//!   removes them all at once.
//! - [`KvStore::watch_prefix`] follows every key under a prefix: a
//!   [`WatchEvent::Snapshot`] (a range read at revision R, sent a page at
//!   a time as it is read, never gathered whole), then
//!   [`WatchEvent::Put`] / [`WatchEvent::Delete`] from the watch stream
//!   started at R + 1, so that no change is missed or seen twice. When the
//!   watch breaks ([`WatchEvent::Lost`], once per outage) or its revision
//!   is compacted, or when the receiver asks ([`KvStore::follow_prefix`],
//!   [`ReadAgain`]), the prefix is read again (a new `Snapshot`, which
//!   replaces everything the receiver holds) and the watch resumes after
//!   it.
//!
//! ```ignore
//! let store = KvStore::new(&cfg);
//! tokio::spawn({ let s = store.clone(); async move { s.run().await } });
//! store.put_leased("/health/summaries/node-1", summary_bytes).await?;
//! let mut events = store.watch_prefix("/health/summaries/");
//! while let Some(ev) = events.recv().await {
//!     match ev {
//!         WatchEvent::Snapshot { entries, first, last, .. } => { /* replace all, from first to last */ }
//!         WatchEvent::Put(entry) => { /* upsert entry.key */ }
//!         WatchEvent::Delete { key, .. } => { /* remove key */ }
//!         WatchEvent::Lost { error } => { /* stale until the next Snapshot */ }
//!     }
//! }
//! ```

use std::{
    collections::BTreeMap,
    fmt,
    fmt::Write as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use etcd_client::{Client, ConnectOptions, PutOptions};
use tokio::sync::{Mutex as AsyncMutex, watch};
use tracing::{info, warn};

pub use self::config::{
    Credentials, EtcdConfig, KvConfigError, LeaseFile, TlsConfig, beside, parse_endpoint,
};
pub use self::election::{LeaderPutError, Leadership, MIN_ELECTION_TTL, Role};
pub use self::follow::ReadAgain;
pub use self::listing::Listing;

mod config;
mod election;
mod follow;
mod keepalive;
mod kept_lease;
mod listing;

/// The file in the state directory holding the lease's ID (hex) and the
/// TTL it was asked for (s) between runs.
pub const LEASE_FILE: &str = "etcd-lease";

/// The longest any single request (not a stream) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a revocation at shutdown may take.
const REVOKE_TIMEOUT: Duration = Duration::from_secs(1);
/// Retries start this soon after a failure and double up to
/// [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(3);
/// While a retry backs off, etcd is asked this often (a `Status` request:
/// small, answered by any member without the raft log) whether it serves
/// again, so that the retry's real work (a lease session, a full listing)
/// starts once it does rather than at the end of the backoff.
const SERVING_CHECK: Duration = Duration::from_millis(400);
/// A session or a watch that was up and broke is tried again every
/// [`QUIET_RETRY_PAUSE`] for this long (through any member) before it backs
/// off.
const QUIET_FOR: Duration = Duration::from_secs(5);
/// The pause between those quick retries.
const QUIET_RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Events a watcher may hold unread before the watch waits for it.
const WATCH_BUFFER: usize = 1024;

/// What went wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("setting up the etcd client for {url}: {detail}")]
    Client { url: String, detail: String },
    #[error("authenticating to etcd as user {user:?}: {detail}")]
    Auth { user: String, detail: String },
    #[error("{op}: {detail}")]
    Call { op: String, detail: String },
    #[error("{op}: no answer from etcd in {}", humantime::format_duration(*timeout))]
    Timeout { op: String, timeout: Duration },
    #[error("lease {lease:x} expired")]
    LeaseExpired { lease: i64 },
    #[error("no keepalive answer for lease {lease:x} in {}", humantime::format_duration(*waited))]
    KeepaliveSilent { lease: i64, waited: Duration },
    #[error("etcd closed the {what} stream")]
    StreamEnded { what: &'static str },
    #[error("etcd canceled the watch of {prefix:?}: {reason}")]
    WatchCanceled { prefix: String, reason: String },
}

impl KvError {
    /// Whether etcd was waited for and did not answer (rather than
    /// refused or failed at once).
    #[must_use]
    pub fn waited(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::KeepaliveSilent { .. })
    }
}

/// An `etcd-client` error as one readable line: a gRPC status's message
/// and its causes (the TLS or connection error), not its metadata.
fn describe(e: &etcd_client::Error) -> String {
    use std::error::Error as _;
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let mut out = if status.message().is_empty() {
                format!("{:?}", status.code())
            } else {
                status.message().to_owned()
            };
            let mut source = status.source();
            while let Some(cause) = source {
                let text = cause.to_string();
                // tonic's own wrapper ("transport error") says nothing more.
                if !out.contains(&text) && text != "transport error" {
                    let _ = write!(out, ": {text}");
                }
                source = cause.source();
            }
            out
        }
        etcd_client::Error::TransportError(t) => crate::util::errors::chain(t),
        other => other.to_string(),
    }
}

fn call_error(op: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> KvError {
    move |e| KvError::Call {
        op: op.into(),
        detail: describe(&e),
    }
}

/// `fut`, or [`KvError::Timeout`] after [`REQUEST_TIMEOUT`].
async fn timed<T>(
    op: impl Into<String>,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, KvError> {
    let op = op.into();
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(r) => r.map_err(call_error(op)),
        Err(_) => Err(KvError::Timeout {
            op,
            timeout: REQUEST_TIMEOUT,
        }),
    }
}

/// How a session came by its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Got {
    /// Granted now.
    Granted,
    /// This agent's, kept through an outage.
    Kept,
    /// The last run's, confirmed this node's and taken over.
    TakenOver,
}

/// The lease session's state, as [`KvStore::link`] publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// Not connected yet.
    Connecting,
    /// Connected, with this agent's lease alive and every leased key written.
    Up { lease: i64 },
    /// Lost; retrying with backoff. The error is the outage's first.
    Down { error: String },
}

/// Whether [`KvStore::put_leased`] wrote the value now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// In etcd, under the current lease.
    Written,
    /// No lease yet (or etcd away): written as soon as the lease session is up.
    Pending,
}

/// One key and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// The revision of the key's last change.
    pub mod_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

impl Entry {
    /// The key as text (invalid UTF-8 replaced).
    #[must_use]
    pub fn key_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.key)
    }
}

/// What [`KvStore::watch_prefix`] delivers, in revision order.
#[derive(Debug, Clone)]
pub enum WatchEvent {
    /// Every key under the prefix at `revision`, in key order, a page of
    /// at most 500 keys at a time: the first events, and again after a
    /// `Lost`, a compaction or a [`ReadAgain`]. The pages of one listing replace, together,
    /// everything the receiver holds: from the `first` to the `last`, which
    /// comes once the watch follows on from `revision`. A listing that
    /// breaks off is followed by a new one (its `first` page again), maybe
    /// after a `Lost`, never by the watch's events.
    Snapshot {
        revision: i64,
        entries: Vec<Entry>,
        first: bool,
        last: bool,
    },
    /// A key was created or changed.
    Put(Entry),
    /// A key was deleted (or its lease ended) at `revision`.
    Delete { key: Vec<u8>, revision: i64 },
    /// The watch broke (etcd away, refused, ...): what the receiver holds
    /// may go stale until the next `Snapshot`. Sent once per outage.
    Lost { error: Arc<KvError> },
}

#[cfg(test)]
impl WatchEvent {
    /// A put of `value` at `key`, at revision 1, with no lease.
    pub(crate) fn put_at(key: &str, value: Vec<u8>) -> Self {
        Self::Put(Entry {
            key: key.as_bytes().to_vec(),
            value,
            mod_revision: 1,
            lease: 0,
        })
    }
}

/// The agent's etcd client and lease; cloning shares both. See the module
/// documentation.
#[derive(Clone)]
pub struct KvStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Every member's client URL, and them as one text for logs.
    urls: Vec<String>,
    url: String,
    lease_ttl: Duration,
    tls: Option<TlsConfig>,
    credentials: Option<Credentials>,
    /// Made on first use, then kept: one connection for the agent's life.
    client: AsyncMutex<Option<Client>>,
    /// The user has been authenticated on `client` once (the crate then
    /// refreshes expired tokens by itself).
    authenticated: AsyncMutex<bool>,
    /// Every key written with the lease, with its latest value.
    leased: AsyncMutex<BTreeMap<Vec<u8>, Leased>>,
    /// The revision of each leased key's last write by this agent: read
    /// without waiting for writes under way (see
    /// [`KvStore::written_revision`]).
    revisions: Mutex<BTreeMap<Vec<u8>, i64>>,
    /// The lease being kept alive: one this agent was granted, or took
    /// over once etcd confirmed it its own.
    lease: Mutex<Option<i64>>,
    /// The lease the lease file named at start, until it has been asked
    /// of etcd (see [`kept_lease`]).
    kept: Mutex<Option<kept_lease::Kept>>,
    /// Where the lease's ID is kept between runs, and the keys that make a
    /// lease this node's.
    lease_file: Option<LeaseFile>,
    /// This boot's ID, written beside a kept lease: the next run takes the
    /// lease over only in the same boot (`None`: unreadable, so never).
    boot: Option<Box<str>>,
    link: watch::Sender<Link>,
    running: AtomicBool,
}

/// A leased key's latest value, and the lease it was last written under
/// (`None`: not written since it changed, or never).
struct Leased {
    value: Vec<u8>,
    written: Option<i64>,
}

impl fmt::Debug for KvStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvStore")
            .field("url", &self.inner.url)
            .field("lease", &self.lease())
            .finish_non_exhaustive()
    }
}

impl KvStore {
    /// A client for `cfg`'s etcd; nothing is sent before it is used.
    #[must_use]
    pub fn new(cfg: &EtcdConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                urls: cfg.urls(),
                url: cfg.urls().join(","),
                lease_ttl: cfg.lease_ttl.max(Duration::from_secs(2)),
                tls: cfg.tls.clone(),
                credentials: cfg.credentials.clone(),
                client: AsyncMutex::new(None),
                authenticated: AsyncMutex::new(false),
                leased: AsyncMutex::new(BTreeMap::new()),
                revisions: Mutex::new(BTreeMap::new()),
                lease: Mutex::new(None),
                kept: Mutex::new(
                    cfg.lease_file
                        .as_ref()
                        .and_then(|f| kept_lease::read(&f.path)),
                ),
                lease_file: cfg.lease_file.clone(),
                boot: crate::sys::boot::id()
                    .ok()
                    .filter(|b| !b.is_empty())
                    .map(Into::into),
                link: watch::Sender::new(Link::Connecting),
                running: AtomicBool::new(false),
            }),
        }
    }

    /// `http(s)://host:port`, comma-separated when etcd has several
    /// members.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The lease kept alive now, if any.
    #[must_use]
    pub fn lease(&self) -> Option<i64> {
        self.inner.lease.lock().ok().and_then(|l| *l)
    }

    /// The lease session's state, and its changes.
    #[must_use]
    pub fn link(&self) -> watch::Receiver<Link> {
        self.inner.link.subscribe()
    }

    /// The client, made on first use (no request is sent).
    async fn client(&self) -> Result<Client, KvError> {
        let mut slot = self.inner.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(REQUEST_TIMEOUT)
            // A silent peer (a partition, a frozen etcd) breaks the streams
            // within 15 s; etcd refuses pings more often than every 5 s.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(false)
            // A member cut off from its cluster ends the watches it serves
            // and answers no request, rather than keep a watch open with no
            // events: the client goes on through a member that has quorum.
            .with_require_leader(true)
            .with_auto_token_refresh(true);
        if let Some(tls) = &self.inner.tls {
            opts = opts.with_tls(tls.options());
        }
        let client = Client::connect(&self.inner.urls, Some(opts))
            .await
            .map_err(|e| KvError::Client {
                url: self.inner.url.clone(),
                detail: describe(&e),
            })?;
        *slot = Some(client.clone());
        Ok(client)
    }

    /// The client, with the user authenticated (once; the token is
    /// refreshed by the crate when etcd refuses it later).
    async fn ready_client(&self) -> Result<Client, KvError> {
        let client = self.client().await?;
        if let Some(creds) = &self.inner.credentials {
            let mut done = self.inner.authenticated.lock().await;
            if !*done {
                let mut c = client.clone();
                let auth = c.update_user(Some(creds.user_password()));
                let outcome = match tokio::time::timeout(REQUEST_TIMEOUT, auth).await {
                    Ok(r) => r.map_err(|e| describe(&e)),
                    Err(_) => Err(format!("no answer in {}s", REQUEST_TIMEOUT.as_secs())),
                };
                outcome.map_err(|detail| KvError::Auth {
                    user: creds.user().to_owned(),
                    detail,
                })?;
                *done = true;
            }
        }
        Ok(client)
    }

    /// Keeps this agent's lease alive and its leased keys written, forever
    /// (reconnecting with backoff; an outage is logged when it starts and
    /// when it ends, not at every retry). Run it once, for as long as the
    /// agent wants its keys in etcd; a second call only waits.
    pub async fn run(&self) {
        if self.inner.running.swap(true, Ordering::SeqCst) {
            return std::future::pending().await;
        }
        let (mut backoff, mut down) = (BACKOFF_MIN, false);
        // Until when a session that was up is retried every
        // QUIET_RETRY_PAUSE, not backing off: the client picks a member per
        // request, and while one member is gone (its process killed, the
        // leader with it) a few tries reach one that answers.
        let mut quiet_until = None;
        loop {
            let (was_up, err) = match self.session().await {
                Ok(never) => match never {},
                Err(e) => e,
            };
            if was_up {
                backoff = BACKOFF_MIN;
                quiet_until = Some(tokio::time::Instant::now() + QUIET_FOR);
            }
            self.mark_down(&err);
            if quiet_until.is_some_and(|until| tokio::time::Instant::now() < until) {
                // A try that waited out a silent member goes again at once:
                // the lease may have no more than a few such waits left.
                if !err.waited() {
                    tokio::time::sleep(QUIET_RETRY_PAUSE).await;
                }
                continue;
            }
            backoff = self.back_off(backoff, &mut down).await;
        }
    }

    /// Waits `backoff` before a retry, or less: until etcd serves again
    /// after a check found it not serving (`down`, kept by the caller
    /// across its retries). etcd is asked every [`SERVING_CHECK`], spread
    /// by a jitter of up to a quarter of it: an outage costs it one small
    /// request per waiting loop and check, and its end is seen within a
    /// check. A failure while etcd serves (a refused password, a missing
    /// permission) waits the whole backoff. Returns the next backoff: the
    /// shortest once etcd came back (a first retry that still fails, its
    /// leader just elected, is tried again soon), doubled otherwise.
    async fn back_off(&self, backoff: Duration, down: &mut bool) -> Duration {
        let until = tokio::time::Instant::now() + backoff;
        loop {
            let jitter = SERVING_CHECK.mul_f64(fastrand::f64() / 4.0);
            let next = (tokio::time::Instant::now() + SERVING_CHECK + jitter).min(until);
            tokio::time::sleep_until(next).await;
            if next >= until {
                return (backoff * 2).min(BACKOFF_MAX);
            }
            let serving = self.serving().await;
            if serving && *down {
                *down = false;
                return BACKOFF_MIN;
            }
            *down = !serving;
        }
    }

    /// Whether a member answers `Status` naming a leader (within
    /// [`SERVING_CHECK`]).
    async fn serving(&self) -> bool {
        let Ok(client) = self.client().await else {
            return false;
        };
        let mut maintenance = client.maintenance_client();
        matches!(
            tokio::time::timeout(SERVING_CHECK, maintenance.status()).await,
            Ok(Ok(s)) if s.leader() != 0
        )
    }

    fn mark_up(&self, lease: i64, how: Got, keys: usize) {
        let ttl = self.inner.lease_ttl.as_secs();
        let new_lease = how == Got::Granted;
        let lease_hex = format!("{lease:x}");
        self.inner.link.send_modify(|link| {
            match link {
                // Whether the link was down (a first try that failed) or
                // connecting.
                Link::Down { .. } | Link::Connecting if how == Got::TakenOver => info!(
                    url = %self.inner.url, lease = %lease_hex, keys,
                    "connected to etcd, the last run's lease taken over"
                ),
                Link::Down { .. } => info!(
                    url = %self.inner.url, lease = %lease_hex, keys, new_lease,
                    "etcd reachable again"
                ),
                Link::Connecting => info!(
                    url = %self.inner.url, lease = %lease_hex, ttl_s = ttl, keys,
                    "connected to etcd, lease granted"
                ),
                Link::Up { .. } => {}
            }
            *link = Link::Up { lease };
        });
    }

    fn mark_down(&self, err: &KvError) {
        let error = crate::util::errors::chain(err);
        self.inner.link.send_if_modified(|link| {
            if matches!(link, Link::Down { .. }) {
                return false;
            }
            warn!(url = %self.inner.url, "etcd session down: {error}; retrying with backoff (logged once per outage)");
            *link = Link::Down { error };
            true
        });
    }

    /// One lease session: until the connection or the lease is lost.
    /// The flag says whether it got up.
    async fn session(&self) -> Result<std::convert::Infallible, (bool, KvError)> {
        let down = |e| (false, e);
        let client = self.ready_client().await.map_err(down)?;
        let mut leases = client.lease_client();
        let ttl = self.inner.lease_ttl;
        let ttl_s = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        // The last lease is kept when etcd still has it (a short outage,
        // an etcd restart): no key of this agent disappears meanwhile.
        let previous = self.lease();
        let adopted = match previous {
            Some(_) => None,
            None => self.adoptable(&mut leases, ttl_s).await.map_err(down)?,
        };
        // A kept lease's first keep-alive, and every one after it, waits
        // for its answer no longer than this: the next try may go through
        // another member. (A new lease has a whole TTL to live: its grant
        // and first keep-alive wait as any request.)
        let beat = keepalive::Beat::new(keepalive::answer_wait(ttl));
        let kept = match previous.or(adopted) {
            Some(id) => match tokio::time::timeout(beat.wait(), leases.keep_alive(id)).await {
                Ok(Ok(k)) => Some(k),
                Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => None,
                Ok(Err(e)) => return Err(down(call_error("keeping the lease alive")(e))),
                Err(_) => {
                    return Err(down(KvError::Timeout {
                        op: "keeping the lease alive".into(),
                        timeout: beat.wait(),
                    }));
                }
            },
            None => None,
        };
        let (keeper, stream) = if let Some(k) = kept {
            k
        } else {
            let grant = timed("granting a lease", leases.grant(ttl_s, None))
                .await
                .map_err(down)?;
            if let Ok(mut l) = self.inner.lease.lock() {
                *l = Some(grant.id());
            }
            self.save_lease(Some(kept_lease::Kept {
                id: grant.id(),
                ttl: Some(ttl_s),
                boot: self.inner.boot.clone(),
            }));
            timed("keeping the lease alive", leases.keep_alive(grant.id()))
                .await
                .map_err(down)?
        };
        let lease = keeper.id();
        let mut alive = keepalive::Keeping::new(leases, (keeper, stream), beat, ttl);
        // The lease is kept alive while the writes wait: a write that
        // waits out a member not serving (or another writer's, holding
        // the keys' lock) must not cost the lease it is for.
        let keys = tokio::select! {
            keys = self.put_all(&client, lease) => keys.map_err(down)?,
            e = alive.until_broken() => return Err(down(self.lost(e))),
        };
        // After the writes' revisions are kept: what waits for the link
        // to come up reads them then. Under the keys' lock: a key put
        // meanwhile waits, then is written with the lease, not left until
        // the lease session is made again.
        let how = if adopted == Some(lease) {
            Got::TakenOver
        } else if previous == Some(lease) {
            Got::Kept
        } else {
            Got::Granted
        };
        self.mark_up(lease, how, keys.len());
        drop(keys);
        Err((true, self.lost(alive.until_broken().await)))
    }

    /// `e`, which ended a lease session; the lease forgotten when it
    /// expired.
    fn lost(&self, e: KvError) -> KvError {
        if matches!(e, KvError::LeaseExpired { .. })
            && let Ok(mut l) = self.inner.lease.lock()
        {
            *l = None;
        }
        e
    }

    /// Keeps `lease` in the lease file (removes it with `None`), for the
    /// next run to take over.
    fn save_lease(&self, lease: Option<kept_lease::Kept>) {
        if let Some(file) = &self.inner.lease_file {
            kept_lease::save(&file.path, lease);
        }
    }

    /// The lease the lease file named, if etcd confirms it this node's to
    /// take over; asked once (again only when etcd did not answer).
    async fn adoptable(
        &self,
        leases: &mut etcd_client::LeaseClient,
        ttl_s: i64,
    ) -> Result<Option<i64>, KvError> {
        let kept = self.inner.kept.lock().ok().and_then(|k| k.clone());
        let (Some(file), Some(kept)) = (&self.inner.lease_file, kept) else {
            return Ok(None);
        };
        let id = kept.id;
        let this_boot = self.inner.boot.as_deref();
        let verdict = kept_lease::check(leases, kept, file, (ttl_s, this_boot)).await?;
        kept_lease::report(&verdict, id, &file.path);
        if let Ok(mut k) = self.inner.kept.lock() {
            *k = None;
        }
        if verdict != kept_lease::Verdict::Adopt {
            return Ok(None);
        }
        // This agent's from now on: a session that breaks before it is up
        // keeps it as its own lease.
        if let Ok(mut l) = self.inner.lease.lock() {
            *l = Some(id);
        }
        Ok(Some(id))
    }

    /// Writes every leased key not yet written under `lease` with its
    /// latest value: all of them under a new lease; under a lease kept
    /// through an outage, only those that changed meanwhile (the others
    /// are in etcd as long as the lease is). A session that comes back
    /// after a member's loss then needs one request that reaches a member
    /// left, not one per key, and a cluster's agents coming back together
    /// do not write every record again. Returns the keys, still locked.
    async fn put_all(
        &self,
        client: &Client,
        lease: i64,
    ) -> Result<tokio::sync::MutexGuard<'_, BTreeMap<Vec<u8>, Leased>>, KvError> {
        let mut leased = self.inner.leased.lock().await;
        let mut kv = client.kv_client();
        for (key, l) in leased.iter_mut().filter(|(_, l)| l.written != Some(lease)) {
            let put = timed(
                format!("writing {}", String::from_utf8_lossy(key)),
                kv.put(
                    key.clone(),
                    l.value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            )
            .await?;
            l.written = Some(lease);
            self.wrote(key, put.header());
        }
        Ok(leased)
    }

    /// Keeps the revision a write of `key` made (0 when etcd's answer
    /// has no header: then any revision counts as past it).
    fn wrote(&self, key: &[u8], header: Option<&etcd_client::ResponseHeader>) {
        let revision = header.map_or(0, etcd_client::ResponseHeader::revision);
        let mut revisions = self.revisions();
        match revisions.get_mut(key) {
            Some(r) => *r = revision,
            None => {
                revisions.insert(key.to_vec(), revision);
            }
        }
    }

    fn revisions(&self) -> std::sync::MutexGuard<'_, BTreeMap<Vec<u8>, i64>> {
        self.inner
            .revisions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The revision at which this agent last wrote `key` with its lease,
    /// if it has: a watcher of the key that has seen events up to it
    /// knows the write has reached it, and whatever differs there since
    /// was not written by this agent (another writer did, or the lease
    /// ended).
    #[must_use]
    pub fn written_revision(&self, key: &[u8]) -> Option<i64> {
        self.revisions().get(key).copied()
    }

    /// Puts `value` under `key` with this agent's lease: it stays while
    /// the agent does, is written again under a new lease after an outage
    /// that outlived the old one, and goes when the agent leaves (or dies:
    /// after the lease TTL). The latest value of every leased key is kept
    /// for that. Before the lease session is up, the value is only kept
    /// ([`Put::Pending`]); an error means etcd refused this write (the
    /// value is still kept and written with the next lease session).
    pub async fn put_leased(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<Put, KvError> {
        let (key, value) = (key.into(), value.into());
        let mut leased = self.inner.leased.lock().await;
        leased.insert(
            key.clone(),
            Leased {
                value: value.clone(),
                written: None,
            },
        );
        let Link::Up { lease } = *self.inner.link.borrow() else {
            return Ok(Put::Pending);
        };
        let client = self.client().await?;
        let put = timed(
            format!("writing {}", String::from_utf8_lossy(&key)),
            client.kv_client().put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            ),
        )
        .await?;
        if let Some(l) = leased.get_mut(&key) {
            l.written = Some(lease);
        }
        self.wrote(&key, put.header());
        drop(leased);
        Ok(Put::Written)
    }

    /// Removes a key written with [`Self::put_leased`] (from etcd and from
    /// the keys the lease session writes).
    pub async fn delete_leased(&self, key: impl Into<Vec<u8>>) -> Result<(), KvError> {
        let key = key.into();
        let mut leased = self.inner.leased.lock().await;
        leased.remove(&key);
        self.revisions().remove(&key);
        let client = self.client().await?;
        timed(
            format!("deleting {}", String::from_utf8_lossy(&key)),
            client.kv_client().delete(key, None),
        )
        .await?;
        drop(leased);
        Ok(())
    }

    /// Revokes the lease (every leased key goes with it): a graceful
    /// leave, after [`Self::run`] has stopped. Returns the lease revoked.
    pub async fn revoke(&self) -> Result<Option<i64>, KvError> {
        let lease = self.inner.lease.lock().ok().and_then(|mut l| l.take());
        let Some(lease) = lease else {
            return Ok(None);
        };
        self.save_lease(None);
        let client = self.ready_client().await?;
        // Within the agent's shutdown deadline: etcd away, the lease ends
        // by its TTL instead.
        match tokio::time::timeout(REVOKE_TIMEOUT, client.lease_client().revoke(lease)).await {
            Ok(r) => r.map_err(call_error("revoking the lease"))?,
            Err(_) => {
                return Err(KvError::Timeout {
                    op: "revoking the lease".into(),
                    timeout: REVOKE_TIMEOUT,
                });
            }
        };
        Ok(Some(lease))
    }
}
