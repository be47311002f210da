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
//!   is written again; when the agent leaves, [`KvStore::revoke`] removes
//!   them all at once.
//! - [`KvStore::watch_prefix`] follows every key under a prefix: a
//!   [`WatchEvent::Snapshot`] (one range read at revision R), then
//!   [`WatchEvent::Put`] / [`WatchEvent::Delete`] from the watch stream
//!   started at R + 1, so that no change is missed or seen twice. When the
//!   watch breaks ([`WatchEvent::Lost`], once per outage) or its revision
//!   is compacted, the prefix is read again (a new `Snapshot`, which
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
//!         WatchEvent::Snapshot { entries, .. } => { /* replace all */ }
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
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use etcd_client::{
    Certificate, Client, ConnectOptions, EventType, GetOptions, Identity, PutOptions, TlsOptions,
    WatchOptions,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use tokio::sync::{Mutex as AsyncMutex, mpsc, watch};
use tracing::{info, warn};

/// The longest any single request (not a stream) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a revocation at shutdown may take.
const REVOKE_TIMEOUT: Duration = Duration::from_secs(1);
/// Retries start this soon after a failure and double up to
/// [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(3);
/// Events a watcher may hold unread before the watch waits for it.
const WATCH_BUFFER: usize = 1024;

/// How to reach etcd, and the node records' place in it.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// `host:port` of an etcd client URL (`https` when `tls` is set).
    pub endpoint: String,
    /// The key prefix under which nodes register.
    pub prefix: String,
    /// TTL of this agent's lease (kept alive while the agent runs).
    pub lease_ttl: Duration,
    /// Talk TLS to etcd.
    pub tls: Option<TlsConfig>,
    /// Authenticate as an etcd user.
    pub credentials: Option<Credentials>,
}

impl EtcdConfig {
    /// The client URL: `http://host:port`, or `https://` with TLS.
    #[must_use]
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.endpoint)
    }
}

/// A configuration file that cannot be used, named with its flag (the
/// config file's key is the flag's name without the dashes).
#[derive(Debug, thiserror::Error)]
pub enum KvConfigError {
    #[error("{flag} {}: cannot read it", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} {}: {detail}", path.display())]
    Invalid {
        flag: &'static str,
        path: PathBuf,
        detail: String,
    },
}

fn read_file(flag: &'static str, path: &Path) -> Result<Vec<u8>, KvConfigError> {
    std::fs::read(path).map_err(|source| KvConfigError::Read {
        flag,
        path: path.to_owned(),
        source,
    })
}

/// TLS toward etcd: the CA that signed etcd's server certificate and,
/// for etcd's `--client-cert-auth`, this agent's certificate and key (all
/// PEM, checked when loaded; the handshake checks the rest).
#[derive(Clone)]
pub struct TlsConfig(Arc<TlsFiles>);

struct TlsFiles {
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    ca_path: PathBuf,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca", &self.0.ca_path)
            .field("client_certificate", &self.0.identity.is_some())
            .finish()
    }
}

impl TlsConfig {
    pub const CA_FLAG: &'static str = "--kvstore-ca";
    pub const CERT_FLAG: &'static str = "--kvstore-cert";
    pub const KEY_FLAG: &'static str = "--kvstore-key";

    /// Reads the CA file and, when given, the client certificate and key.
    pub fn load(ca: &Path, cert_and_key: Option<(&Path, &Path)>) -> Result<Self, KvConfigError> {
        let ca_pem = read_file(Self::CA_FLAG, ca)?;
        certificates(Self::CA_FLAG, ca, &ca_pem)?;
        let identity = match cert_and_key {
            None => None,
            Some((cert, key)) => {
                let cert_pem = read_file(Self::CERT_FLAG, cert)?;
                certificates(Self::CERT_FLAG, cert, &cert_pem)?;
                let key_pem = read_file(Self::KEY_FLAG, key)?;
                PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| KvConfigError::Invalid {
                    flag: Self::KEY_FLAG,
                    path: key.to_owned(),
                    detail: match e {
                        rustls_pki_types::pem::Error::NoItemsFound => {
                            "no PEM private key in it (PKCS#8, PKCS#1 or SEC1)".into()
                        }
                        other => format!("not a PEM private key: {other}"),
                    },
                })?;
                Some((cert_pem, key_pem))
            }
        };
        Ok(Self(Arc::new(TlsFiles {
            ca: ca_pem,
            identity,
            ca_path: ca.to_owned(),
        })))
    }

    fn options(&self) -> TlsOptions {
        let tls = TlsOptions::new().ca_certificate(Certificate::from_pem(&self.0.ca));
        match &self.0.identity {
            Some((cert, key)) => tls.identity(Identity::from_pem(cert, key)),
            None => tls,
        }
    }
}

/// Checks that `pem` holds at least one certificate and nothing broken.
fn certificates(flag: &'static str, path: &Path, pem: &[u8]) -> Result<(), KvConfigError> {
    let invalid = |detail: String| KvConfigError::Invalid {
        flag,
        path: path.to_owned(),
        detail,
    };
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| invalid(format!("not a PEM certificate: {e}")))?;
        n += 1;
    }
    if n == 0 {
        return Err(invalid("no PEM certificate in it".into()));
    }
    Ok(())
}

/// An etcd user and its password (read from a file, never the command
/// line; never printed).
#[derive(Clone)]
pub struct Credentials(Arc<UserPassword>);

struct UserPassword {
    user: String,
    password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.0.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    pub const PASSWORD_FLAG: &'static str = "--kvstore-password-file";

    /// `user`, with the password in `password_file`: its content without
    /// the final line break.
    pub fn load(user: &str, password_file: &Path) -> Result<Self, KvConfigError> {
        let bytes = read_file(Self::PASSWORD_FLAG, password_file)?;
        let invalid = |detail: &str| KvConfigError::Invalid {
            flag: Self::PASSWORD_FLAG,
            path: password_file.to_owned(),
            detail: detail.into(),
        };
        let text = String::from_utf8(bytes).map_err(|_| invalid("the password is not UTF-8"))?;
        let password = text
            .strip_suffix('\n')
            .map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
        if password.is_empty() {
            return Err(invalid("the file is empty (it holds the password)"));
        }
        Ok(Self(Arc::new(UserPassword {
            user: user.to_owned(),
            password: password.to_owned(),
        })))
    }

    /// The user's name.
    #[must_use]
    pub fn user(&self) -> &str {
        &self.0.user
    }
}

/// What went wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("setting up the etcd client for {url}: {detail}")]
    Client { url: String, detail: String },
    #[error("authenticating to etcd as user {user:?}: {detail}")]
    Auth { user: String, detail: String },
    #[error("{op}: {detail}")]
    Call { op: String, detail: String },
    #[error("{op}: no answer from etcd in {}s", timeout.as_secs())]
    Timeout { op: String, timeout: Duration },
    #[error("lease {lease:x} expired")]
    LeaseExpired { lease: i64 },
    #[error("no keepalive answer for lease {lease:x} in {}s", ttl.as_secs())]
    KeepaliveSilent { lease: i64, ttl: Duration },
    #[error("etcd closed the {what} stream")]
    StreamEnded { what: &'static str },
    #[error("etcd canceled the watch of {prefix:?}: {reason}")]
    WatchCanceled { prefix: String, reason: String },
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
    /// Every key under the prefix at `revision`, in key order. The first
    /// event, and again after a `Lost` or a compaction: it replaces
    /// everything the receiver holds.
    Snapshot { revision: i64, entries: Vec<Entry> },
    /// A key was created or changed.
    Put(Entry),
    /// A key was deleted (or its lease ended) at `revision`.
    Delete { key: Vec<u8>, revision: i64 },
    /// The watch broke (etcd away, refused, ...): what the receiver holds
    /// may go stale until the next `Snapshot`. Sent once per outage.
    Lost { error: Arc<KvError> },
}

/// The agent's etcd client and lease; cloning shares both. See the module
/// documentation.
#[derive(Clone)]
pub struct KvStore {
    inner: Arc<Inner>,
}

struct Inner {
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
    leased: AsyncMutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// The lease being kept alive.
    lease: Mutex<Option<i64>>,
    link: watch::Sender<Link>,
    running: AtomicBool,
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
                url: cfg.url(),
                lease_ttl: cfg.lease_ttl.max(Duration::from_secs(2)),
                tls: cfg.tls.clone(),
                credentials: cfg.credentials.clone(),
                client: AsyncMutex::new(None),
                authenticated: AsyncMutex::new(false),
                leased: AsyncMutex::new(BTreeMap::new()),
                lease: Mutex::new(None),
                link: watch::Sender::new(Link::Connecting),
                running: AtomicBool::new(false),
            }),
        }
    }

    /// `http(s)://host:port`.
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
            .with_auto_token_refresh(true);
        if let Some(tls) = &self.inner.tls {
            opts = opts.with_tls(tls.options());
        }
        let client = Client::connect([self.inner.url.as_str()], Some(opts))
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
                let auth = c.update_user(Some((creds.0.user.clone(), creds.0.password.clone())));
                let outcome = match tokio::time::timeout(REQUEST_TIMEOUT, auth).await {
                    Ok(r) => r.map_err(|e| describe(&e)),
                    Err(_) => Err(format!("no answer in {}s", REQUEST_TIMEOUT.as_secs())),
                };
                outcome.map_err(|detail| KvError::Auth {
                    user: creds.0.user.clone(),
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
        let mut backoff = BACKOFF_MIN;
        loop {
            let (was_up, err) = match self.session().await {
                Ok(never) => match never {},
                Err(e) => e,
            };
            if was_up {
                backoff = BACKOFF_MIN;
            }
            self.mark_down(&err);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    fn mark_up(&self, lease: i64, renewed: bool) {
        let ttl = self.inner.lease_ttl.as_secs();
        let keys = self.inner.leased.try_lock().map_or(0, |m| m.len());
        let lease_hex = format!("{lease:x}");
        self.inner.link.send_modify(|link| {
            match link {
                Link::Down { .. } => info!(
                    url = %self.inner.url, lease = %lease_hex, keys, renewed,
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
        let kept = match previous {
            Some(id) => match tokio::time::timeout(REQUEST_TIMEOUT, leases.keep_alive(id)).await {
                Ok(Ok(k)) => Some(k),
                Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => None,
                Ok(Err(e)) => return Err(down(call_error("keeping the lease alive")(e))),
                Err(_) => {
                    return Err(down(KvError::Timeout {
                        op: "keeping the lease alive".into(),
                        timeout: REQUEST_TIMEOUT,
                    }));
                }
            },
            None => None,
        };
        let (mut keeper, mut stream) = if let Some(k) = kept {
            k
        } else {
            let grant = timed("granting a lease", leases.grant(ttl_s, None))
                .await
                .map_err(down)?;
            if let Ok(mut l) = self.inner.lease.lock() {
                *l = Some(grant.id());
            }
            timed("keeping the lease alive", leases.keep_alive(grant.id()))
                .await
                .map_err(down)?
        };
        let lease = keeper.id();
        self.put_all(&client, lease).await.map_err(down)?;
        self.mark_up(lease, previous.is_some_and(|p| p != lease));
        let up = |e| (true, e);
        let mut tick = tokio::time::interval(ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut answered = Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if answered.elapsed() > ttl {
                        return Err(up(KvError::KeepaliveSilent { lease, ttl }));
                    }
                    keeper.keep_alive().await.map_err(|e| up(call_error("keeping the lease alive")(e)))?;
                }
                msg = stream.message() => match msg {
                    Ok(Some(r)) if r.ttl() <= 0 => {
                        if let Ok(mut l) = self.inner.lease.lock() {
                            *l = None;
                        }
                        return Err(up(KvError::LeaseExpired { lease }));
                    }
                    Ok(Some(_)) => answered = Instant::now(),
                    Ok(None) => return Err(up(KvError::StreamEnded { what: "lease keepalive" })),
                    Err(e) => return Err(up(call_error("keeping the lease alive")(e))),
                },
            }
        }
    }

    /// Writes every leased key under `lease`.
    async fn put_all(&self, client: &Client, lease: i64) -> Result<(), KvError> {
        let leased = self.inner.leased.lock().await;
        let mut kv = client.kv_client();
        for (key, value) in leased.iter() {
            timed(
                format!("writing {}", String::from_utf8_lossy(key)),
                kv.put(
                    key.clone(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            )
            .await?;
        }
        Ok(())
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
        leased.insert(key.clone(), value.clone());
        let Link::Up { lease } = *self.inner.link.borrow() else {
            return Ok(Put::Pending);
        };
        let client = self.client().await?;
        timed(
            format!("writing {}", String::from_utf8_lossy(&key)),
            client
                .kv_client()
                .put(key, value, Some(PutOptions::new().with_lease(lease))),
        )
        .await?;
        drop(leased);
        Ok(Put::Written)
    }

    /// Removes a key written with [`Self::put_leased`] (from etcd and from
    /// the keys the lease session writes).
    pub async fn delete_leased(&self, key: impl Into<Vec<u8>>) -> Result<(), KvError> {
        let key = key.into();
        let mut leased = self.inner.leased.lock().await;
        leased.remove(&key);
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

    /// Reads every key under `prefix`, at one revision, in pages of
    /// [`LIST_PAGE`] keys: a prefix holding more than gRPC's 4 MiB receive
    /// limit is read whole.
    pub async fn list(&self, prefix: impl Into<Vec<u8>>) -> Result<(i64, Vec<Entry>), KvError> {
        let prefix = prefix.into();
        let end = prefix_end(&prefix);
        let client = self.ready_client().await?;
        let mut kv = client.kv_client();
        let shown = String::from_utf8_lossy(&prefix).into_owned();
        let mut from = prefix.clone();
        let mut revision = 0;
        let mut entries = Vec::new();
        loop {
            let mut opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(LIST_PAGE);
            if revision > 0 {
                opts = opts.with_revision(revision);
            }
            let resp = timed(format!("listing {shown}"), kv.get(from, Some(opts))).await?;
            if revision == 0 {
                revision = resp
                    .header()
                    .map_or(0, etcd_client::ResponseHeader::revision);
            }
            entries.extend(resp.kvs().iter().map(entry));
            let Some(last) = resp.kvs().last().filter(|_| resp.more()) else {
                break;
            };
            // The next page starts just after the last key read.
            let mut next = last.key().to_vec();
            next.push(0);
            from = next;
        }
        Ok((revision, entries))
    }

    /// Follows every key under `prefix`: a [`WatchEvent::Snapshot`], then
    /// changes, revision-consistent (see the module documentation). A
    /// task of its own does the work; it ends when the receiver is
    /// dropped.
    #[must_use]
    pub fn watch_prefix(&self, prefix: impl Into<Vec<u8>>) -> mpsc::Receiver<WatchEvent> {
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let store = self.clone();
        let prefix = prefix.into();
        tokio::spawn(async move {
            tokio::select! {
                () = store.follow(&prefix, &tx) => {}
                () = tx.closed() => {}
            }
        });
        rx
    }

    async fn follow(&self, prefix: &[u8], tx: &mpsc::Sender<WatchEvent>) {
        let mut backoff = BACKOFF_MIN;
        let mut lost = false;
        loop {
            let (synced, error) = match self.watch_session(prefix, tx, &mut lost).await {
                WatchEnd::ReceiverGone => return,
                WatchEnd::Compacted => {
                    backoff = BACKOFF_MIN;
                    continue;
                }
                WatchEnd::Failed { synced, error } => (synced, error),
            };
            if synced {
                backoff = BACKOFF_MIN;
            }
            if !lost {
                lost = true;
                let error = Arc::new(error);
                if tx.send(WatchEvent::Lost { error }).await.is_err() {
                    return;
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Lists `prefix` and watches it from the next revision, until the
    /// watch breaks.
    async fn watch_session(
        &self,
        prefix: &[u8],
        tx: &mpsc::Sender<WatchEvent>,
        lost: &mut bool,
    ) -> WatchEnd {
        let failed = |synced, error| WatchEnd::Failed { synced, error };
        let (revision, entries) = match self.list(prefix.to_vec()).await {
            Ok(l) => l,
            Err(e) => return failed(false, e),
        };
        let client = match self.client().await {
            Ok(c) => c,
            Err(e) => return failed(false, e),
        };
        let shown = String::from_utf8_lossy(prefix).into_owned();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let mut stream = match timed(
            format!("watching {shown}"),
            client.watch_client().watch(prefix.to_vec(), Some(opts)),
        )
        .await
        {
            Ok(s) => s,
            Err(e) => return failed(false, e),
        };
        if tx
            .send(WatchEvent::Snapshot { revision, entries })
            .await
            .is_err()
        {
            return WatchEnd::ReceiverGone;
        }
        *lost = false;
        loop {
            let resp = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => return failed(true, KvError::StreamEnded { what: "watch" }),
                Err(e) => return failed(true, call_error(format!("watching {shown}"))(e)),
            };
            if resp.canceled() {
                if resp.compact_revision() > 0 {
                    info!(prefix = %shown, compacted = resp.compact_revision(), "etcd watch behind compaction: listing again");
                    return WatchEnd::Compacted;
                }
                let reason = resp.cancel_reason().to_owned();
                return failed(
                    true,
                    KvError::WatchCanceled {
                        prefix: shown,
                        reason,
                    },
                );
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let event = match ev.event_type() {
                    EventType::Put => WatchEvent::Put(entry(kv)),
                    EventType::Delete => WatchEvent::Delete {
                        key: kv.key().to_vec(),
                        revision: kv.mod_revision(),
                    },
                };
                if tx.send(event).await.is_err() {
                    return WatchEnd::ReceiverGone;
                }
            }
        }
    }
}

/// Keys read per request when listing a prefix: at the 1.5 MiB etcd
/// allows a value, a page can still exceed gRPC's 4 MiB limit, but node
/// records (about 100 bytes) and summaries (about 1.5 KiB) stay far below.
const LIST_PAGE: i64 = 500;

/// The end of the range of keys starting with `prefix` (etcd's
/// `--prefix`): the prefix with its last byte below 0xff incremented and
/// what follows it dropped; `\0` (every key) when there is none.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

enum WatchEnd {
    ReceiverGone,
    Compacted,
    Failed { synced: bool, error: KvError },
}

fn entry(kv: &etcd_client::KeyValue) -> Entry {
    Entry {
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
        mod_revision: kv.mod_revision(),
        lease: kv.lease(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of files for one test, removed after it.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("kvstore-test-{}-{test}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            Self(dir)
        }

        fn file(&self, name: &str, content: &[u8]) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, content).expect("write");
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_prefix_ends_where_its_last_byte_below_0xff_is_incremented() {
        assert_eq!(prefix_end(b"/health/nodes/"), b"/health/nodes0");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn passwords_lose_their_final_line_break_only() {
        let dir = Scratch::new("passwords");
        for (content, want) in [
            (&b"s3cret\n"[..], "s3cret"),
            (b"s3cret\r\n", "s3cret"),
            (b"s3cret", "s3cret"),
            (b" two words \n\n", " two words \n"),
        ] {
            let c = Credentials::load("root", &dir.file("pw", content)).expect("loads");
            assert_eq!(c.0.password, want);
            assert!(!format!("{c:?}").contains("s3cret"), "never printed");
        }
        let err = Credentials::load("root", &dir.file("empty", b"\n")).expect_err("empty");
        assert!(
            err.to_string().starts_with("--kvstore-password-file /")
                && err
                    .to_string()
                    .ends_with("the file is empty (it holds the password)"),
            "{err}"
        );
        let err = Credentials::load("root", Path::new("/nonexistent/pw")).expect_err("missing");
        assert_eq!(
            err.to_string(),
            "--kvstore-password-file /nonexistent/pw: cannot read it"
        );
    }

    #[test]
    fn tls_files_are_checked_naming_the_flag() {
        let dir = Scratch::new("tls");
        let missing = TlsConfig::load(Path::new("/nonexistent/ca.pem"), None).expect_err("missing");
        assert_eq!(
            missing.to_string(),
            "--kvstore-ca /nonexistent/ca.pem: cannot read it"
        );
        let junk = dir.file("junk.pem", b"hello\n");
        let err = TlsConfig::load(&junk, None).expect_err("junk");
        assert!(
            err.to_string()
                .ends_with("junk.pem: no PEM certificate in it"),
            "{err}"
        );
        let broken = dir.file(
            "broken.pem",
            b"-----BEGIN CERTIFICATE-----\n%%%%\n-----END CERTIFICATE-----\n",
        );
        let err = TlsConfig::load(&broken, None).expect_err("broken");
        assert!(err.to_string().contains("not a PEM certificate"), "{err}");
        // A syntactically fine PEM certificate; the key file is not a key.
        let cert = dir.file(
            "cert.pem",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        let err = TlsConfig::load(&cert, Some((&cert, &cert))).expect_err("no key");
        assert!(
            err.to_string().starts_with("--kvstore-key ")
                && err.to_string().contains("no PEM private key in it"),
            "{err}"
        );
        let key = dir.file(
            "key.pem",
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        );
        let tls = TlsConfig::load(&cert, Some((&cert, &key))).expect("loads");
        assert!(format!("{tls:?}").contains("client_certificate: true"));
    }

    #[test]
    fn the_url_scheme_follows_tls() {
        let dir = Scratch::new("url");
        let mut cfg = EtcdConfig {
            endpoint: "198.18.0.1:2379".into(),
            prefix: "/h/".into(),
            lease_ttl: Duration::from_secs(10),
            tls: None,
            credentials: None,
        };
        assert_eq!(cfg.url(), "http://198.18.0.1:2379");
        let cert = dir.file(
            "url-ca.pem",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        cfg.tls = Some(TlsConfig::load(&cert, None).expect("loads"));
        assert_eq!(cfg.url(), "https://198.18.0.1:2379");
    }
}
