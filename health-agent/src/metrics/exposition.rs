//! The exposition, encoded on a blocking thread (the pinned maps' reads
//! and, with `--metrics-per-peer`, two walks of every path), gzipped as it
//! is written, and shared: a scrape takes the last encoding if that one
//! started after the scrape asked, and encodes anew otherwise. Scrapes
//! that queue behind an encoding therefore share the next one, however
//! many they are, and no scrape is answered with figures older than its
//! request.
//!
//! The turn to encode is held for the encoding alone, never while a
//! client reads: every client is sent the shared bytes (gzipped, or
//! decompressed as it reads them, [`crate::util::gzip`]), so a client
//! that reads slowly, or not at all, holds back no other scrape and holds
//! the encoding it was given, not a copy.

use std::{fmt, io, sync::Arc, time::Instant};

use bytes::Bytes;
use tokio::sync::Mutex;

use super::Metrics;

/// Why a scrape has no exposition.
#[derive(Debug, thiserror::Error)]
pub enum ExpositionError {
    #[error("encoding the metrics failed (a collector gave up)")]
    Encode,
    #[error("encoding the metrics failed: the encoder panicked")]
    Lost(#[source] tokio::task::JoinError),
}

/// An encoding, and when it started.
pub(super) struct Made {
    started: Instant,
    gzip: Bytes,
}

impl fmt::Debug for Made {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Made")
            .field("started", &self.started)
            .field("gzip_bytes", &self.gzip.len())
            .finish()
    }
}

/// The last encoding, behind the turn to encode.
#[derive(Debug, Default)]
pub(super) struct Shared {
    last: Arc<Mutex<Option<Made>>>,
}

impl Metrics {
    /// The exposition of every series, gzipped, as of this call or later:
    /// the last encoding if it started after this call, else a new one.
    ///
    /// # Errors
    ///
    /// A collector failed ([`ExpositionError::Encode`]), or the encoder
    /// panicked ([`ExpositionError::Lost`]).
    pub async fn exposition(self: &Arc<Self>) -> Result<Bytes, ExpositionError> {
        let asked = Instant::now();
        let mut turn = Arc::clone(&self.shared.last).lock_owned().await;
        if let Some(made) = turn.as_ref().filter(|m| m.started >= asked) {
            return Ok(made.gzip.clone());
        }
        let metrics = Arc::clone(self);
        // The turn goes with the encoding: a scrape whose client leaves
        // meanwhile lets it finish, and the next scrape take it.
        let encoding = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let gzip = metrics.encode_gzip()?;
            *turn = Some(Made {
                started,
                gzip: gzip.clone(),
            });
            Ok(gzip)
        });
        encoding
            .await
            .unwrap_or_else(|e| Err(ExpositionError::Lost(e)))
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
        let scrape = || {
            let m = Arc::clone(&m);
            tokio::spawn(async move { m.exposition().await })
        };
        let first = scrape();
        started_at_least(&started, 3).await;
        let queued: Vec<_> = (0..8).map(|_| scrape()).collect();
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
        let plain = crate::web::metrics_body(&m, &axum::http::HeaderMap::new())
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
        let left = tokio::spawn({
            let m = Arc::clone(&m);
            async move { m.exposition().await }
        });
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

    /// A collector that fails or panics makes the scrape fail, naming it,
    /// and gives the turn back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn an_encoding_that_fails_or_panics_fails_the_scrape_and_gives_the_turn_back() {
        for (ends, said) in [
            (Ends::Fails, "a collector gave up"),
            (Ends::Panics, "panicked"),
        ] {
            let m = metrics(Duration::ZERO, 0, ends);
            for _ in 0..2 {
                let e = tokio::time::timeout(Duration::from_secs(5), m.exposition())
                    .await
                    .expect("the turn given back")
                    .expect_err("failed");
                assert!(e.to_string().contains(said), "{e}");
            }
            let answer = crate::web::metrics_body(&m, &axum::http::HeaderMap::new()).await;
            assert!(answer.is_err());
        }
    }
}
