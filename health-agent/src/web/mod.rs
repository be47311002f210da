//! The metrics listener (`--prometheus-serve-addr`): read-only, on TCP.
//! It serves `GET /metrics` for Prometheus, the connectivity page at `/`,
//! and under `/api` the read-only views the page draws from (the status and
//! its history, as on the unix socket).

use std::{io, net::SocketAddr, sync::Arc};

use axum::{
    Router,
    extract::State,
    http::header::CONTENT_TYPE,
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{api::server::ApiState, metrics::Metrics};

#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("binding the metrics listener on {addr}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("serving the metrics listener on {addr}")]
    Serve { addr: SocketAddr, source: io::Error },
}

/// Everything the listener serves.
pub fn router(metrics: Arc<Metrics>, api: ApiState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .with_state(metrics)
        .nest("/api", crate::api::server::read_only_routes(api))
        .merge(crate::page::routes())
}

async fn metrics_text(State(metrics): State<Arc<Metrics>>) -> Response {
    (
        [(CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        metrics.encode(),
    )
        .into_response()
}

/// Serves until `shutdown`, then lets requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(), WebError> {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    // Made once, not for every connection (see `api::server::serve`).
    axum::serve(listener, router.into_make_service())
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(|source| WebError::Serve { addr, source })
}
