//! Where the node set comes from: the nodes file or etcd ([`NodeSource`]).
//! A source publishes what it reads through [`Nodes`] (the published set
//! and its status). Records are validated one by one ([`super::validate`]):
//! the rejected ones are listed in the status and the others used; an
//! update that cannot be read at all is reported and the last good set is
//! kept.

use std::{
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::{
    Node,
    claims::Holders,
    etcd::{self, EtcdConfig, Registration},
    file_settle::{Look, Renames, Settling},
    file_version::FileVersion,
    nodes_file,
    published::Nodes,
    record::LocalNode,
};

/// Watches the nodes file (polling it every `poll`, which also catches
/// editors that replace the file), publishing each valid version after
/// `seen` (the version read at start, if any) once it is stable
/// ([`super::file_settle`]): renamed into place, or no longer changing. The file
/// is read only when `stat` says it may have changed, and only a hash of
/// what was read is kept ([`FileVersion`]): at 10,000 nodes the file is a
/// megabyte.
async fn watch_file(
    path: PathBuf,
    poll: Duration,
    local: LocalNode,
    nodes: Nodes,
    seen: Option<FileVersion>,
) {
    let mut seen = seen.or_else(|| FileVersion::read(&path).ok().map(|(_, v)| v));
    let rename_events = Renames::watch(&path);
    let mut settling = Settling::default();
    // The last read's error, reported once while it stays the same.
    let mut failing: Option<String> = None;
    loop {
        tokio::time::sleep(poll).await;
        let look = rename_events
            .as_ref()
            .map_or(Look::UNWATCHED, Renames::look);
        // A version waiting to settle is offered again at every poll, even
        // unchanged: its stamp turning old enough is what takes it.
        let waiting = settling.pending().is_some();
        if !look.renamed
            && !waiting
            && seen.is_some_and(|v| !v.may_have_changed(&path, SystemTime::now()))
        {
            continue;
        }
        // Read (up to a limit) off the runtime's threads.
        let reading = path.clone();
        let read = tokio::task::spawn_blocking(move || FileVersion::read_or_refused(&reading))
            .await
            .unwrap_or_else(|e| Err((std::io::Error::other(e), None)));
        let (bytes, version) = match read {
            Ok(read) => read,
            Err((e, refused)) => {
                settling.clear();
                let error = format!("{}: cannot read: {e}", path.display());
                if failing.as_ref() != Some(&error) {
                    nodes.reject(error.clone());
                    failing = Some(error);
                }
                // A file refused for what it is (too large, no regular
                // file) is not read again until it changes; after any
                // other error (gone, too many open files) it is read again
                // at every poll.
                seen = refused;
                continue;
            }
        };
        failing = None;
        if version.consistent() && seen.is_some_and(|v| v.same_content(&version)) {
            settling.clear();
            seen = Some(version);
            continue;
        }
        if !settling.offer(version, look, Instant::now(), SystemTime::now()) {
            debug!(path = %path.display(), "nodes file changing: taken once it is stable");
            continue;
        }
        seen = Some(version);
        // Parsed off the runtime's threads: 10,000 records take tens of
        // milliseconds.
        let (parsing, holders, me) = (path.clone(), Holders::of(&nodes.current()), local.clone());
        let parsed = tokio::task::spawn_blocking(move || {
            nodes_file::text(&parsing, &bytes)
                .and_then(|text| nodes_file::parse(&parsing, text, &me, &holders))
                .map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|e| Err(format!("{}: parsing failed: {e}", path.display())));
        match parsed {
            // A version rejecting every record it holds (a field renamed
            // in all, say) would drop every peer: refused whole.
            Ok(update) if update.nodes.is_empty() && !nodes.current().is_empty() => {
                if let Some(summary) = update.summary() {
                    nodes.reject(format!(
                        "{}: every record rejected, the set in use stays: {summary}",
                        path.display()
                    ));
                } else {
                    nodes.accept(update);
                }
            }
            Ok(update) => {
                info!(
                    path = %path.display(),
                    nodes = update.nodes.len(),
                    rejected = update.rejected_total(),
                    "nodes file changed"
                );
                nodes_file::warn_if_unnamed(&path, &update, &local);
                nodes.accept(update);
            }
            Err(e) => nodes.reject(e),
        }
    }
}

/// A source of node sets.
#[derive(Debug, Clone)]
pub enum NodeSource {
    /// The watched nodes file; `local` is this node, for validation.
    File {
        path: PathBuf,
        poll: Duration,
        local: LocalNode,
        /// The version read at start: a change made after it is taken.
        seen: Option<FileVersion>,
    },
    /// etcd: this node registers under a lease; the prefix is watched.
    Etcd {
        cfg: EtcdConfig,
        me: Node,
        local: LocalNode,
        registration: Registration,
    },
    /// No discovery: the set stays empty.
    None,
}

impl NodeSource {
    /// Publishes node sets on `nodes` until `shutdown`; an etcd member
    /// leaves (revokes its lease) on the way out.
    pub async fn run(&self, nodes: Nodes, shutdown: CancellationToken) {
        match self {
            Self::File {
                path,
                poll,
                local,
                seen,
            } => {
                shutdown
                    .run_until_cancelled(watch_file(
                        path.clone(),
                        *poll,
                        local.clone(),
                        nodes,
                        *seen,
                    ))
                    .await;
            }
            Self::Etcd {
                cfg,
                me,
                local,
                registration,
            } => {
                shutdown
                    .run_until_cancelled(etcd::run(
                        cfg.clone(),
                        me.clone(),
                        local.clone(),
                        nodes,
                        registration.clone(),
                    ))
                    .await;
                etcd::deregister(registration).await;
            }
            Self::None => shutdown.cancelled().await,
        }
    }
}
