//! The exposition sent as it is written: encoded on a blocking thread
//! (the pinned maps' reads and, with `--metrics-per-peer`, two walks of
//! every path), one scrape at a time, into pieces of at most [`PIECE`]
//! bytes, the encoder waiting while the client has [`PIECES_AHEAD`] of
//! them unread. A scrape at 10,000 peers holds a few pieces and a chunk
//! of nodes' statuses, not the megabytes of its text. A client that goes
//! ends the encoding; an encoding that fails ends the body with an error,
//! so the client sees a broken answer, not a short one.

use std::{fmt, io, sync::Arc};

use bytes::Bytes;
use tokio::sync::{Semaphore, mpsc};

use super::Metrics;

/// The size of a piece, at most.
pub(crate) const PIECE: usize = 64 << 10;
/// Pieces written and not yet sent, at most.
const PIECES_AHEAD: usize = 2;

/// A piece of the body, or why it ends broken.
pub(super) type Piece = Result<Bytes, io::Error>;

/// `metrics`' exposition in pieces, encoded once one of `turns` is free.
pub(super) fn stream(
    metrics: Arc<Metrics>,
    turns: Arc<Semaphore>,
) -> impl futures::Stream<Item = Piece> + Send + 'static {
    let (tx, mut rx) = mpsc::channel(PIECES_AHEAD);
    tokio::spawn(async move {
        let Ok(turn) = turns.acquire_owned().await else {
            return;
        };
        if tx.is_closed() {
            return;
        }
        let out = Pieces {
            tx: tx.clone(),
            piece: String::with_capacity(PIECE),
        };
        let encoding = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            encode(&metrics, out);
        });
        if let Err(e) = encoding.await {
            let _ = tx
                .send(Err(io::Error::other(format!("encoding the metrics: {e}"))))
                .await;
        }
    });
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Encodes into `out`, sending each piece as it fills and the last at
/// the end; a failure is logged and sent as the body's error.
fn encode(metrics: &Metrics, mut out: Pieces) {
    let sent = prometheus_client::encoding::text::encode(&mut out, &metrics.registry)
        .and_then(|()| out.send());
    // A client that went is nothing to tell.
    if sent.is_err() && !out.tx.is_closed() {
        tracing::warn!("encoding the metrics failed: the answer ends broken");
        let _ = out
            .tx
            .blocking_send(Err(io::Error::other("encoding the metrics failed")));
    }
}

/// Text written into pieces, each sent before it would pass [`PIECE`].
struct Pieces {
    tx: mpsc::Sender<Piece>,
    piece: String,
}

impl Pieces {
    /// Sends the piece written so far, waiting for room.
    fn send(&mut self) -> fmt::Result {
        let piece = std::mem::replace(&mut self.piece, String::with_capacity(PIECE));
        self.tx
            .blocking_send(Ok(Bytes::from(piece)))
            .map_err(|_| fmt::Error)
    }
}

impl fmt::Write for Pieces {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.piece.len() + s.len() > PIECE && !self.piece.is_empty() {
            self.send()?;
        }
        self.piece.push_str(s);
        Ok(())
    }
}
