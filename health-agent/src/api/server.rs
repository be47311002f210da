//! The API server. It starts before the endpoint is created and answers
//! from the published view, never waiting for the endpoint's work.

use std::{
    io,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::{OriginalUri, Path as UrlPath, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, put},
};
use bytes::Bytes;
use tokio::{net::UnixListener, sync::watch};

use tokio_util::sync::CancellationToken;

use super::{
    demand::Demand,
    history_cache::{HistoryCache, Made, Whole},
    query::Query,
    round_wait::RoundWait,
    types::{ApiError, Healthz, NodesView, PROBE_DEADLINE_MAX, paths},
};
use crate::{
    cluster::view_cell::ClusterViewCell,
    datapath::KernelReport,
    endpoint::{EndpointView, SharedView, lifecycle},
    membership::{NodeSet, published::Nodes},
    probe::{
        Prober,
        path::ProbeResult,
        status::{NodeStatus, StatusSummary},
    },
    supervisor::{Health, TaskState},
    util::json_list,
};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("socket group {group:?}: {reason}")]
    Group { group: String, reason: String },
}

/// What the handlers read: published views only, never locks held by work.
#[derive(Clone)]
pub struct ApiState {
    endpoint: SharedView,
    /// The prober in service (replaced when a reload changes its settings).
    prober: watch::Receiver<Arc<Prober>>,
    nodes: Nodes,
    tasks: Health,
    degraded_for: Duration,
    started: Instant,
    /// The kernel and the hooks chosen on it (`/v1/healthz`).
    kernel: Option<KernelReport>,
    /// What `GET /metrics` encodes.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The cluster view (`GET /v1/cluster`), when there is one.
    cluster: Option<ClusterViewCell>,
    /// Where requests may wait for the next round (the socket's server,
    /// not the network listener's): the token that ends their waits when
    /// the server stops.
    waits: Option<CancellationToken>,
    /// The rounds asked for with `PUT /v1/status/probe`.
    demand: Demand,
    /// Whole-history walks, one at a time: each holds the paths' recording
    /// for its length, which the round's recording waits for.
    walks: Arc<tokio::sync::Semaphore>,
    /// Their answers, made once a round and shared.
    whole_history: Arc<HistoryCache>,
}

impl ApiState {
    /// `degraded_for`: how long a task that failed shows as degraded.
    #[must_use]
    pub fn new(
        endpoint: SharedView,
        prober: watch::Receiver<Arc<Prober>>,
        nodes: Nodes,
        tasks: Health,
        degraded_for: Duration,
    ) -> Self {
        Self {
            endpoint,
            prober,
            nodes,
            tasks,
            degraded_for,
            started: Instant::now(),
            kernel: None,
            metrics: None,
            cluster: None,
            waits: None,
            demand: Demand::default(),
            walks: Arc::new(tokio::sync::Semaphore::new(1)),
            whole_history: Arc::default(),
        }
    }

    /// Shows `kernel` (with the programs attached at each request) in
    /// `/v1/healthz`.
    #[must_use]
    pub fn with_kernel(mut self, kernel: KernelReport) -> Self {
        self.kernel = Some(kernel);
        self
    }

    /// Serves the view of `cell` at `GET /v1/cluster`.
    #[must_use]
    pub fn with_cluster(mut self, cell: ClusterViewCell) -> Self {
        self.cluster = Some(cell);
        self
    }

    /// Serves `metrics` at `GET /metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

impl ApiState {
    /// Lets requests wait for the next round until `stop` is cancelled.
    fn with_waits(mut self, stop: CancellationToken) -> Self {
        self.waits = Some(stop);
        self
    }

    fn prober(&self) -> Arc<Prober> {
        self.prober.borrow().clone()
    }
}

type AppState = ApiState;

pub use super::socket::{SocketGuard, bind};

/// Serves the API on `listener` until `shutdown`, then lets requests in
/// flight finish; every request on the calling task's runtime.
pub async fn serve(
    listener: UnixListener,
    state: ApiState,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    let state = state.with_waits(shutdown.clone());
    super::front::serve(listener, router(state), shutdown, None).await;
    Ok(())
}

/// [`serve`], the small questions answered on the calling task's runtime
/// and the rest on `bulk`'s (`super::front`).
pub async fn serve_in_lanes(
    listener: UnixListener,
    state: ApiState,
    shutdown: CancellationToken,
    bulk: tokio::runtime::Handle,
) -> Result<(), ServerError> {
    let state = state.with_waits(shutdown.clone());
    super::front::serve(listener, router(state), shutdown, Some(bulk)).await;
    Ok(())
}

fn router(state: AppState) -> Router {
    Router::new()
        .route(paths::HEALTHZ, get(healthz))
        .route(paths::ENDPOINTS, get(endpoints))
        .route(paths::ENDPOINT, get(endpoint))
        .route(paths::NODES, get(nodes))
        .route(paths::METRICS, get(metrics))
        .route(paths::CLUSTER, get(cluster))
        .route(paths::CLUSTER_MATRIX, get(cluster_matrix))
        .route_layer(axum::middleware::from_fn(refuse_query))
        .route(paths::STATUS, get(status))
        .route(paths::STATUS_PROBE, put(probe))
        .route(paths::STATUS_HISTORY, get(history))
        .route(paths::STATUS_QUALITY, get(quality))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// The read-only views the metrics listener also serves (under `/api`, for
/// the connectivity page): the status, its history and the cluster view.
pub fn read_only_routes(state: AppState) -> Router {
    Router::new()
        .route(paths::CLUSTER, get(cluster))
        .route(paths::CLUSTER_MATRIX, get(cluster_matrix))
        .route_layer(axum::middleware::from_fn(refuse_query))
        .route(paths::STATUS, get(status))
        .route(paths::STATUS_HISTORY, get(history))
        .route(paths::STATUS_QUALITY, get(quality))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// The views that take no parameter refuse a query rather than ignore it:
/// `nodes?state=failure` would otherwise answer every node as if filtered.
async fn refuse_query(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if let Some(query) = request.uri().query().filter(|q| !q.is_empty()) {
        // The path as asked (under `/api` on the metrics listener).
        let path = request
            .extensions()
            .get::<OriginalUri>()
            .map_or_else(|| request.uri().path(), |u| u.path());
        return error(
            StatusCode::BAD_REQUEST,
            format!("{path} takes no query parameters (given {query:?})"),
        );
    }
    next.run(request).await
}

fn error(code: StatusCode, message: impl Into<String>) -> Response {
    (
        code,
        Json(ApiError {
            code: code.as_u16(),
            message: message.into(),
        }),
    )
        .into_response()
}

/// The path as the client asked for it (under `/api` on the metrics
/// listener, which nests these routes there).
async fn not_found(OriginalUri(uri): OriginalUri) -> Response {
    error(StatusCode::NOT_FOUND, format!("no such API path: {uri}"))
}

async fn method_not_allowed(method: axum::http::Method, OriginalUri(uri): OriginalUri) -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not served at {}", uri.path()),
    )
}

/// The cluster view, as its elected assembler published it: the counts,
/// the nodes not healthy, who assembled it and whether it is stale.
async fn cluster(State(state): State<AppState>) -> Response {
    cluster_json(&state, ClusterViewCell::json)
}

/// The cluster view as an observers-by-targets matrix: served by the agent
/// that assembled the view (the others read the view alone).
async fn cluster_matrix(State(state): State<AppState>) -> Response {
    use crate::cluster::view_cell::MatrixAnswer;
    use axum::http::header::CONTENT_TYPE;
    match state.cluster.as_ref().map(ClusterViewCell::matrix) {
        Some(MatrixAnswer::Json(json)) => {
            ([(CONTENT_TYPE, "application/json")], json).into_response()
        }
        Some(MatrixAnswer::Elsewhere { by }) => error(
            StatusCode::NOT_FOUND,
            format!("no matrix here: the agent that assembles the cluster view serves it ({by:?})"),
        ),
        Some(MatrixAnswer::Stale { by, age_ms }) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the cluster view this agent ({by:?}) assembled is stale ({}s old, older than two of its \
                 rounds): no current matrix (GET /v1/cluster says who assembles the view now)",
                age_ms / 1_000
            ),
        ),
        Some(MatrixAnswer::NotPublished) | None => cluster_json(&state, |_| None),
    }
}

fn cluster_json(state: &AppState, part: fn(&ClusterViewCell) -> Option<Bytes>) -> Response {
    use axum::http::header::CONTENT_TYPE;
    match state.cluster.as_ref().map(part) {
        Some(Some(json)) => ([(CONTENT_TYPE, "application/json")], json).into_response(),
        Some(None) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the cluster view is not published yet (after the first probe interval of an elected assembler)",
        ),
        None => error(
            StatusCode::NOT_FOUND,
            "no cluster view: it is assembled from the agents' summaries in etcd (--kvstore etcd)",
        ),
    }
}

/// The Prometheus metrics, as on the metrics listener.
async fn metrics(
    State(state): State<AppState>,
    method: axum::http::Method,
    headers: axum::http::HeaderMap,
) -> Response {
    match &state.metrics {
        Some(m) => crate::web::metrics_body(m, &method, &headers)
            .await
            .unwrap_or_else(|e| {
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    crate::util::errors::chain(&e),
                )
            }),
        None => error(StatusCode::NOT_FOUND, "this agent keeps no metrics"),
    }
}

fn current(state: &AppState) -> Option<EndpointView> {
    state.endpoint.read().ok().and_then(|v| v.clone())
}

async fn healthz(State(state): State<AppState>) -> Json<Healthz> {
    let ep_state = current(&state).and_then(|v| v.state);
    let tasks = state.tasks.tasks(state.degraded_for);
    let degraded: Vec<&str> = tasks
        .iter()
        .filter(|t| t.degraded && t.state != TaskState::Starting)
        .map(|t| t.name.as_str())
        .collect();
    let label = if degraded.is_empty() {
        match ep_state {
            Some(lifecycle::State::Ready) => "ok".to_owned(),
            Some(s) => format!("endpoint {s}"),
            None => "starting".to_owned(),
        }
    } else {
        format!("degraded: {}", degraded.join(", "))
    };
    Json(Healthz {
        state: label,
        uptime_seconds: state.started.elapsed().as_secs(),
        pid: std::process::id(),
        tasks,
        kernel: state.kernel.clone().map(|mut k| {
            k.programs = crate::datapath::attached_programs();
            k
        }),
    })
}

async fn endpoints(State(state): State<AppState>) -> Json<Vec<EndpointView>> {
    Json(current(&state).into_iter().collect())
}

async fn endpoint(
    State(state): State<AppState>,
    id: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let id = match id {
        Ok(UrlPath(id)) => id,
        // Not UTF-8 once decoded, say.
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("endpoint ID: {}", e.body_text()),
            );
        }
    };
    // Digits only, one spelling an ID: `u16`'s parser takes a sign and
    // leading zeros too.
    let digits = !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_digit())
        && (id == "0" || !id.starts_with('0'));
    let Some(id) = id.parse::<u16>().ok().filter(|_| digits) else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("endpoint ID {id:?} is not a number from 0 to 65535"),
        );
    };
    match current(&state) {
        Some(v) if v.id == id => Json(v).into_response(),
        _ => error(StatusCode::NOT_FOUND, format!("endpoint {id} not found")),
    }
}

/// The last published round: as serialised once when it was published,
/// or filtered (`?state=success|failure|unknown`, `?node=NAME`) or
/// summarised (`?summary=true`: counts only).
async fn status(
    State(state): State<AppState>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> Response {
    let Some(query) = uri.query().filter(|q| !q.is_empty()) else {
        return whole_status(&state, &headers);
    };
    let query = match Query::parse(
        Some(query),
        &["state", "node", "summary", "after", "wait"],
        "state=success|failure|unknown, node=NAME, summary=true, after=SEQ, wait=DURATION",
    ) {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let want_state = match query.get("state") {
        None => None,
        Some("success") => Some(ProbeResult::Success),
        Some("failure") => Some(ProbeResult::Failure),
        Some("unknown") => Some(ProbeResult::Unknown),
        Some(v) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("state {v:?}: expected success, failure or unknown"),
            );
        }
    };
    let want_node = query.get("node");
    let summary = match query.flag("summary") {
        Ok(on) => on,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    if summary && (want_node.is_some() || want_state.is_some()) {
        return error(
            StatusCode::BAD_REQUEST,
            "summary=true counts every node: it does not go with node= or state=",
        );
    }
    let (after, wait) = (query.get("after"), query.get("wait"));
    let round_wait = match RoundWait::parse(after, wait) {
        Ok(w) => w,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    if let Some(round_wait) = round_wait {
        if !summary {
            return error(
                StatusCode::BAD_REQUEST,
                "after= goes with summary=true: a client waits for the next round's counts, then asks for what it needs",
            );
        }
        let Some(stop) = &state.waits else {
            return error(
                StatusCode::BAD_REQUEST,
                "after= (waiting for the next round) is answered on the agent's socket only",
            );
        };
        round_wait.until_done(&state.prober, stop).await;
    }
    if summary {
        return Json(StatusSummary::clone(&state.prober().status_summary())).into_response();
    }
    let prober = state.prober();
    let wanted = |n: &NodeStatus| want_state.is_none_or(|s| n.state() == s);
    let filtered = match (want_node, want_state) {
        // One node's status, made alone (not the whole status's).
        (Some(name), _) => match prober.node_status(name) {
            Some(n) => prober.status_head().with_node(wanted(&n).then_some(n)),
            None => return error(StatusCode::NOT_FOUND, format!("node {name:?} not found")),
        },
        // Made and sent a chunk of nodes at a time, keeping only those
        // wanted.
        (None, Some(s)) => {
            let probers = state.prober.clone();
            let pieces = Prober::status_where_pieces(
                move || probers.borrow().clone(),
                move |n: &NodeStatus| n.state() == s,
            );
            return match pieces {
                Some(pieces) => json_pieces(pieces),
                None => error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the status has no node list",
                ),
            };
        }
        // Nothing to filter (`summary=false`, say): as published.
        (None, None) => return whole_status(&state, &headers),
    };
    Json(filtered).into_response()
}

/// The whole status as serialised when it was published, gzipped for a
/// client that takes it.
fn whole_status(state: &AppState, headers: &axum::http::HeaderMap) -> Response {
    whole_status_of(&state.prober(), headers)
}

/// [`whole_status`], of `prober`: its JSON gzipped when it was published,
/// decompressed as it is sent for a client that does not take gzip (it
/// then holds a piece, not the whole JSON: 9 MB at 10,000 nodes).
fn whole_status_of(prober: &Prober, headers: &axum::http::HeaderMap) -> Response {
    crate::util::gzip::answer("application/json", prober.status_json_gzip(), headers)
}

/// The paths' recent results: a node's (`?node=NAME`), every node's loss
/// ratio and RTT percentiles (`?stats=true`), or every node's results as
/// strips (no parameter). Made and serialised off the runtime's threads,
/// those of every node one at a time: a 5,000-node answer walks 20,000
/// paths.
async fn history(State(state): State<AppState>, uri: axum::http::Uri) -> Response {
    use axum::http::header::CONTENT_TYPE;
    let query = match Query::parse(uri.query(), &["node", "stats"], "node=NAME or stats=true") {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let node = query.get("node").map(str::to_owned);
    let want_stats = match query.flag("stats") {
        Ok(on) => on,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    if want_stats && node.is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            "node=NAME and stats=true do not go together (stats=true covers every node)",
        );
    }
    let made = if let Some(name) = node {
        let prober = state.prober();
        tokio::task::spawn_blocking(move || {
            prober
                .node_history(&name)
                .map(|h| serde_json::to_vec(&h).map(Bytes::from))
                .ok_or(name)
        })
        .await
    } else {
        let which = if want_stats {
            Whole::Stats
        } else {
            Whole::Strips
        };
        whole_history(&state, which).await.map(Ok)
    };
    match made {
        Ok(Ok(Ok(json))) => ([(CONTENT_TYPE, "application/json")], json).into_response(),
        Ok(Err(name)) => error(StatusCode::NOT_FOUND, format!("node {name:?} not found")),
        Ok(Ok(Err(e))) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("serialising the history: {e}"),
        ),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("making the history: {e}"),
        ),
    }
}

/// Every node's history (`which`): the answer made for this round and node
/// set, or made now. Walks of every node one at a time, waited for here:
/// a request whose client goes while it waits costs nothing, the round's
/// recording waits for one walk at most, and the requests that waited
/// behind a walk take its answer.
async fn whole_history(
    state: &ApiState,
    which: Whole,
) -> Result<serde_json::Result<Bytes>, tokio::task::JoinError> {
    let turn = state.walks.clone().acquire_owned().await.ok();
    // The prober in service once the turn came: a reload while the
    // request waited retired the one in service when it came.
    let prober = state.prober();
    let made = Made::now(&prober);
    if let Some(bytes) = state.whole_history.get(which, &made) {
        return Ok(Ok(bytes));
    }
    let cache = Arc::clone(&state.whole_history);
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let json = match which {
            Whole::Strips => serde_json::to_vec(&prober.history_strips()),
            Whole::Stats => serde_json::to_vec(&prober.history_stats()),
        }?;
        let bytes = Bytes::from(json);
        cache.put(which, made, bytes.clone());
        Ok(bytes)
    })
    .await
}

/// A node's paths over the sliding windows (`?node=NAME`, required).
async fn quality(State(state): State<AppState>, uri: axum::http::Uri) -> Response {
    let query = match Query::parse(uri.query(), &["node"], "node=NAME") {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let node = query.get("node");
    let Some(name) = node else {
        return error(StatusCode::BAD_REQUEST, "node=NAME is required");
    };
    match state.prober().node_quality(name) {
        Some(q) => Json(q).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("node {name:?} not found")),
    }
}

/// A fresh round, synchronously, within `?timeout=` (default 30s): the
/// status as published when it ended (gzipped for a client that takes
/// it), made once for every request it answers.
async fn probe(
    State(state): State<AppState>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> Response {
    let query = match Query::parse(uri.query(), &["timeout"], "only timeout=DURATION") {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let deadline = match query.get("timeout") {
        None => Duration::from_secs(30),
        Some(v) => match crate::util::duration::parse(v) {
            Ok(d) if d <= PROBE_DEADLINE_MAX => d,
            Ok(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("timeout {v} is over the {PROBE_DEADLINE_MAX:?} limit"),
                );
            }
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("timeout: {e}")),
        },
    };
    // The round runs to its end whatever becomes of this request (its
    // deadline passing, its client gone); requests waiting together share
    // one (see `demand`).
    // Answered from the prober that ran the round, a reload meanwhile
    // notwithstanding.
    let prober = state.prober();
    let round = state.demand.round(prober.clone());
    match tokio::time::timeout(deadline, round).await {
        Ok(Ok(_)) => whole_status_of(&prober, &headers),
        Ok(Err(e)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the probe round failed: {e}"),
        ),
        Err(_) => error(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "the probe round did not finish within {}",
                humanize(deadline)
            ),
        ),
    }
}

fn humanize(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The node set and how it was read: the nodes' JSON made and sent a
/// chunk at a time (at 10,000 nodes about 2 MB of it).
async fn nodes(State(state): State<AppState>) -> Response {
    let view = NodesView::new(NodeSet::default(), state.nodes.status());
    let nodes = state.nodes.current();
    let chunks =
        json_list::ranges(nodes.len(), NODES_CHUNK).map(move |r| json_list::chunk(&nodes[r]));
    // The view serialises: it holds strings, numbers and addresses.
    let empty = serde_json::to_vec(&view).unwrap_or_default();
    match json_list::pieces(empty, "nodes", chunks) {
        Some(pieces) => json_pieces(pieces),
        None => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the node list has no place",
        ),
    }
}

/// Nodes serialised at a time for `GET /v1/nodes`.
const NODES_CHUNK: usize = 256;

/// A JSON answer sent as `pieces` are made.
fn json_pieces(pieces: impl Iterator<Item = Bytes> + Send + 'static) -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(futures::stream::iter(
            pieces.map(Ok::<_, std::convert::Infallible>),
        )),
    )
        .into_response()
}

#[cfg(test)]
pub(crate) mod tests;
