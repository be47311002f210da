//! The metrics listener: `/metrics`, the connectivity page and the read-only `/api` on TCP.
//! Imported by `daemon` and `config` (its settings); imports `api`, `metrics`, `page`.
//!
//! The metrics listener (`--prometheus-serve-addr`): read-only, on TCP.
//! It serves `GET /metrics` for Prometheus, the connectivity page at `/`,
//! and under `/api` the read-only views the page draws from (the status and
//! its history, as on the unix socket). Bounded: [`Limits::LISTENER`]
//! (header and idle timeouts, an age, a connection cap and a share of it
//! per client), and only for its own hosts ([`host`]).

pub mod conn;
pub mod host;
pub mod settings;

use std::{io, net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

pub use self::conn::Limits;
use crate::{
    api::server::ApiState,
    metrics::Metrics,
    util::{
        admission::{self, Admission, Refused},
        source::Source,
    },
};

/// After a failed accept (out of descriptors, say), before the next.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("binding the metrics listener on {addr}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("serving the metrics listener on {addr}")]
    Serve { addr: SocketAddr, source: io::Error },
}

/// The metrics listener's socket on `addr`, non-blocking, accepting a
/// connection when its first bytes arrive, or after
/// [`admission::ACCEPT_ON_DATA`]. Connections waiting so count against
/// its [`BACKLOG`], past which the kernel answers with SYN cookies and
/// accepts on the handshake: the wait is then gone.
pub fn listen(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())?;
    crate::sys::sockopt::defer_accept(&sock, admission::ACCEPT_ON_DATA)?;
    sock.listen(BACKLOG)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

/// Connections the metrics listener's kernel queues, accepted or waiting
/// for their first bytes: 16 times its connections at once (std's 128
/// let a client connecting 128 times a second without sending turn the
/// wait off).
pub const BACKLOG: i32 = 1024;

/// Everything the listener serves, for the hosts of [`host::AllowedHosts`]
/// (see [`host::require_allowed_host`]). Every answer, a refusal
/// included, says it is not to be sniffed for another type (some echo
/// what was asked); the API's are stored by no cache (a shared one
/// behind a proxy of `--web-allowed-hosts` would hand the status to
/// others).
pub fn router(metrics: Arc<Metrics>, api: ApiState, allowed: host::AllowedHosts) -> Router {
    let api = crate::api::server::read_only_routes(api)
        .layer(axum::middleware::map_response(stored_by_no_cache));
    Router::new()
        .route("/metrics", get(metrics_text))
        .with_state(metrics)
        .nest("/api", api)
        .merge(crate::page::routes())
        .fallback(no_such_page)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            allowed,
            host::require_allowed_host,
        ))
        .layer(axum::middleware::map_response(not_sniffed))
}

async fn not_sniffed(mut response: Response) -> Response {
    response.headers_mut().insert(
        axum::http::header::X_CONTENT_TYPE_OPTIONS,
        axum::http::HeaderValue::from_static("nosniff"),
    );
    response
}

async fn stored_by_no_cache(mut response: Response) -> Response {
    response.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    response
}

/// Outside `/api` (whose answers are JSON), a line of text.
async fn no_such_page(uri: axum::http::Uri) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!("no such page: {}\n", uri.path()),
    )
        .into_response()
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(axum::http::header::ALLOW, "GET, HEAD")],
        format!(
            "{method} is not served at {}: the listener is read-only\n",
            uri.path()
        ),
    )
        .into_response()
}

async fn metrics_text(
    State(metrics): State<Arc<Metrics>>,
    method: axum::http::Method,
    headers: axum::http::HeaderMap,
) -> Response {
    metrics_body(&metrics, &method, &headers)
        .await
        .unwrap_or_else(|e| {
            let e = crate::util::errors::chain(&e);
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
        })
}

/// The metrics' exposition as of the request (see [`Metrics::exposition`]):
/// gzipped for a client that takes it, decompressed as it is read for
/// one that does not. A `HEAD` is answered the same head without an
/// encoding being made.
///
/// # Errors
///
/// The exposition could not be made (logged once an encoding, by
/// [`Metrics::exposition`]).
pub(crate) async fn metrics_body(
    metrics: &Arc<Metrics>,
    method: &axum::http::Method,
    headers: &axum::http::HeaderMap,
) -> Result<Response, crate::metrics::ExpositionError> {
    if method == axum::http::Method::HEAD {
        return Ok(crate::util::gzip::head(
            crate::metrics::CONTENT_TYPE,
            headers,
        ));
    }
    let gz = metrics.exposition().await?;
    Ok(crate::util::gzip::answer(
        crate::metrics::CONTENT_TYPE,
        gz,
        headers,
    ))
}

/// Serves until `shutdown`, then lets requests in flight finish, with
/// [`Limits::LISTENER`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(), WebError> {
    serve_with(listener, router, Limits::LISTENER, shutdown).await
}

/// [`serve`] with other limits (tests use short timeouts).
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<(), WebError> {
    let addr = listener.local_addr().map_err(|source| WebError::Serve {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    let router = router.layer(axum::Extension(host::ListenAddr(addr)));
    let admission = Admission::new(admission::Limits {
        total: limits.max_connections,
        per_key: limits.per_source,
    });
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was
                // accepted: try again shortly.
                tracing::debug!(%addr, error = %e, "metrics listener: accept failed");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let slot = match admission.take(Source::of(peer.ip())) {
            Ok(slot) => slot,
            Err(Refused::KeyFull) => {
                tracing::debug!(%addr, %peer, max = limits.per_source,
                    "metrics listener: the client's share of connections is busy; connection closed");
                continue;
            }
            Err(Refused::Full) => {
                tracing::debug!(%addr, %peer, max = limits.max_connections,
                    "metrics listener full of busy connections: connection closed");
                continue;
            }
        };
        let slot = Arc::new(slot);
        let arrived = conn::arrived(&stream, &slot);
        connections.spawn(conn::serve(
            stream,
            router.clone(),
            limits,
            shutdown.clone(),
            slot,
            arrived,
        ));
    }
    // Once every connection has ended, the requests in flight are done.
    connections.close();
    connections.wait().await;
    Ok(())
}

#[cfg(test)]
mod tests;
