//! A typed client of the API socket: it owns the paths and decodes every
//! answer into the server's own types.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use http_body_util::{BodyExt as _, Empty};
use hyper::{Request, StatusCode, body::Bytes};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::net::UnixStream;

use super::types::{ApiError, Healthz, NodesView, paths};
use crate::{
    endpoint::EndpointView,
    probe::{
        history::{HistoryStats, HistoryStrips, NodeHistory},
        status::{ClusterStatus, StatusSummary},
    },
};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot reach the health agent at {path} (is `health-agent daemon` running? the socket is set by --socket or HEALTH_AGENT_SOCK)"
    )]
    Unreachable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the health agent's socket {path} is not open to this user (it is to root and the daemon's --socket-group)"
    )]
    Forbidden {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the health agent at {path} takes no connection now: its queue of connections is full (the agent busy, or flooded); try again"
    )]
    Busy {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("talking to the health agent at {path}")]
    Http { path: PathBuf, source: hyper::Error },
    #[error(
        "the health agent at {path} took the connection but did not answer within {}s (stuck or overloaded? its log says why)",
        after.as_secs_f64()
    )]
    Timeout { path: PathBuf, after: Duration },
    #[error("the health agent answered {status}: {message}")]
    Api { status: StatusCode, message: String },
    #[error("the health agent's answer to {what} is not what this client expects")]
    Decode {
        what: String,
        source: serde_json::Error,
    },
    #[error("the health agent's gzipped answer to {path} does not decompress")]
    Gzip {
        path: String,
        source: std::io::Error,
    },
}

impl ClientError {
    /// Connecting to `path` failed with `source`: a user the socket is
    /// not open to, or a client the agent's full queue of connections
    /// refuses (`EAGAIN`), is told so, not sent to look for a stopped
    /// agent.
    fn connecting(path: &Path, source: std::io::Error) -> Self {
        let path = path.to_owned();
        match source.kind() {
            std::io::ErrorKind::PermissionDenied => Self::Forbidden { path, source },
            std::io::ErrorKind::WouldBlock => Self::Busy { path, source },
            _ => Self::Unreachable { path, source },
        }
    }

    /// The HTTP status of an error answer.
    #[must_use]
    pub const fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// How long the agent has to answer a call whole, from the connection to
/// the body's last byte; a call that asks the agent to wait (a round to
/// come, a probe round) has its wait on top.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// The agent's API on a unix socket.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    answer_within: Duration,
}

impl Client {
    #[must_use]
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            answer_within: ANSWER_WITHIN,
        }
    }

    /// The same client, giving the agent `limit` to answer a call (see
    /// [`ANSWER_WITHIN`]).
    #[must_use]
    pub const fn answering_within(mut self, limit: Duration) -> Self {
        self.answer_within = limit;
        self
    }

    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `GET /v1/healthz`.
    pub async fn healthz(&self) -> Result<Healthz, ClientError> {
        self.call("GET", paths::HEALTHZ).await
    }

    /// `GET /v1/status`: the last published round.
    pub async fn status(&self) -> Result<ClusterStatus, ClientError> {
        self.call("GET", paths::STATUS).await
    }

    /// `GET /v1/status?QUERY` (`state=failure`, `node=NAME`, ...).
    pub async fn status_filtered(&self, query: &str) -> Result<ClusterStatus, ClientError> {
        self.call("GET", &format!("{}?{query}", paths::STATUS))
            .await
    }

    /// `GET /v1/cluster`: the cluster view (with etcd discovery).
    pub async fn cluster(&self) -> Result<crate::cluster::view_cell::ClusterReply, ClientError> {
        self.call("GET", paths::CLUSTER).await
    }

    /// `GET /v1/cluster/matrix`: the cluster view, observers by targets.
    pub async fn cluster_matrix(
        &self,
    ) -> Result<crate::cluster::matrix::ClusterMatrix, ClientError> {
        self.call("GET", paths::CLUSTER_MATRIX).await
    }

    /// `GET /v1/status?summary=true`.
    pub async fn status_summary(&self) -> Result<StatusSummary, ClientError> {
        self.call("GET", &format!("{}?summary=true", paths::STATUS))
            .await
    }

    /// `GET /v1/status?summary=true&after=SEQ&wait=WAIT`: the summary once
    /// a round later than `after` is published, or after `wait` (at most
    /// [`MAX_WAIT`](super::round_wait::MAX_WAIT)) with the round as it is.
    pub async fn status_summary_after(
        &self,
        after: u64,
        wait: Duration,
    ) -> Result<StatusSummary, ClientError> {
        // The agent takes whole milliseconds, at least one.
        let ms = wait.as_millis().max(1);
        self.call_waiting(
            "GET",
            &format!("{}?summary=true&after={after}&wait={ms}ms", paths::STATUS),
            wait,
        )
        .await
    }

    /// `GET /v1/status/history?node=NAME`: the node's paths over the
    /// history's window (404 for a node not in the set).
    pub async fn history(&self, node: &str) -> Result<NodeHistory, ClientError> {
        self.call(
            "GET",
            &format!("{}?node={}", paths::STATUS_HISTORY, escaped(node)),
        )
        .await
    }

    /// `GET /v1/status/quality?node=NAME`: the node's paths over the
    /// sliding windows (404 for a node not in the set).
    pub async fn quality(
        &self,
        node: &str,
    ) -> Result<crate::probe::quality_view::NodeQuality, ClientError> {
        self.call(
            "GET",
            &format!("{}?node={}", paths::STATUS_QUALITY, escaped(node)),
        )
        .await
    }

    /// `GET /v1/status/history`: every node's paths as strips.
    pub async fn history_strips(&self) -> Result<HistoryStrips, ClientError> {
        self.call("GET", paths::STATUS_HISTORY).await
    }

    /// `GET /v1/status/history?stats=true`: every node's loss ratio and
    /// RTT percentiles over the window.
    pub async fn history_stats(&self) -> Result<HistoryStats, ClientError> {
        self.call("GET", &format!("{}?stats=true", paths::STATUS_HISTORY))
            .await
    }

    /// `PUT /v1/status/probe`: a fresh round within `timeout`.
    pub async fn probe(&self, timeout: Duration) -> Result<ClusterStatus, ClientError> {
        let path = format!("{}?timeout={}ms", paths::STATUS_PROBE, timeout.as_millis());
        self.call_waiting("PUT", &path, timeout).await
    }

    /// `GET /v1/nodes`.
    pub async fn nodes(&self) -> Result<NodesView, ClientError> {
        self.call("GET", paths::NODES).await
    }

    /// `GET /v1/endpoints`.
    pub async fn endpoints(&self) -> Result<Vec<EndpointView>, ClientError> {
        self.call("GET", paths::ENDPOINTS).await
    }

    /// `GET /v1/endpoints/{id}`; `id` as given (the server checks it).
    pub async fn endpoint(&self, id: &str) -> Result<EndpointView, ClientError> {
        let path = paths::ENDPOINT.replace("{id}", id);
        self.call("GET", &path).await
    }

    /// Any request, for paths and methods the typed calls do not cover
    /// (and for tests of bad requests): the status and the raw body.
    pub async fn raw(&self, method: &str, path: &str) -> Result<(StatusCode, Bytes), ClientError> {
        request(&self.socket, method, path, self.answer_within).await
    }

    /// Any request, its body as the server sent it (gzip-encoded when the
    /// server chose to, which the flag tells): what a load generator
    /// reads, without the client's own decoding in the time it measures.
    pub async fn raw_as_sent(
        &self,
        method: &str,
        path: &str,
    ) -> Result<(StatusCode, Bytes, bool), ClientError> {
        within(
            &self.socket,
            self.answer_within,
            request_as_sent(&self.socket, method, path),
        )
        .await
    }

    async fn call<T: DeserializeOwned>(&self, method: &str, path: &str) -> Result<T, ClientError> {
        self.call_waiting(method, path, Duration::ZERO).await
    }

    /// [`Self::call`] of a request that asks the agent to wait up to
    /// `wait`: the answer is given that much longer.
    async fn call_waiting<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        wait: Duration,
    ) -> Result<T, ClientError> {
        let limit = self.answer_within.saturating_add(wait);
        let (status, body) = request(&self.socket, method, path, limit).await?;
        if !status.is_success() {
            let message = serde_json::from_slice::<ApiError>(&body).map_or_else(
                |_| String::from_utf8_lossy(&body).into_owned(),
                |e| e.message,
            );
            return Err(ClientError::Api { status, message });
        }
        serde_json::from_slice(&body).map_err(|source| ClientError::Decode {
            what: path.to_owned(),
            source,
        })
    }
}

/// `work` on the socket `socket`, given `limit` to finish.
async fn within<T>(
    socket: &Path,
    limit: Duration,
    work: impl Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
        Err(ClientError::Timeout {
            path: socket.to_owned(),
            after: limit,
        })
    })
}

async fn request(
    socket: &Path,
    method: &str,
    path: &str,
    limit: Duration,
) -> Result<(StatusCode, Bytes), ClientError> {
    let (status, body, gzipped) =
        within(socket, limit, request_as_sent(socket, method, path)).await?;
    if gzipped {
        let mut plain = Vec::with_capacity(body.len() * 8);
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&body[..]), &mut plain)
            .map_err(|source| ClientError::Gzip {
                path: path.to_owned(),
                source,
            })?;
        return Ok((status, Bytes::from(plain)));
    }
    Ok((status, body))
}

/// `value` as a query value: every byte but letters and digits escaped, so
/// that a name with `&` or `%` in it is asked for as itself.
fn escaped(value: &str) -> percent_encoding::PercentEncode<'_> {
    percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC)
}

/// The status, the body as sent and whether it is gzip-encoded.
async fn request_as_sent(
    socket: &Path,
    method: &str,
    path: &str,
) -> Result<(StatusCode, Bytes, bool), ClientError> {
    let http = |source| ClientError::Http {
        path: socket.to_owned(),
        source,
    };
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| ClientError::connecting(socket, source))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    let conn = tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "health-agent")
        .header("accept-encoding", "gzip")
        .body(Empty::<Bytes>::new())
        .map_err(|e| ClientError::Api {
            status: StatusCode::BAD_REQUEST,
            message: format!("invalid request {method} {path}: {e}"),
        })?;
    let resp = sender.send_request(req).await.map_err(http)?;
    let status = resp.status();
    let gzipped = resp
        .headers()
        .get("content-encoding")
        .is_some_and(|v| v.as_bytes() == b"gzip");
    let body = resp.into_body().collect().await.map_err(http)?.to_bytes();
    conn.abort();
    Ok((status, body, gzipped))
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    /// A socket path of the test's own under the temporary directory,
    /// removed when dropped (a failed assertion included).
    struct TempSocket(PathBuf);

    impl TempSocket {
        fn new(tag: &str) -> Self {
            Self(std::env::temp_dir().join(format!(
                "health-agent-{tag}-{}-{}.sock",
                std::process::id(),
                fastrand::u64(..)
            )))
        }
    }

    impl Drop for TempSocket {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn a_socket_closed_to_the_user_is_not_called_a_stopped_agent() {
        let path = Path::new("/run/health/agent.sock");
        let denied = ClientError::connecting(path, io::ErrorKind::PermissionDenied.into());
        let text = denied.to_string();
        assert!(
            text.contains("/run/health/agent.sock") && text.contains("--socket-group"),
            "{text}"
        );
        let gone = ClientError::connecting(path, io::ErrorKind::NotFound.into()).to_string();
        assert!(gone.contains("is `health-agent daemon` running?"), "{gone}");
    }

    /// A listener whose queue of connections is full (one that does not
    /// accept): the client says the agent takes no connection now, not
    /// that it is not running.
    #[tokio::test]
    async fn a_full_queue_of_connections_is_not_called_a_stopped_agent() {
        let socket = TempSocket::new("full");
        let path = &socket.0;
        let listener = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)
            .expect("socket");
        listener
            .bind(&socket2::SockAddr::unix(path).expect("address"))
            .expect("bind");
        listener.listen(0).expect("listen");
        // Connections the listener never accepts fill its queue.
        let mut queued = Vec::new();
        loop {
            let c = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)
                .expect("socket");
            c.set_nonblocking(true).expect("non-blocking");
            match c.connect(&socket2::SockAddr::unix(path).expect("address")) {
                Ok(()) => queued.push(c),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("connect: {e}"),
            }
            assert!(queued.len() < 8, "the queue never filled");
        }
        let err = tokio::time::timeout(Duration::from_secs(5), Client::new(path).healthz())
            .await
            .expect("refused at once")
            .err();
        assert!(matches!(err, Some(ClientError::Busy { .. })), "{err:?}");
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("takes no connection now"), "{text}");
    }

    /// An agent that takes the connection and never answers: the call
    /// fails once its time is up, naming the socket, and does not hang.
    #[tokio::test]
    async fn an_agent_that_never_answers_fails_the_call_in_time() {
        let socket = TempSocket::new("mute");
        let path = &socket.0;
        let listener = tokio::net::UnixListener::bind(path).expect("bind");
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((c, _)) = listener.accept().await {
                open.push(c);
            }
        });
        let client = Client::new(path).answering_within(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let err = client.healthz().await.err();
        let took = started.elapsed();
        // A call that asks the agent to wait gets that wait on top.
        let waited = std::time::Instant::now();
        let probe = client.probe(Duration::from_millis(400)).await.err();
        let probe_took = waited.elapsed();
        held.abort();
        assert!(matches!(err, Some(ClientError::Timeout { .. })), "{err:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains(&path.display().to_string())
                && text.contains("did not answer within 0.3s"),
            "{text}"
        );
        assert!(
            matches!(probe, Some(ClientError::Timeout { .. })),
            "{probe:?}"
        );
        assert!(probe_took >= Duration::from_millis(700), "{probe_took:?}");
    }
}
