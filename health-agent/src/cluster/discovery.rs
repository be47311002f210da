//! Where the node set comes from. Every source publishes whole node sets
//! on a `watch` channel and keeps a view (source, last error) for the API;
//! a bad update is reported and the last good set is kept.

use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{info, warn};

use super::{NodeSet, nodes_file};

/// What `GET /v1/nodes` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodesView {
    /// `file:<path>`, `etcd:<endpoints>`, or `none`.
    pub source: String,
    pub nodes: NodeSet,
    /// Why the latest update was rejected (the set above is the last good one).
    pub error: Option<String>,
    /// Epoch milliseconds of the last accepted update.
    pub updated_ms: Option<u64>,
}

pub type SharedNodes = Arc<RwLock<NodesView>>;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Records an accepted set and publishes it.
pub fn accept(view: &SharedNodes, tx: &watch::Sender<NodeSet>, nodes: NodeSet) {
    if let Ok(mut v) = view.write() {
        v.nodes.clone_from(&nodes);
        v.error = None;
        v.updated_ms = Some(now_ms());
    }
    tx.send_if_modified(|cur| {
        if *cur == nodes {
            false
        } else {
            *cur = nodes;
            true
        }
    });
}

/// Records a rejected update; the last good set stays.
pub fn reject(view: &SharedNodes, error: String) {
    warn!("node set update rejected, keeping the last good set: {error}");
    if let Ok(mut v) = view.write() {
        v.error = Some(error);
    }
}

/// Watches the nodes file (polling its content every `poll`, which also
/// catches editors that replace the file), publishing each valid version.
pub async fn watch_file(
    path: PathBuf,
    poll: Duration,
    view: SharedNodes,
    tx: watch::Sender<NodeSet>,
) {
    let mut last: Option<String> = std::fs::read_to_string(&path).ok();
    loop {
        tokio::time::sleep(poll).await;
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                if last.is_some() {
                    reject(&view, format!("{}: cannot read: {e}", path.display()));
                    last = None;
                }
                continue;
            }
        };
        if last.as_deref() == Some(text.as_str()) {
            continue;
        }
        match nodes_file::parse(&path, &text) {
            Ok(nodes) => {
                info!(path = %path.display(), nodes = nodes.len(), "nodes file changed");
                accept(&view, &tx, nodes);
            }
            Err(e) => reject(&view, e.to_string()),
        }
        last = Some(text);
    }
}

/// A source of node sets: the nodes file or etcd.
pub trait NodeSource: Send + 'static {
    /// How `GET /v1/nodes` names the source.
    fn describe(&self) -> String;
    /// Publishes node sets on `tx` (and problems in `view`) until dropped.
    fn run(
        self: Box<Self>,
        view: SharedNodes,
        tx: watch::Sender<NodeSet>,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The watched nodes file.
pub struct FileSource {
    pub path: PathBuf,
    pub poll: Duration,
}

impl NodeSource for FileSource {
    fn describe(&self) -> String {
        format!("file:{}", self.path.display())
    }

    fn run(
        self: Box<Self>,
        view: SharedNodes,
        tx: watch::Sender<NodeSet>,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(watch_file(self.path, self.poll, view, tx))
    }
}

/// etcd: register this node, list and watch the prefix.
pub struct EtcdSource {
    pub cfg: super::etcd::EtcdConfig,
    pub me: super::Node,
    pub registration: super::etcd::Registration,
}

impl NodeSource for EtcdSource {
    fn describe(&self) -> String {
        format!("etcd:{}{}", self.cfg.endpoint, self.cfg.prefix)
    }

    fn run(
        self: Box<Self>,
        view: SharedNodes,
        tx: watch::Sender<NodeSet>,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(super::etcd::run(
            self.cfg,
            self.me,
            view,
            tx,
            self.registration,
        ))
    }
}
