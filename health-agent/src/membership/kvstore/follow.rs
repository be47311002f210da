//! Following every key under a prefix: a range read at one revision (in
//! pages), then the watch stream from the next revision, read again after
//! an outage or a compaction, or when asked ([`ReadAgain`]), in the same
//! stream ([`WatchEvent`]).

use std::sync::Arc;

use etcd_client::{EventType, GetOptions, WatchOptions};
use tokio::sync::mpsc;
use tracing::info;

use super::{
    BACKOFF_MIN, Entry, KvError, KvStore, QUIET_FOR, QUIET_RETRY_PAUSE, REQUEST_TIMEOUT,
    WATCH_BUFFER, WatchEvent, call_error, timed,
};

impl KvStore {
    /// Reads every key under `prefix`, at one revision, in pages of
    /// `LIST_PAGE` keys: a prefix holding more than gRPC's 4 MiB receive
    /// limit is read whole.
    pub async fn list(&self, prefix: impl Into<Vec<u8>>) -> Result<(i64, Vec<Entry>), KvError> {
        let mut pages = self.pages(&prefix.into()).await?;
        let mut entries = Vec::new();
        while let Some(page) = pages.next().await? {
            entries.extend(page);
        }
        Ok((pages.revision, entries))
    }

    /// A reader of the keys under `prefix`, a page at a time.
    async fn pages(&self, prefix: &[u8]) -> Result<Pages, KvError> {
        let client = self.ready_client().await?;
        Ok(Pages {
            kv: client.kv_client(),
            shown: String::from_utf8_lossy(prefix).into_owned(),
            from: prefix.to_vec(),
            end: prefix_end(prefix),
            revision: 0,
            limit: LIST_PAGE,
            done: false,
        })
    }

    /// Follows every key under `prefix`: a [`WatchEvent::Snapshot`], then
    /// changes, revision-consistent (see the module documentation). A
    /// task of its own does the work; it ends when the receiver is
    /// dropped.
    #[must_use]
    pub fn watch_prefix(&self, prefix: impl Into<Vec<u8>>) -> mpsc::Receiver<WatchEvent> {
        self.follow_prefix(prefix).0
    }

    /// [`Self::watch_prefix`], with a handle that has the prefix listed
    /// again in the same stream ([`ReadAgain::now`]).
    #[must_use]
    pub fn follow_prefix(
        &self,
        prefix: impl Into<Vec<u8>>,
    ) -> (mpsc::Receiver<WatchEvent>, ReadAgain) {
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        // One request held at most: asked again before it is taken, the
        // asks are one.
        let (ask, mut asked) = mpsc::channel(1);
        let store = self.clone();
        let prefix = prefix.into();
        tokio::spawn(async move {
            tokio::select! {
                () = store.follow(&prefix, &tx, &mut asked) => {}
                () = tx.closed() => {}
            }
        });
        (rx, ReadAgain(ask))
    }

    async fn follow(
        &self,
        prefix: &[u8],
        tx: &mpsc::Sender<WatchEvent>,
        asked: &mut mpsc::Receiver<()>,
    ) {
        let (mut backoff, mut down) = (BACKOFF_MIN, false);
        let mut lost = false;
        // When the last broken watch began its quiet retries (they come
        // at most once per QUIET_RETRY_EVERY), and until when the retries
        // stay quiet.
        let mut quiet_since: Option<tokio::time::Instant> = None;
        let mut quiet_until: Option<tokio::time::Instant> = None;
        loop {
            let session = self.watch_session(prefix, tx, &mut lost, asked);
            let (synced, error) = match session.await {
                WatchEnd::ReceiverGone => return,
                WatchEnd::Compacted => {
                    backoff = BACKOFF_MIN;
                    continue;
                }
                WatchEnd::ReadAgain => {
                    // Listed again in sync: a member that refuses is
                    // retried quietly, as after a break, without taking
                    // a broken watch's turn.
                    quiet_until = Some(tokio::time::Instant::now() + QUIET_FOR);
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
                if !lost && quiet_since.is_none_or(|start| now - start > QUIET_RETRY_EVERY) {
                    info!(prefix = %String::from_utf8_lossy(prefix), "etcd watch broke ({}): watching again", crate::util::errors::chain(&error));
                    quiet_since = Some(now);
                    quiet_until = Some(now + QUIET_FOR);
                }
            }
            if !lost && quiet_until.is_some_and(|until| tokio::time::Instant::now() < until) {
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
        asked: &mut mpsc::Receiver<()>,
    ) -> WatchEnd {
        let failed = |synced, error| WatchEnd::Failed { synced, error };
        let mut pages = match self.pages(prefix).await {
            Ok(p) => p,
            Err(e) => return failed(false, e),
        };
        // This listing answers whatever was asked before its first read.
        while asked.try_recv().is_ok() {}
        // Each page goes as it is read, but the last: it waits for the
        // watch, so that the receiver is in sync when it has it.
        let mut first = true;
        let mut held = None;
        loop {
            match pages.next().await {
                Ok(Some(page)) => {
                    if let Some(entries) = held.replace(page) {
                        let part = WatchEvent::Snapshot {
                            revision: pages.revision,
                            entries,
                            first,
                            last: false,
                        };
                        if tx.send(part).await.is_err() {
                            return WatchEnd::ReceiverGone;
                        }
                        first = false;
                    }
                }
                Ok(None) => break,
                Err(e) => return failed(false, e),
            }
        }
        let revision = pages.revision;
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
        let closing = WatchEvent::Snapshot {
            revision,
            entries: held.unwrap_or_default(),
            first,
            last: true,
        };
        if tx.send(closing).await.is_err() {
            return WatchEnd::ReceiverGone;
        }
        *lost = false;
        loop {
            let message = tokio::select! {
                m = stream.message() => m,
                // Without a handle left, never.
                Some(()) = asked.recv() => return WatchEnd::ReadAgain,
            };
            let resp = match message {
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

/// The keys under a prefix, `LIST_PAGE` at a time, all at the revision
/// of the first page: what a reader holds of them at once is a page.
struct Pages {
    kv: etcd_client::KvClient,
    shown: String,
    /// The next page's first key.
    from: Vec<u8>,
    end: Vec<u8>,
    /// The listing's revision, once the first page is read.
    revision: i64,
    /// Keys a page.
    limit: i64,
    done: bool,
}

impl Pages {
    /// The next page in key order (the first, empty when the prefix is),
    /// or `None` past the last. A page over gRPC's 4 MiB (values of up to
    /// the 1.5 MiB etcd allows) is read again with half the keys, down to
    /// one, and the pages after it too.
    async fn next(&mut self) -> Result<Option<Vec<Entry>>, KvError> {
        if self.done {
            return Ok(None);
        }
        let resp = loop {
            let mut opts = GetOptions::new()
                .with_range(self.end.clone())
                .with_limit(self.limit);
            if self.revision > 0 {
                opts = opts.with_revision(self.revision);
            }
            let op = format!("listing {}", self.shown);
            let read = self.kv.get(self.from.clone(), Some(opts));
            match tokio::time::timeout(REQUEST_TIMEOUT, read).await {
                Ok(Ok(resp)) => break resp,
                Ok(Err(etcd_client::Error::GRpcStatus(s))) if too_large(&s) && self.limit > 1 => {
                    self.limit /= 2;
                }
                Ok(Err(e)) => return Err(call_error(op)(e)),
                Err(_) => {
                    return Err(KvError::Timeout {
                        op,
                        timeout: REQUEST_TIMEOUT,
                    });
                }
            }
        };
        if self.revision == 0 {
            self.revision = resp
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision);
        }
        match resp.kvs().last().filter(|_| resp.more()) {
            // The next page starts just after the last key read.
            Some(last) => {
                self.from = last.key().to_vec();
                self.from.push(0);
            }
            None => self.done = true,
        }
        Ok(Some(resp.kvs().iter().map(entry).collect()))
    }
}

/// Whether a read failed for its answer's size (gRPC's receive limit), not
/// for a compacted revision, which etcd also says with `OutOfRange`.
fn too_large(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::OutOfRange && s.message().contains("message length too large")
}

/// A broken watch is retried before it is said lost at most this often.
const QUIET_RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// Keys read per request when listing a prefix: node records (about 100
/// bytes) and summaries (about 1.5 KiB) stay far below gRPC's 4 MiB limit;
/// a page of larger values over it is read again in smaller ones.
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

/// Has a followed prefix ([`KvStore::follow_prefix`]) listed again, in
/// its stream: a [`WatchEvent::Snapshot`] of it as it is now, then its
/// changes. Asked while a listing is under way, once more after it;
/// asked several times before a listing begins, once.
#[derive(Debug, Clone)]
pub struct ReadAgain(mpsc::Sender<()>);

impl ReadAgain {
    pub fn now(&self) {
        // Full: a listing is asked for already.
        let _ = self.0.try_send(());
    }
}

enum WatchEnd {
    ReceiverGone,
    Compacted,
    /// [`ReadAgain::now`] was called.
    ReadAgain,
    Failed {
        synced: bool,
        error: KvError,
    },
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
