//! Following every key under a prefix: a range read at one revision (in
//! pages), then the watch stream from the next revision, read again after
//! an outage or a compaction ([`WatchEvent`]).

use std::sync::Arc;

use etcd_client::{EventType, GetOptions, WatchOptions};
use tokio::sync::mpsc;
use tracing::info;

use super::{
    BACKOFF_MIN, Entry, KvError, KvStore, QUIET_FOR, QUIET_RETRY_PAUSE, WATCH_BUFFER, WatchEvent,
    call_error, timed,
};

impl KvStore {
    /// Reads every key under `prefix`, at one revision, in pages of
    /// `LIST_PAGE` keys: a prefix holding more than gRPC's 4 MiB receive
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
        let (mut backoff, mut down) = (BACKOFF_MIN, false);
        let mut lost = false;
        // The last quiet retry's start, and until when it stays quiet.
        let mut quiet: Option<(tokio::time::Instant, tokio::time::Instant)> = None;
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
                // A watch in sync that broke (its etcd member went away, a
                // leader election): listed and watched again through any
                // member, and said lost only when that still fails after
                // QUIET_FOR. At most once per QUIET_RETRY_EVERY, so that a
                // watch etcd keeps cancelling is said.
                let now = tokio::time::Instant::now();
                if !lost && quiet.is_none_or(|(start, _)| now - start > QUIET_RETRY_EVERY) {
                    info!(prefix = %String::from_utf8_lossy(prefix), "etcd watch broke ({}): watching again", crate::util::errors::chain(&error));
                    quiet = Some((now, now + QUIET_FOR));
                }
            }
            if !lost && quiet.is_some_and(|(_, until)| tokio::time::Instant::now() < until) {
                // Every half second, not backing off: the client picks a
                // member per request, and a dead one refuses at once, so
                // a few tries reach one that answers.
                tokio::time::sleep(QUIET_RETRY_PAUSE).await;
                continue;
            }
            if !lost {
                lost = true;
                let error = Arc::new(error);
                if tx.send(WatchEvent::Lost { error }).await.is_err() {
                    return;
                }
            }
            backoff = self.back_off(backoff, &mut down).await;
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

/// A broken watch is retried before it is said lost at most this often.
const QUIET_RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

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

    #[test]
    fn a_prefix_ends_where_its_last_byte_below_0xff_is_incremented() {
        assert_eq!(prefix_end(b"/health/nodes/"), b"/health/nodes0");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }
}
