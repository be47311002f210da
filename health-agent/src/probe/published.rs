//! The published status of the latest round, serialised once: its gzipped
//! JSON is written when it is published, never held whole.

use std::sync::Arc;

use bytes::Bytes;

use super::status::{ClusterStatus, StatusSummary};

/// The published status, its JSON and its summary made once.
#[derive(Clone)]
pub(super) struct Published {
    pub(super) status: Arc<ClusterStatus>,
    /// `GET /v1/status?summary=true`, counted once (a count walks every
    /// node: at 10,000 nodes, asked for in a loop, it was most of the
    /// answer's cost).
    pub(super) summary: Arc<StatusSummary>,
    /// The status as gzipped JSON, written once when it is published: the
    /// JSON itself (4.7 MB at 5,000 nodes, ten times its gzip) is never
    /// held whole, neither kept nor built.
    pub(super) gzip: Bytes,
}

/// `status` as JSON, gzipped as it is written (through a buffer that
/// gives the compressor large writes).
pub(super) fn gzipped_json(status: &ClusterStatus) -> Bytes {
    use std::io::Write as _;
    let enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut out = std::io::BufWriter::with_capacity(64 << 10, enc);
    // Writing to a Vec cannot fail, nor serialising the status.
    let _ = serde_json::to_writer(&mut out, status);
    let _ = out.flush();
    let bytes = out
        .into_inner()
        .ok()
        .and_then(|enc| enc.finish().ok())
        .unwrap_or_default();
    Bytes::from(bytes)
}

pub(super) fn serialised(status: ClusterStatus) -> Published {
    Published {
        gzip: gzipped_json(&status),
        summary: Arc::new(status.summary()),
        status: Arc::new(status),
    }
}
