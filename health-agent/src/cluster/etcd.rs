//! Node discovery through etcd (over [`super::kvstore`]): each agent puts
//! its record at `<prefix><name>` with its lease (kept alive by the
//! lease-keepalive stream), reads the prefix once and then follows it from
//! the watch stream's events, one record at a time. When etcd is
//! unreachable the last known set stays in use (probing goes on); when it
//! returns the prefix is read again and the watch resumes after it.

use std::{
    collections::BTreeMap,
    sync::{Arc, OnceLock},
    time::Duration,
};

use tokio::{sync::mpsc, time::Instant};
use tracing::{info, warn};

pub use super::kvstore::EtcdConfig;
use super::{
    Node,
    discovery::Nodes,
    kvstore::{Entry, KvStore, Link, WatchEvent},
    validate::{self, Candidate, LocalNode, Origin, Record, Validated},
};

/// The agent's etcd client and lease, shared by everything that writes
/// with the lease (node discovery, the cluster view) and revoked at
/// shutdown.
#[derive(Debug, Clone, Default)]
pub struct Registration(Arc<OnceLock<KvStore>>);

impl Registration {
    /// The agent's [`KvStore`], made from `cfg` by the first caller; every
    /// later caller gets the same one (one connection, one lease).
    #[must_use]
    pub fn store(&self, cfg: &EtcdConfig) -> KvStore {
        self.0.get_or_init(|| KvStore::new(cfg)).clone()
    }

    /// The lease registered now, if any.
    #[must_use]
    pub fn current(&self) -> Option<i64> {
        self.0.get().and_then(KvStore::lease)
    }
}

/// Keeps this agent registered and the node set in sync, forever.
pub async fn run(
    cfg: EtcdConfig,
    me: Node,
    local: LocalNode,
    nodes: Nodes,
    registration: Registration,
) {
    let store = registration.store(&cfg);
    let key = format!("{}{}", cfg.prefix, me.name);
    match serde_json::to_vec(&me) {
        Ok(value) => {
            info!(key, "registering in etcd");
            if let Err(e) = Box::pin(store.put_leased(key, value)).await {
                warn!("etcd: {}", crate::util::errors::chain(&e));
            }
        }
        Err(e) => warn!("encoding this node's record: {e}"),
    }
    let events = store.watch_prefix(cfg.prefix.as_bytes());
    // Boxed: the client's futures are large, and so would be the caller's.
    tokio::join!(
        Box::pin(store.run()),
        Box::pin(follow(&store, events, &cfg, &local, &nodes))
    );
}

/// Publishes the node set from the prefix's events (a burst of events is
/// published once), and the etcd errors in its status (once per outage).
async fn follow(
    store: &KvStore,
    mut events: mpsc::Receiver<WatchEvent>,
    cfg: &EtcdConfig,
    local: &LocalNode,
    nodes: &Nodes,
) {
    let mut link = store.link();
    let mut view = View::new(&cfg.prefix);
    loop {
        let grace_end = view.link_grace_end();
        tokio::select! {
            ev = events.recv() => {
                let Some(ev) = ev else { return };
                view.apply(ev);
                while let Ok(ev) = events.try_recv() {
                    view.apply(ev);
                }
            }
            changed = link.changed() => {
                if changed.is_err() {
                    return;
                }
                view.link_error = match &*link.borrow_and_update() {
                    Link::Down { error } => Some((error.clone(), Instant::now())),
                    Link::Connecting | Link::Up { .. } => None,
                };
            }
            () = until(grace_end) => {}
        }
        view.publish(&cfg.endpoint, local, nodes);
    }
}

/// How long the lease session may stay down, with the watch in sync,
/// before its error is shown in the node set's status.
const LINK_GRACE: Duration = Duration::from_secs(10);

/// Sleeps until `deadline`, or forever.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The node records under the prefix, by key, as the watch left them.
#[derive(Debug)]
struct View<'a> {
    prefix: &'a str,
    records: BTreeMap<String, Candidate>,
    /// A snapshot was applied since the watch last broke.
    synced: bool,
    /// The records changed since they were last published.
    dirty: bool,
    watch_error: Option<String>,
    /// The lease session's error, and since when.
    link_error: Option<(String, Instant)>,
    /// An error is in the status now.
    shown_error: bool,
}

impl<'a> View<'a> {
    fn new(prefix: &'a str) -> Self {
        Self {
            prefix,
            records: BTreeMap::new(),
            synced: false,
            dirty: false,
            watch_error: None,
            link_error: None,
            shown_error: false,
        }
    }

    fn apply(&mut self, ev: WatchEvent) {
        match ev {
            WatchEvent::Snapshot { entries, .. } => {
                self.records = entries
                    .iter()
                    .map(|e| (e.key_str().into_owned(), candidate(e, self.prefix)))
                    .collect();
                self.synced = true;
                self.dirty = true;
                self.watch_error = None;
            }
            WatchEvent::Put(e) => {
                self.records
                    .insert(e.key_str().into_owned(), candidate(&e, self.prefix));
                self.dirty = true;
            }
            WatchEvent::Delete { key, .. } => {
                self.records.remove(String::from_utf8_lossy(&key).as_ref());
                self.dirty = true;
            }
            WatchEvent::Lost { error } => {
                self.synced = false;
                self.watch_error = Some(crate::util::errors::chain(&*error));
            }
        }
    }

    /// The error to show. The lease session's counts once it has
    /// outlasted [`LINK_GRACE`] with the watch in sync: when etcd returns,
    /// the watch and the lease session come back within a backoff of each
    /// other, and the outage is reported once.
    fn error(&self) -> Option<&str> {
        self.watch_error.as_deref().or_else(|| {
            self.link_error
                .as_ref()
                .filter(|(_, since)| !self.synced || since.elapsed() >= LINK_GRACE)
                .map(|(e, _)| e.as_str())
        })
    }

    /// When the lease session's error starts to count, if it is pending.
    fn link_grace_end(&self) -> Option<Instant> {
        match &self.link_error {
            Some((_, since)) if self.synced && !self.shown_error => Some(*since + LINK_GRACE),
            _ => None,
        }
    }

    /// The set, validated (etcd key order: the first of two conflicting
    /// records wins).
    fn validated(&self, local: &LocalNode) -> Validated {
        validate::validate(self.records.values().cloned().collect(), local)
    }

    fn publish(&mut self, endpoint: &str, local: &LocalNode, nodes: &Nodes) {
        let recovered = self.shown_error && self.error().is_none();
        if self.synced && (self.dirty || recovered) {
            nodes.accept(self.validated(local));
            self.dirty = false;
            self.shown_error = false;
        }
        if let Some(e) = self.error()
            && !self.shown_error
        {
            nodes.reject(format!(
                "etcd at {endpoint}: {e}; probing the last known set"
            ));
            self.shown_error = true;
        }
    }
}

/// A record as validation sees it: decoded, or why not, named by its key.
fn candidate(e: &Entry, prefix: &str) -> Candidate {
    let key = e.key_str().into_owned();
    let node = serde_json::from_slice::<Node>(&e.value)
        .map_err(|err| format!("the value is not a node record: {err}"));
    Candidate {
        record: Record {
            name: node.as_ref().ok().map(|n| n.name.clone()),
            origin: Origin::Etcd {
                prefix_len: if key.starts_with(prefix) {
                    prefix.len()
                } else {
                    0
                },
                key,
            },
        },
        node,
    }
}

/// Revokes this agent's lease (its keys go with it): a graceful leave.
pub async fn deregister(registration: &Registration) {
    let Some(store) = registration.0.get() else {
        return;
    };
    match Box::pin(store.revoke()).await {
        Ok(Some(lease)) => info!(lease = %format!("{lease:x}"), "left etcd (lease revoked)"),
        Ok(None) => {}
        Err(e) => warn!(
            "revoking the etcd lease: {}",
            crate::util::errors::chain(&e)
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn local() -> LocalNode {
        LocalNode {
            name: Some("n1".into()),
            health_cidr: Some("198.18.64.0/24".parse().expect("cidr")),
            health_cidr6: None,
        }
    }

    fn kv(key: &str, value: &Value) -> Entry {
        raw(key, &value.to_string())
    }

    fn raw(key: &str, value: &str) -> Entry {
        Entry {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            mod_revision: 1,
            lease: 0,
        }
    }

    fn record(name: &str, node_ip: &str, health_ip: &str) -> Value {
        json!({"name": name, "node_ip": node_ip, "health_ip": health_ip})
    }

    /// The set a snapshot of `entries` (in any order) makes.
    fn nodes_from(entries: Vec<Entry>, prefix: &str) -> Validated {
        let mut view = View::new(prefix);
        view.apply(WatchEvent::Snapshot {
            revision: 1,
            entries,
        });
        view.validated(&local())
    }

    fn outcome(v: &Validated) -> (Vec<&str>, Vec<String>) {
        (
            v.nodes.iter().map(|n| n.name.as_str()).collect(),
            v.rejected.iter().map(ToString::to_string).collect(),
        )
    }

    #[test]
    fn records_decode_and_garbage_is_rejected_by_key() {
        let got = nodes_from(
            vec![
                kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2")),
                raw("/h/bad", "not json"),
                kv("/h/n2", &record("n2", "198.18.0.12", "198.18.65.2")),
            ],
            "/h/",
        );
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["n1", "n2"]);
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert!(
            rejected[0].starts_with("etcd key \"/h/bad\": the value is not a node record: "),
            "{rejected:?}"
        );
        assert_eq!(nodes_from(Vec::new(), "/h/"), Validated::default());
    }

    #[test]
    fn ipv6_records_decode_and_bad_ones_are_rejected_by_key() {
        let v6 = json!({"name": "v6", "node_ip6": "2001:2::12", "health_ip6": "2001:2:0:41::2"});
        let mixed =
            json!({"name": "mixed", "node_ip6": "198.18.0.13", "health_ip6": "2001:2:0:42::2"});
        let half = json!({"name": "half", "node_ip": "198.18.0.14", "health_ip": "198.18.67.2", "node_ip6": "2001:2::14"});
        let got = nodes_from(
            vec![
                kv("/h/half", &half),
                kv("/h/mixed", &mixed),
                kv("/h/v6", &v6),
            ],
            "/h/",
        );
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["v6"]);
        assert_eq!(
            got.nodes.get("v6").and_then(|n| n.health_ip6),
            Some("2001:2:0:41::2".parse().expect("ip"))
        );
        assert!(
            rejected[0].starts_with("etcd key \"/h/half\": node-ip6 without health-ip6"),
            "{rejected:?}"
        );
        assert!(
            rejected[1].starts_with("etcd key \"/h/mixed\": the value is not a node record: ")
                && rejected[1].contains("IPv6"),
            "{rejected:?}"
        );
    }

    #[test]
    fn zones_are_kept() {
        let mut r = record("n2", "198.18.0.12", "198.18.65.2");
        r["zone"] = json!("rack-1");
        let got = nodes_from(vec![kv("/h/n2", &r)], "/h/");
        assert_eq!(
            got.nodes.get("n2").and_then(|n| n.zone.as_deref()),
            Some("rack-1")
        );
    }

    #[test]
    fn events_update_one_record_at_a_time() {
        let mut view = View::new("/h/");
        view.apply(WatchEvent::Snapshot {
            revision: 5,
            entries: vec![
                kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2")),
                kv("/h/n2", &record("n2", "198.18.0.12", "198.18.65.2")),
            ],
        });
        view.apply(WatchEvent::Put(kv(
            "/h/n3",
            &record("n3", "198.18.0.13", "198.18.66.2"),
        )));
        view.apply(WatchEvent::Put(kv(
            "/h/n2",
            &record("n2", "198.18.0.22", "198.18.65.2"),
        )));
        view.apply(WatchEvent::Delete {
            key: b"/h/n1".to_vec(),
            revision: 8,
        });
        let got = view.validated(&local());
        assert_eq!(outcome(&got).0, ["n2", "n3"]);
        assert_eq!(
            got.nodes
                .get("n2")
                .and_then(|n| n.node_ip)
                .map(|ip| ip.to_string()),
            Some("198.18.0.22".into())
        );
        // A new snapshot replaces everything.
        view.apply(WatchEvent::Snapshot {
            revision: 9,
            entries: vec![kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2"))],
        });
        assert_eq!(outcome(&view.validated(&local())).0, ["n1"]);
    }

    #[test]
    fn each_rule_rejects_the_record_by_key_and_keeps_the_others() {
        let good = kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2"));
        for (bad, needle) in [
            (
                kv("/h/n5", &record("n5", "127.0.0.1", "198.18.66.2")),
                "etcd key \"/h/n5\": node-ip 127.0.0.1 is loopback",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "0.0.0.0")),
                "etcd key \"/h/n5\": health-ip 0.0.0.0 is unspecified",
            ),
            (
                kv("/h/n5", &record("n5", "169.254.9.9", "198.18.66.2")),
                "node-ip 169.254.9.9 is link-local",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "239.1.1.1")),
                "health-ip 239.1.1.1 is multicast",
            ),
            (
                kv("/h/n5", &record("n5", "255.255.255.255", "198.18.66.2")),
                "limited broadcast",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "241.0.0.1")),
                "reserved (240.0.0.0/4)",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "198.18.64.77")),
                "etcd key \"/h/n5\": health-ip 198.18.64.77 is inside this node's health CIDR 198.18.64.0/24",
            ),
            (
                kv("/h/n5", &record("other", "198.18.0.15", "198.18.66.2")),
                "etcd key \"/h/n5\": the name \"other\" is not the key's last segment \"n5\"",
            ),
            (
                kv("/h/", &record("", "198.18.0.15", "198.18.66.2")),
                "etcd key \"/h/\": the name is empty",
            ),
            (
                kv("/h/a b", &record("a b", "198.18.0.15", "198.18.66.2")),
                "the name \"a b\" is not a node name",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.11", "198.18.66.2")),
                "etcd key \"/h/n5\": node-ip 198.18.0.11 is already the node-ip of node \"n1\" at etcd key \"/h/n1\", which is kept",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "198.18.0.11")),
                "health-ip 198.18.0.11 is already the node-ip of node \"n1\"",
            ),
        ] {
            let got = nodes_from(vec![good.clone(), bad], "/h/");
            let (kept, rejected) = outcome(&got);
            assert_eq!(kept, ["n1"], "{needle}");
            assert_eq!(rejected.len(), 1, "{rejected:?}");
            assert!(
                rejected[0].contains(needle),
                "{} lacks {needle:?}",
                rejected[0]
            );
        }
    }

    #[test]
    fn the_name_is_the_last_segment_after_the_prefix() {
        // A prefix without a trailing '/': the agent registers `<prefix><name>`.
        let got = nodes_from(
            vec![
                kv(
                    "/health/nodesn1",
                    &record("n1", "198.18.0.11", "198.18.64.2"),
                ),
                kv(
                    "/health/nodesn2",
                    &record("n2", "198.18.0.12", "198.18.65.2"),
                ),
                kv(
                    "/health/nodesx/n3",
                    &record("n3", "198.18.0.13", "198.18.66.2"),
                ),
                kv(
                    "/health/nodesn4",
                    &record("nodesn4", "198.18.0.14", "198.18.67.2"),
                ),
            ],
            "/health/nodes",
        );
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["n1", "n2", "n3"]);
        assert_eq!(
            rejected,
            [
                "etcd key \"/health/nodesn4\": the name \"nodesn4\" is not the key's last segment \"n4\""
            ]
        );
    }

    #[test]
    fn conflicts_keep_the_first_key_and_this_node_wins() {
        // Given out of order: key order decides which of two is kept.
        let got = nodes_from(
            vec![
                kv("/h/b/x", &record("x", "198.18.0.13", "198.18.67.2")),
                kv("/h/a/x", &record("x", "198.18.0.12", "198.18.66.2")),
                kv("/h/0", &record("0", "198.18.0.11", "198.18.65.2")),
                kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2")),
            ],
            "/h/",
        );
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["n1", "x"]);
        assert_eq!(
            got.nodes
                .get("x")
                .and_then(|n| n.node_ip)
                .map(|ip| ip.to_string()),
            Some("198.18.0.12".into())
        );
        assert_eq!(
            rejected,
            [
                "etcd key \"/h/0\": node-ip 198.18.0.11 is already the node-ip of node \"n1\" at etcd key \"/h/n1\", which is kept",
                "etcd key \"/h/b/x\": duplicate name \"x\": node \"x\" at etcd key \"/h/a/x\" has it and is kept",
            ]
        );
    }
}
