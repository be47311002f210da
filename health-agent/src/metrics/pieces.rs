//! The exposition sent as it is written: encoded on a blocking thread
//! (the pinned maps' reads and, with `--metrics-per-peer`, two walks of
//! every path), one scrape at a time, into pieces of at most [`PIECE`]
//! bytes, the encoder waiting while the client has [`PIECES_AHEAD`] of
//! them unread. A scrape at 10,000 peers holds a few pieces and a chunk
//! of nodes' statuses, not the megabytes of its text.
//!
//! A scrape has its turn for [`Metrics::deadline`] at most (30 s): a
//! client that reads too slowly, or not at all, cannot hold back the
//! scrapes queued behind it. A client that goes ends the encoding, or
//! its wait for a turn. An encoding that fails or runs out of time ends
//! the body with an error, so the client sees a broken answer, not a
//! short one.

use std::{
    fmt, io,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::Poll,
};

use bytes::Bytes;
use tokio::{
    runtime::Handle,
    sync::{Semaphore, mpsc},
    time::Instant,
};

use super::Metrics;

/// The size of a piece, at most.
pub(crate) const PIECE: usize = 64 << 10;
/// Pieces written and not yet sent, at most.
const PIECES_AHEAD: usize = 2;

/// `metrics`' exposition in pieces, encoded once one of `turns` is free.
pub(super) fn stream(
    metrics: Arc<Metrics>,
    turns: Arc<Semaphore>,
) -> impl futures::Stream<Item = Result<Bytes, io::Error>> + Send + 'static {
    let (tx, mut rx) = mpsc::channel(PIECES_AHEAD);
    let broken = Arc::new(AtomicBool::new(false));
    let failed = Arc::clone(&broken);
    tokio::spawn(async move {
        let turn = tokio::select! {
            turn = turns.acquire_owned() => turn,
            // Gone while waiting: no turn taken.
            () = tx.closed() => return,
        };
        let Ok(turn) = turn else { return };
        // Held until the flag is set: the body ends once every sender
        // is gone, and must not end before it can say it is broken.
        let holding = tx.clone();
        let out = Pieces {
            tx,
            piece: String::with_capacity(PIECE),
            until: Instant::now() + metrics.deadline,
            runtime: Handle::current(),
        };
        let encoding = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            encode(&metrics, out)
        });
        if !matches!(encoding.await, Ok(Sent::Whole | Sent::ClientGone)) {
            failed.store(true, Ordering::Release);
        }
        drop(holding);
    });
    futures::stream::poll_fn(move |cx| match rx.poll_recv(cx) {
        Poll::Ready(None) if broken.swap(false, Ordering::Acquire) => Poll::Ready(Some(Err(
            io::Error::other("encoding the metrics failed or ran out of time"),
        ))),
        other => other.map(|piece| piece.map(Ok)),
    })
}

/// How a scrape's encoding ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Whole,
    ClientGone,
    /// The client did not take a piece before the deadline.
    TooSlow,
    Failed,
}

/// Encodes into `out`, sending each piece as it fills and the last at
/// the end.
fn encode(metrics: &Metrics, mut out: Pieces) -> Sent {
    let sent = prometheus_client::encoding::text::encode(&mut out, &metrics.registry)
        .and_then(|()| out.send());
    match sent {
        Ok(()) => Sent::Whole,
        Err(_) if out.tx.is_closed() => Sent::ClientGone,
        Err(_) if Instant::now() >= out.until => {
            tracing::warn!(
                deadline = ?metrics.deadline,
                "a metrics client read too slowly: its answer ends broken"
            );
            Sent::TooSlow
        }
        Err(_) => {
            tracing::warn!("encoding the metrics failed: the answer ends broken");
            Sent::Failed
        }
    }
}

/// Text written into pieces, each sent before it would pass [`PIECE`],
/// each send waiting for the client until the scrape's deadline.
struct Pieces {
    tx: mpsc::Sender<Bytes>,
    piece: String,
    until: Instant,
    runtime: Handle,
}

impl Pieces {
    /// Sends the piece written so far, waiting for room.
    fn send(&mut self) -> fmt::Result {
        let piece = Bytes::from(std::mem::replace(
            &mut self.piece,
            String::with_capacity(PIECE),
        ));
        let (tx, until) = (&self.tx, self.until);
        let sent = self
            .runtime
            .block_on(async { tokio::time::timeout_at(until, tx.send(piece)).await });
        match sent {
            Ok(Ok(())) => Ok(()),
            _ => Err(fmt::Error),
        }
    }
}

impl fmt::Write for Pieces {
    fn write_str(&mut self, mut s: &str) -> fmt::Result {
        while self.piece.len() + s.len() > PIECE {
            if self.piece.is_empty() {
                // Longer than a piece alone: cut where a character ends.
                let cut = s.floor_char_boundary(PIECE);
                self.piece.push_str(&s[..cut]);
                s = &s[cut..];
            }
            self.send()?;
        }
        self.piece.push_str(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;

    fn pieces(tx: mpsc::Sender<Bytes>, runtime: &tokio::runtime::Runtime) -> Pieces {
        Pieces {
            tx,
            piece: String::with_capacity(PIECE),
            until: Instant::now() + std::time::Duration::from_secs(5),
            runtime: runtime.handle().clone(),
        }
    }

    #[test]
    fn text_is_cut_into_pieces_of_at_most_a_piece_and_stops_when_the_client_goes() {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let (tx, mut rx) = mpsc::channel(64);
        let mut out = pieces(tx, &runtime);
        // Writes of every size, one longer than two pieces, of
        // characters of three bytes: a piece's size falls inside one.
        let long = "€".repeat(PIECE);
        for s in ["a", &"b".repeat(PIECE - 3), "cdef", &long, "g"] {
            out.write_str(s).expect("written");
        }
        out.send().expect("sent");
        drop(out);
        let mut got = Vec::new();
        while let Ok(p) = rx.try_recv() {
            assert!(p.len() <= PIECE, "{}", p.len());
            assert!(std::str::from_utf8(&p).is_ok(), "cut between characters");
            got.extend_from_slice(&p);
        }
        let text = String::from_utf8(got).expect("every piece cut between characters");
        assert_eq!(text, format!("a{}cdef{long}g", "b".repeat(PIECE - 3)));
        // The client gone: the next piece's send fails, and so the
        // encoding that writes it.
        let (tx, rx) = mpsc::channel(64);
        drop(rx);
        let mut out = pieces(tx, &runtime);
        out.write_str(&"x".repeat(PIECE)).expect("a piece held");
        assert!(out.write_str("y").is_err());
    }

    /// A collector that writes a series, then fails, or panics.
    #[derive(Debug)]
    struct Failing {
        panics: bool,
    }

    impl prometheus_client::collector::Collector for Failing {
        fn encode(&self, mut enc: prometheus_client::encoding::DescriptorEncoder) -> fmt::Result {
            super::super::encode::counter(&mut enc, "written_first", "A series", 1)?;
            assert!(!self.panics, "a collector's bug");
            Err(fmt::Error)
        }
    }

    /// A scrape whose encoding fails, or panics, ends broken, not as a
    /// short answer, and gives its turn back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn an_encoding_that_fails_or_panics_ends_the_body_broken() {
        use futures::StreamExt as _;
        for panics in [false, true] {
            let mut registry = prometheus_client::registry::Registry::default();
            registry.register_collector(Box::new(Failing { panics }));
            let metrics = Arc::new(Metrics {
                registry,
                turns: Arc::new(Semaphore::new(1)),
                deadline: std::time::Duration::from_secs(5),
            });
            let body: Vec<_> = metrics.pieces().collect().await;
            assert!(
                body.last().is_some_and(Result::is_err),
                "panics: {panics}: {body:?}"
            );
            assert_eq!(body.iter().filter(|p| p.is_err()).count(), 1);
            assert_eq!(metrics.turns.available_permits(), 1, "the turn given back");
        }
    }
}
