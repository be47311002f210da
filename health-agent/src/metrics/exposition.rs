//! The exposition, encoded on a blocking thread (the pinned maps' reads
//! and, with `--metrics-per-peer`, two walks of every path), gzipped as it
//! is written, and shared: a scrape takes the last encoding if that one
//! started after the scrape asked, and encodes anew otherwise. Scrapes
//! that queue behind an encoding therefore share the next one, however
//! many they are, its figures or its failure, and no scrape is answered
//! with figures older than its request.
//!
//! The turn to encode is held for the encoding alone, never while a
//! client reads: every client is sent the shared bytes (gzipped, or
//! decompressed as it reads them, [`crate::util::gzip`]), so a client
//! that reads slowly, or not at all, holds back no other scrape and holds
//! the encoding it was given, not a copy. An encoding is kept only while
//! a scrape waits for the turn: the last of them to take it, or to leave
//! before it does, lets it go (or, in the rare case a leaving scrape finds
//! the turn taken, the next scrape).

use std::{
    fmt, io,
    panic::AssertUnwindSafe,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use bytes::Bytes;
use tokio::sync::Mutex;

use super::Metrics;

/// Why a scrape has no exposition.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExpositionError {
    #[error("encoding the metrics failed (a collector gave up)")]
    Encode,
    #[error("encoding the metrics failed: the encoder panicked: {0}")]
    Panicked(String),
    #[error("encoding the metrics failed: the agent is stopping")]
    Stopping,
}

/// An encoding, when it started, and what it made.
pub(super) struct Made {
    started: Instant,
    made: Result<Bytes, ExpositionError>,
}

impl fmt::Debug for Made {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Made")
            .field("started", &self.started)
            .field("gzip_bytes", &self.made.as_ref().map(Bytes::len))
            .finish()
    }
}

/// The last encoding, behind the turn to encode, and the scrapes waiting
/// for the turn.
#[derive(Debug, Default)]
pub(super) struct Shared {
    last: Arc<Mutex<Option<Made>>>,
    waiting: Arc<AtomicUsize>,
}

/// A scrape counted among those waiting for the turn until it takes it
/// ([`Waiting::took`]) or its client leaves (dropped): the last to leave
/// lets the kept encoding go when the turn is free.
struct Waiting<'a> {
    shared: &'a Shared,
    took: bool,
}

impl<'a> Waiting<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.waiting.fetch_add(1, Ordering::AcqRel);
        Self {
            shared,
            took: false,
        }
    }

    /// Took the turn: no longer waiting. Whether others still wait.
    fn took(mut self) -> bool {
        self.took = true;
        self.shared.waiting.fetch_sub(1, Ordering::AcqRel) > 1
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.took {
            return;
        }
        let last = self.shared.waiting.fetch_sub(1, Ordering::AcqRel) == 1;
        // Held: by an encoding, which keeps nothing once none waits (or,
        // rarely, until the next scrape), or by a scrape, which lets it go
        // as the last to take it.
        if let (true, Ok(mut kept)) = (last, self.shared.last.try_lock()) {
            *kept = None;
        }
    }
}

impl Metrics {
    /// The exposition of every series, gzipped, as of this call or later:
    /// the last encoding if it started after this call, else a new one.
    ///
    /// # Errors
    ///
    /// A collector failed ([`ExpositionError::Encode`]) or panicked
    /// ([`ExpositionError::Panicked`]) in the encoding this scrape was
    /// given, or the runtime is shutting down.
    pub async fn exposition(self: &Arc<Self>) -> Result<Bytes, ExpositionError> {
        // Counted before it asks: an encoding that starts after the ask
        // sees it waiting when it ends.
        let waiting = Waiting::new(&self.shared);
        let asked = Instant::now();
        let mut turn = Arc::clone(&self.shared.last).lock_owned().await;
        let others_wait = waiting.took();
        if let Some(m) = turn.as_ref().filter(|m| m.started >= asked) {
            let made = m.made.clone();
            if !others_wait {
                *turn = None;
            }
            return made;
        }
        *turn = None;
        let (metrics, others) = (Arc::clone(self), Arc::clone(&self.shared.waiting));
        // The turn goes with the encoding: a scrape whose client leaves
        // meanwhile lets it finish, and the next scrape take it.
        let encoding = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let made = std::panic::catch_unwind(AssertUnwindSafe(|| metrics.encode_gzip()))
                .unwrap_or_else(|panic| Err(ExpositionError::Panicked(said(&*panic))))
                .inspect_err(|e| tracing::warn!("{}", crate::util::errors::chain(e)));
            // Kept for the scrapes that wait: any that asked before this
            // encoding started is counted by now.
            if others.load(Ordering::Acquire) > 0 {
                *turn = Some(Made {
                    started,
                    made: made.clone(),
                });
            }
            made
        });
        encoding
            .await
            .unwrap_or_else(|_| Err(ExpositionError::Stopping))
    }

    /// Every series, gzipped as it is written.
    fn encode_gzip(&self) -> Result<Bytes, ExpositionError> {
        let (written, gz) = crate::util::gzip::gzipped(|out| {
            prometheus_client::encoding::text::encode(&mut Text(out), &self.registry)
        });
        written.map_err(|fmt::Error| ExpositionError::Encode)?;
        // Exactly as long as the bytes: each client holds them until its
        // answer is sent.
        Ok(Bytes::from(gz.into_boxed_slice()))
    }
}

/// What a panic said, when it said it in text.
fn said(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

/// Text written into a compressor (which writes into memory: it does not
/// fail).
struct Text<W>(W);

impl<W: io::Write> fmt::Write for Text<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write_all(s.as_bytes()).map_err(|_| fmt::Error)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::Read as _,
        sync::atomic::{AtomicU64, Ordering},
        time::Duration,
    };

    use futures::StreamExt as _;
    use prometheus_client::{
        collector::Collector, encoding::DescriptorEncoder, registry::Registry,
    };

    use super::*;

    /// How a [`Counting`] collector ends.
    #[derive(Debug, Clone, Copy)]
    enum Ends {
        Well,
        Fails,
        Panics,
    }

    /// A collector that counts its encodings, each taking `delay`, and
    /// writes `series` more series; or fails, or panics.
    #[derive(Debug)]
    struct Counting {
        /// Encodings started.
        started: Arc<AtomicU64>,
        /// Encodings that wrote their count.
        encodings: Arc<AtomicU64>,
        delay: Duration,
        series: u64,
        ends: Ends,
    }

    impl Collector for Counting {
        fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
            self.started.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(self.delay);
            let n = self.encodings.fetch_add(1, Ordering::Relaxed) + 1;
            super::super::encode::counter(&mut enc, "encodings", "Encodings so far", n)?;
            match self.ends {
                Ends::Panics => panic!("a collector's bug"),
                Ends::Fails => return Err(fmt::Error),
                Ends::Well => {}
            }
            let series = (0..self.series).map(|i| (vec![("peer", format!("node-{i:05}"))], i));
            super::super::encode::gauges(&mut enc, "filler", "Series to fill pieces", series)
        }
    }

    /// Metrics of a [`Counting`] collector, and its count of encodings
    /// started.
    fn counting(delay: Duration, series: u64, ends: Ends) -> (Arc<Metrics>, Arc<AtomicU64>) {
        let started = Arc::new(AtomicU64::new(0));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Counting {
            started: Arc::clone(&started),
            encodings: Arc::default(),
            delay,
            series,
            ends,
        }));
        let metrics = Arc::new(Metrics {
            registry,
            shared: Shared::default(),
        });
        (metrics, started)
    }

    fn metrics(delay: Duration, series: u64, ends: Ends) -> Arc<Metrics> {
        counting(delay, series, ends).0
    }

    /// A scrape of `m` on a task of its own.
    fn scrape(m: &Arc<Metrics>) -> tokio::task::JoinHandle<Result<Bytes, ExpositionError>> {
        let m = Arc::clone(m);
        tokio::spawn(async move { m.exposition().await })
    }

    /// Until `started` has counted `n` encodings.
    async fn started_at_least(started: &AtomicU64, n: u64) {
        while started.load(Ordering::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn text(gz: &Bytes) -> String {
        let mut out = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut out)
            .expect("gzip");
        out
    }

    /// Scrapes one after another are each encoded; scrapes that ask while
    /// an encoding runs share the next one, made after they asked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scrapes_queued_behind_an_encoding_share_the_next_and_none_gets_older_figures() {
        let (m, started) = counting(Duration::from_millis(300), 0, Ends::Well);
        for n in 1..=2 {
            let gz = m.exposition().await.expect("an exposition");
            let t = text(&gz);
            assert!(t.contains(&format!("encodings_total {n}\n")), "{t}");
        }
        let first = scrape(&m);
        started_at_least(&started, 3).await;
        let queued: Vec<_> = (0..8).map(|_| scrape(&m)).collect();
        let first = first.await.expect("joined").expect("an exposition");
        assert!(text(&first).contains("encodings_total 3\n"));
        let mut answers = Vec::new();
        for q in queued {
            answers.push(q.await.expect("joined").expect("an exposition"));
        }
        for a in &answers {
            // The encoding under way when they asked is not theirs: the
            // next is, one for all eight.
            assert!(text(a).contains("encodings_total 4\n"), "{}", text(a));
            assert_eq!(a.as_ptr(), answers[0].as_ptr(), "one encoding shared");
        }
        let again = m.exposition().await.expect("an exposition");
        assert!(text(&again).contains("encodings_total 5\n"));
    }

    /// A client of the plain text that reads a piece and stops holds back
    /// no other scrape.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_stops_reading_holds_back_no_scrape() {
        let m = metrics(Duration::ZERO, 20_000, Ends::Well);
        let plain =
            crate::web::metrics_body(&m, &axum::http::Method::GET, &axum::http::HeaderMap::new())
                .await
                .expect("an answer");
        let mut stalled = plain.into_body().into_data_stream();
        let piece = stalled.next().await.expect("a piece").expect("read");
        assert_eq!(piece.len(), crate::util::gzip::PIECE);
        for n in 2..=3 {
            let gz = tokio::time::timeout(Duration::from_secs(5), m.exposition())
                .await
                .expect("not held back")
                .expect("an exposition");
            assert!(text(&gz).contains(&format!("encodings_total {n}\n")));
        }
        // The stalled client still reads its whole answer, as of its ask.
        let mut rest = piece.to_vec();
        while let Some(p) = stalled.next().await {
            rest.extend_from_slice(&p.expect("read"));
        }
        let rest = String::from_utf8(rest).expect("UTF-8");
        assert!(rest.contains("encodings_total 1\n") && rest.ends_with("# EOF\n"));
    }

    /// A scrape whose client leaves while its encoding runs lets the
    /// encoding end, then gives the turn to the next.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scrape_left_while_encoding_gives_the_turn_back_when_it_ends() {
        let (m, started) = counting(Duration::from_millis(300), 0, Ends::Well);
        let left = scrape(&m);
        started_at_least(&started, 1).await;
        left.abort();
        assert!(left.await.is_err_and(|e| e.is_cancelled()));
        let next = tokio::time::timeout(Duration::from_secs(5), m.exposition())
            .await
            .expect("the turn given back")
            .expect("an exposition");
        // The one left ran to its end; the next scrape asked after it
        // started, so it has one of its own.
        assert!(
            text(&next).contains("encodings_total 2\n"),
            "{}",
            text(&next)
        );
        assert_eq!(started.load(Ordering::Relaxed), 2);
    }

    /// Whether `m` keeps an encoding (its turn free).
    fn kept(m: &Metrics) -> bool {
        m.shared.last.try_lock().expect("the turn free").is_some()
    }

    /// A collector that fails or panics makes the scrape fail, naming it,
    /// and gives the turn back; the scrapes waiting for the turn when an
    /// encoding starts share its failure rather than each trying again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scrapes_waiting_for_a_failing_encoding_share_its_failure() {
        for (ends, said) in [
            (Ends::Fails, "a collector gave up"),
            (Ends::Panics, "panicked: a collector's bug"),
        ] {
            let (m, started) = counting(Duration::from_millis(200), 0, ends);
            for n in 1..=2 {
                let e = tokio::time::timeout(Duration::from_secs(5), m.exposition())
                    .await
                    .expect("the turn given back")
                    .expect_err("failed");
                assert!(e.to_string().contains(said), "{e}");
                assert_eq!(started.load(Ordering::Relaxed), n);
            }
            let first = scrape(&m);
            started_at_least(&started, 3).await;
            let queued: Vec<_> = (0..6).map(|_| scrape(&m)).collect();
            assert!(first.await.expect("joined").is_err());
            for q in queued {
                let e = q.await.expect("joined").expect_err("failed");
                assert!(e.to_string().contains(said), "{e}");
            }
            // The one under way when they asked, and one for all six.
            assert_eq!(started.load(Ordering::Relaxed), 4);
            assert!(!kept(&m), "no scrape waits: nothing kept");
            let answer = crate::web::metrics_body(
                &m,
                &axum::http::Method::GET,
                &axum::http::HeaderMap::new(),
            )
            .await;
            assert!(answer.is_err());
        }
    }

    /// An encoding is kept only while scrapes wait for it: one after
    /// another keep none, and the last of a queue to take it lets it go.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_encoding_is_kept_once_no_scrape_waits_for_it() {
        let (m, started) = counting(Duration::from_millis(200), 100, Ends::Well);
        m.exposition().await.expect("an exposition");
        assert!(!kept(&m), "a scrape alone keeps nothing");
        let first = scrape(&m);
        started_at_least(&started, 2).await;
        let queued: Vec<_> = (0..4).map(|_| scrape(&m)).collect();
        first.await.expect("joined").expect("an exposition");
        for q in queued {
            q.await.expect("joined").expect("an exposition");
        }
        assert_eq!(started.load(Ordering::Relaxed), 3);
        assert!(!kept(&m), "the queue drained: nothing kept");
    }

    /// Scrapes that leave while waiting let the kept encoding go when the
    /// last of them leaves and the turn is free.
    #[test]
    fn the_last_scrape_to_leave_while_waiting_lets_the_kept_encoding_go() {
        let shared = Shared::default();
        let keep = || {
            *shared.last.try_lock().expect("free") = Some(Made {
                started: Instant::now(),
                made: Ok(Bytes::from_static(b"kept")),
            });
        };
        let is_kept = || shared.last.try_lock().expect("free").is_some();
        keep();
        let (first, second) = (Waiting::new(&shared), Waiting::new(&shared));
        drop(first);
        assert!(is_kept(), "one still waits");
        drop(second);
        assert!(!is_kept(), "none waits");
        keep();
        let (took, left) = (Waiting::new(&shared), Waiting::new(&shared));
        assert!(took.took(), "another waits");
        drop(left);
        assert!(!is_kept(), "the last one left");
        // The turn taken when the last leaves: kept, for the next scrape
        // to let go.
        keep();
        let left = Waiting::new(&shared);
        let held = shared.last.try_lock().expect("free");
        drop(left);
        drop(held);
        assert!(is_kept());
        assert_eq!(shared.waiting.load(Ordering::Acquire), 0);
    }

    /// A `HEAD` is answered the head of a scrape, without an encoding.
    #[tokio::test]
    async fn a_head_makes_no_encoding() {
        let (m, started) = counting(Duration::ZERO, 0, Ends::Well);
        let mut gzip = axum::http::HeaderMap::new();
        gzip.insert(
            axum::http::header::ACCEPT_ENCODING,
            "gzip".parse().expect("a value"),
        );
        for (headers, encoded) in [(axum::http::HeaderMap::new(), false), (gzip, true)] {
            let head = crate::web::metrics_body(&m, &axum::http::Method::HEAD, &headers)
                .await
                .expect("an answer");
            assert_eq!(head.status(), axum::http::StatusCode::OK);
            assert_eq!(
                head.headers()
                    .get(axum::http::header::CONTENT_ENCODING)
                    .is_some(),
                encoded
            );
            assert_eq!(
                head.headers()[axum::http::header::CONTENT_TYPE],
                super::super::CONTENT_TYPE
            );
        }
        assert_eq!(started.load(Ordering::Relaxed), 0);
    }
}
