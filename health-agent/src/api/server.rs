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
pub(crate) mod tests {
    use std::{net::Ipv4Addr, time::Duration};

    use super::*;
    use crate::{
        api::client::Client,
        membership::NodeSet,
        probe::{
            ProbeConfig,
            error::{ProbeError, Proto},
            history::EntryOutcome,
            path::{Outcome, RttSource},
            status::ClusterStatus,
        },
    };

    /// A prober of nodes `a` and `b` with 4 rounds recorded (3 kept): `a`'s
    /// host ICMP path times out in rounds 2 and 4.
    fn prober() -> Arc<Prober> {
        let prober = Prober::new(ProbeConfig {
            history_length: 3,
            ..ProbeConfig::default()
        });
        let set = NodeSet::named(&["a", "b"]);
        prober.set_nodes(set.clone());
        let ok = |us| Outcome::Ok {
            rtt: Duration::from_micros(us),
            warning: None,
            source: RttSource::Kernel,
        };
        let timeout = Outcome::Failed(ProbeError::Timeout {
            proto: Proto::Icmp,
            after: Duration::from_secs(1),
        });
        for seq in 1..=4u64 {
            let a_icmp = if seq % 2 == 0 {
                timeout.clone()
            } else {
                ok(100 * seq)
            };
            let outcomes = vec![
                (a_icmp, ok(1)),
                (ok(1), ok(1)),
                (ok(1), ok(1)),
                (ok(1), ok(1)),
            ];
            // a's node and health address, then b's.
            let keys = [(0, 0), (0, 1), (1, 0), (1, 1)];
            prober.record(&set, &keys, outcomes, seq, seq * 1000, seq * 1000 + 1);
        }
        prober
    }

    /// Serves `prober` on a socket of its own (within a runtime) until the
    /// token is cancelled.
    fn serve_prober(prober: Arc<Prober>) -> (Client, SocketGuard, CancellationToken) {
        serve_probers(watch::channel(prober).1)
    }

    /// Serves the prober in service in `probers` on a socket of its own
    /// (within a runtime) until the token is cancelled.
    pub(crate) fn serve_probers(
        probers: watch::Receiver<Arc<Prober>>,
    ) -> (Client, SocketGuard, CancellationToken) {
        serve_with_nodes(probers, Nodes::new("none".into()))
    }

    /// [`serve_probers`], with `nodes` as the node set's source.
    fn serve_with_nodes(
        probers: watch::Receiver<Arc<Prober>>,
        nodes: Nodes,
    ) -> (Client, SocketGuard, CancellationToken) {
        serve_state(probers, nodes, |state| state)
    }

    /// [`serve_with_nodes`], the state as `with` makes it.
    fn serve_state(
        probers: watch::Receiver<Arc<Prober>>,
        nodes: Nodes,
        with: impl FnOnce(ApiState) -> ApiState,
    ) -> (Client, SocketGuard, CancellationToken) {
        let path = std::env::temp_dir().join(format!(
            "health-agent-api-{}-{}.sock",
            std::process::id(),
            fastrand::u64(..)
        ));
        let (guard, listener) = bind(&path, None).expect("bind");
        let state = with(ApiState::new(
            crate::endpoint::shared_view(),
            probers,
            nodes,
            Health::default(),
            Duration::from_secs(1),
        ));
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, state, stop.clone()));
        (Client::new(path), guard, stop)
    }

    #[tokio::test]
    async fn history_is_served_per_node_as_strips_and_as_figures() {
        let (client, _guard, stop) = serve_prober(prober());

        let a = client.history("a").await.expect("a's history");
        assert_eq!((a.node.as_str(), a.window, a.paths.len()), ("a", 3, 4));
        let icmp = &a.paths[0];
        assert_eq!(
            (icmp.path.as_str(), icmp.ip),
            ("host-icmp", Ipv4Addr::new(198, 18, 0, 1).into())
        );
        let seen: Vec<(u64, EntryOutcome, Option<u64>)> = icmp
            .entries
            .iter()
            .map(|e| (e.at_ms, e.outcome, e.rtt_ns))
            .collect();
        // 300 µs as the history keeps it: within 0.1 %.
        let kept = 300_032;
        assert_eq!(
            seen,
            [
                (2001, EntryOutcome::Failure, None),
                (3001, EntryOutcome::Success, Some(kept)),
                (4001, EntryOutcome::Failure, None)
            ]
        );
        assert_eq!(icmp.entries[0].error.as_deref(), Some("timeout"));
        assert!((icmp.loss_ratio.expect("results") - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!((icmp.rtt_p50_ns, icmp.rtt_p99_ns), (Some(kept), Some(kept)));
        assert_eq!(a.paths[3].path, "endpoint-http");
        assert_eq!(a.paths[3].ip, Ipv4Addr::new(198, 19, 0, 1));

        // The JSON is exactly the documented shape.
        let (code, body) = client
            .raw("GET", "/v1/status/history?node=a")
            .await
            .expect("raw");
        assert_eq!(code, StatusCode::OK);
        let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(&json), ["node", "paths", "window"]);
        assert_eq!(
            keys(&json["paths"][0]),
            [
                "entries",
                "family",
                "ip",
                "loss_ratio",
                "path",
                "rtt_p50_ns",
                "rtt_p99_ns"
            ]
        );
        assert_eq!(
            json["paths"][0]["entries"][0],
            serde_json::json!({"at_ms": 2001, "outcome": "failure", "rtt_ns": null, "error": "timeout"})
        );

        let strips = client.history_strips().await.expect("strips");
        assert_eq!(strips.window, 3);
        assert_eq!(
            strips.rounds.iter().map(|r| r.seq).collect::<Vec<_>>(),
            [2, 3, 4]
        );
        assert_eq!(strips.rounds[0].started_ms, 2000);
        let names: Vec<&str> = strips.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            strips.nodes[0].paths,
            ["FSF", "SSS", "SSS", "SSS"].map(String::from)
        );

        let stats = client.history_stats().await.expect("stats");
        assert_eq!(stats.nodes[1].name, "b");
        assert_eq!(stats.nodes[1].paths[0].loss_ratio, Some(0.0));
        assert_eq!(stats.nodes[0].paths[0].results, 3);

        let missing = client.history("nobody").await.expect_err("no such node");
        assert_eq!(missing.status(), Some(StatusCode::NOT_FOUND), "{missing}");
        assert!(missing.to_string().contains("\"nobody\""), "{missing}");
        for bad in ["?since=1", "?node=a&stats=true", "?stats=maybe"] {
            let (code, body) = client
                .raw("GET", &format!("/v1/status/history{bad}"))
                .await
                .expect("raw");
            assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}");
            let err: ApiError = serde_json::from_slice(&body).expect("an API error");
            assert_eq!(err.code, 400);
        }
        stop.cancel();
    }

    #[tokio::test]
    async fn bad_queries_are_refused_naming_what_is_wrong() {
        let (client, _guard, stop) = serve_prober(prober());
        let gets = [
            (
                "/v1/status?node=a&node=b",
                "node given twice: \"a\" and \"b\"",
            ),
            (
                "/v1/status?state=failure&state=success",
                "state given twice",
            ),
            ("/v1/status?node=", "node= is empty"),
            ("/v1/status?node", "\"node\" has no value"),
            ("/v1/status?node=a%2", "node=\"a%2\": a % not followed"),
            (
                "/v1/status?summary=maybe",
                "summary \"maybe\": expected true or false",
            ),
            (
                "/v1/status?summary=true&node=a",
                "does not go with node= or state=",
            ),
            (
                "/v1/status?summary=true&state=failure",
                "does not go with node= or state=",
            ),
            ("/v1/status/history?node=", "node= is empty"),
            (
                "/v1/status/history?stats=true&stats=false",
                "stats given twice",
            ),
            ("/v1/status/quality?node=a&node=a", "node given twice"),
            ("/v1/endpoints/%FF", "endpoint ID: "),
            ("/v1/endpoints/+1", "\"+1\" is not a number"),
            ("/v1/endpoints/01", "\"01\" is not a number"),
            (
                "/v1/nodes?state=failure",
                "/v1/nodes takes no query parameters (given \"state=failure\")",
            ),
            ("/v1/healthz?x=1", "takes no query parameters"),
            ("/v1/cluster?node=a", "takes no query parameters"),
        ]
        .map(|(request, says)| ("GET", request, says));
        let puts = [
            (
                "/v1/status/probe?timeout=1s&timeout=2s",
                "timeout given twice",
            ),
            (
                "/v1/status/probe?timeout=121s",
                "timeout 121s is over the 120s limit",
            ),
            ("/v1/status/probe?timeout=soon", "timeout: "),
        ]
        .map(|(request, says)| ("PUT", request, says));
        for (method, request, says) in gets.into_iter().chain(puts) {
            let (code, body) = client.raw(method, request).await.expect("raw");
            assert_eq!(code, StatusCode::BAD_REQUEST, "{method} {request}");
            let err: ApiError = serde_json::from_slice(&body).expect("an API error");
            assert!(err.message.contains(says), "{request}: {}", err.message);
        }
        // An escaped name is the name.
        let (code, body) = client.raw("GET", "/v1/status?node=%61").await.expect("raw");
        assert_eq!(code, StatusCode::OK);
        let one: ClusterStatus = serde_json::from_slice(&body).expect("a status");
        assert_eq!(one.nodes.len(), 1);
        assert_eq!(one.nodes[0].name, "a");

        // A known path asked with another method: a JSON error naming both.
        let (code, body) = client.raw("POST", "/v1/healthz").await.expect("raw");
        assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
        let err: ApiError = serde_json::from_slice(&body).expect("an API error");
        assert_eq!(err.code, 405);
        assert!(
            err.message.contains("POST") && err.message.contains("/v1/healthz"),
            "{}",
            err.message
        );
        stop.cancel();
    }

    /// A status filtered by state is made and sent a chunk of nodes at a
    /// time, and is the whole status's nodes of that state, byte for byte.
    #[tokio::test]
    async fn a_status_filtered_by_state_is_sent_a_chunk_at_a_time() {
        let many = Prober::new(ProbeConfig::default());
        // Three chunks' worth: of the first 500, every third node fails;
        // the last 100 are not probed yet (unknown).
        let set = NodeSet::numbered(600);
        many.set_nodes(set.clone());
        let ok = Outcome::Ok {
            rtt: Duration::from_micros(50),
            warning: None,
            source: RttSource::Kernel,
        };
        let timeout = Outcome::Failed(ProbeError::Timeout {
            proto: Proto::Icmp,
            after: Duration::from_secs(1),
        });
        let keys: Vec<(u32, u8)> = (0..500).flat_map(|i| [(i, 0), (i, 1)]).collect();
        // Failing past the failure threshold's rounds.
        for seq in 1..=5 {
            let outcomes = keys.iter().map(|&(i, _)| {
                let o = if i % 3 == 0 { &timeout } else { &ok };
                (o.clone(), o.clone())
            });
            many.record(&set, &keys, outcomes, seq, seq * 1000, seq * 1000 + 1);
        }
        many.publish(None, true);
        let whole = many.status();
        let (_, guard, stop) = serve_prober(many.clone());
        for (state, result, count) in [
            ("success", ProbeResult::Success, 333),
            ("failure", ProbeResult::Failure, 167),
            ("unknown", ProbeResult::Unknown, 100),
        ] {
            let mut expected = ClusterStatus::clone(&whole);
            expected.nodes.retain(|n| n.state() == result);
            assert_eq!(expected.nodes.len(), count, "{state}");
            let one = many.clone();
            let pieces: Vec<Bytes> =
                Prober::status_where_pieces(move || one.clone(), move |n| n.state() == result)
                    .expect("a node list")
                    .collect();
            assert!(pieces.len() >= 3, "{state}: {} pieces", pieces.len());
            let (status, headers, body) =
                plain(&guard.path, &format!("/v1/status?state={state}")).await;
            assert_eq!(status, StatusCode::OK, "{state}");
            assert_chunked(&headers);
            assert_eq!(
                body,
                serde_json::to_vec(&expected).expect("json"),
                "{state}"
            );
            assert_eq!(pieces.concat(), body.to_vec(), "{state}");
        }
        stop.cancel();

        // No node of the state asked for: an empty list, as JSON.
        let small = prober();
        let mut expected = ClusterStatus::clone(&small.status());
        expected.nodes.clear();
        let (_, guard, stop) = serve_prober(small);
        let (status, _, body) = plain(&guard.path, "/v1/status?state=unknown").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, serde_json::to_vec(&expected).expect("json"));
        stop.cancel();
    }

    /// The node set is sent a chunk of nodes at a time, the same bytes as
    /// the whole view's JSON, with what was rejected and refused.
    #[tokio::test]
    async fn the_node_set_is_sent_a_chunk_at_a_time() {
        let nodes = Nodes::new(r#"file:/etc/health/"nodes":[].json"#.into());
        nodes.accept(crate::membership::record::Validated {
            nodes: NodeSet::numbered(600),
            ..Default::default()
        });
        nodes.set_refused_routes(vec![crate::membership::routes::RefusedRoute {
            node: "node-0007".into(),
            address: Ipv4Addr::new(198, 19, 0, 7).into(),
            reason: r#"in a connected network "nodes":[]"#.into(),
        }]);
        nodes.reject("an update of 70,000 nodes".into());
        let whole = NodesView::new(nodes.current(), nodes.status());
        let (client, guard, stop) = serve_with_nodes(watch::channel(prober()).1, nodes);
        let (status, headers, body) = plain(&guard.path, "/v1/nodes").await;
        assert_eq!(status, StatusCode::OK);
        assert_chunked(&headers);
        assert_eq!(body, serde_json::to_vec(&whole).expect("json"));
        let read = client.nodes().await.expect("the node set");
        assert_eq!(read.nodes.len(), 600);
        assert_eq!(read.refused_routes_total, 1);
        assert_eq!(read.error.as_deref(), Some("an update of 70,000 nodes"));
        stop.cancel();
    }

    /// The answer was sent in chunks, as its pieces were made.
    fn assert_chunked(headers: &axum::http::HeaderMap) {
        assert_eq!(
            headers
                .get("transfer-encoding")
                .map(axum::http::HeaderValue::as_bytes),
            Some(&b"chunked"[..]),
            "{headers:?}"
        );
    }

    /// One request as written, without `Accept-Encoding`: the answer's
    /// status, headers and body (hyper's client undoes the chunks).
    async fn plain(
        client_path: &std::path::Path,
        path: &str,
    ) -> (StatusCode, axum::http::HeaderMap, Bytes) {
        use http_body_util::BodyExt as _;
        let stream = tokio::net::UnixStream::connect(client_path)
            .await
            .expect("connect");
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("handshake");
        let conn = tokio::spawn(conn);
        let req = axum::http::Request::get(path)
            .header("host", "health-agent")
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request");
        let resp = sender.send_request(req).await.expect("answer");
        let (status, headers) = (resp.status(), resp.headers().clone());
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        conn.abort();
        (status, headers, body)
    }

    /// The metrics on the socket: a `GET` has the exposition, a `HEAD`
    /// its head without a body or a length.
    #[tokio::test]
    async fn the_socket_serves_the_metrics_and_their_head() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (_, probers) = watch::channel(prober());
        let metrics = Arc::new(crate::metrics::Metrics::of_probers(probers.clone(), false));
        let (_, guard, stop) = serve_state(probers, Nodes::new("none".into()), |state| {
            state.with_metrics(metrics)
        });
        let path = guard.path.clone();
        let (status, _, body) = plain(&path, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        let text = String::from_utf8(body.to_vec()).expect("UTF-8");
        assert!(text.contains("health_node_connectivity_status{"), "{text}");
        assert!(text.ends_with("# EOF\n"));
        // Gzipped, a GET has a length: a HEAD, made without the text, none.
        for accept in ["", "Accept-Encoding: gzip\r\n"] {
            let mut raw = tokio::net::UnixStream::connect(&path)
                .await
                .expect("connect");
            let head =
                format!("HEAD /metrics HTTP/1.1\r\nHost: a\r\n{accept}Connection: close\r\n\r\n");
            raw.write_all(head.as_bytes()).await.expect("written");
            let mut answer = Vec::new();
            tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut answer))
                .await
                .expect("answered")
                .expect("read");
            let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
            assert!(answer.starts_with("http/1.1 200"), "{answer}");
            assert!(answer.contains("content-type: application/openmetrics-text"));
            assert_eq!(
                answer.contains("content-encoding: gzip"),
                !accept.is_empty()
            );
            assert!(!answer.contains("content-length"), "{answer}");
            assert!(answer.ends_with("\r\n\r\n"), "no body: {answer}");
        }
        stop.cancel();
    }

    /// A client that does not take gzip gets the status's JSON decompressed
    /// as it is sent, in pieces (chunked), not made whole first; a head
    /// past 64 KiB is refused before it is held.
    #[tokio::test]
    async fn the_plain_status_is_streamed_and_an_oversized_head_refused() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let prober = prober();
        let json = prober.status_json();
        let pieces: Vec<Bytes> = crate::util::gzip::pieces(prober.status_json_gzip(), 100)
            .collect::<Result<_, _>>()
            .expect("pieces");
        assert!(pieces.len() > 2 && pieces.iter().all(|p| p.len() <= 100));
        assert_eq!(pieces.concat(), json.to_vec());
        let (client, guard, stop) = serve_prober(prober);
        let (status, headers, body) = plain(&guard.path, "/v1/status").await;
        assert_eq!(status, StatusCode::OK);
        assert!(headers.get("content-encoding").is_none());
        assert_chunked(&headers);
        assert_eq!(body, json);
        serde_json::from_slice::<ClusterStatus>(&body).expect("a status");

        let mut raw = tokio::net::UnixStream::connect(&guard.path)
            .await
            .expect("connect");
        // Past 64 KiB by more than one read: hyper checks between reads.
        let big = "x".repeat(200 << 10);
        raw.write_all(
            format!("GET /v1/healthz HTTP/1.1\r\nHost: a\r\nX-Big: {big}\r\n\r\n").as_bytes(),
        )
        .await
        .ok();
        let mut answer = Vec::new();
        let _ = raw.read_to_end(&mut answer).await;
        assert!(
            answer.starts_with(b"HTTP/1.1 431"),
            "{:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(80)])
        );
        // The server serves on.
        client.healthz().await.expect("healthz");
        stop.cancel();
    }

    /// Every node's history is made once a published round and node set,
    /// and shared: a round recorded and not yet published changes no
    /// answer (it is the one kept); once published, with another node set,
    /// or once a reload's prober is in service, the answer is made again.
    #[tokio::test]
    async fn whole_history_answers_are_made_once_a_round_and_shared() {
        let prober = prober();
        let (probers, in_service) = watch::channel(prober.clone());
        let state = ApiState::new(
            crate::endpoint::shared_view(),
            in_service,
            Nodes::new("none".into()),
            Health::default(),
            Duration::from_secs(1),
        );
        let ask = |stats: bool| {
            let uri = if stats {
                "/v1/status/history?stats=true"
            } else {
                "/v1/status/history"
            };
            let state = state.clone();
            async move {
                let r = history(State(state), uri.parse().expect("uri")).await;
                assert_eq!(r.status(), StatusCode::OK);
                axum::body::to_bytes(r.into_body(), usize::MAX)
                    .await
                    .expect("body")
            }
        };
        let (strips, figures) = (ask(false).await, ask(true).await);
        assert_ne!(strips, figures);
        let set = NodeSet::named(&["a", "b"]);
        let keys = [(0, 0), (0, 1), (1, 0), (1, 1)];
        let timeout = || {
            Outcome::Failed(ProbeError::Timeout {
                proto: Proto::Icmp,
                after: Duration::from_secs(1),
            })
        };
        let failed = (0..4).map(|_| (timeout(), timeout()));
        prober.record(&set, &keys, failed, 5, 5000, 5001);
        assert_eq!(ask(false).await, strips, "the kept answer");
        assert_eq!(ask(true).await, figures, "the kept answer");
        prober.publish(
            Some(crate::probe::status::RoundInfo {
                seq: 5,
                started_ms: 5000,
                duration_ms: 1,
                probes: 8,
            }),
            false,
        );
        let (new_strips, new_figures) = (ask(false).await, ask(true).await);
        assert_ne!(new_strips, strips, "round 5 published");
        assert_ne!(new_figures, figures, "round 5 published");
        prober.set_nodes(NodeSet::named(&["a", "b", "c"]));
        let more = ask(false).await;
        assert!(
            String::from_utf8_lossy(&more).contains("\"c\""),
            "the new node set: {more:?}"
        );
        // A reload's prober, with no round yet, while a request waits for
        // its turn: its answer is the prober's in service once the turn
        // comes.
        let turn = state.walks.clone().try_acquire_owned().expect("the turn");
        let waiting = tokio::spawn(ask(false));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let reloaded = Prober::new(ProbeConfig::default());
        reloaded.set_nodes(NodeSet::named(&["a", "b", "c"]));
        probers.send(reloaded).expect("in service");
        drop(turn);
        let fresh = waiting.await.expect("answered");
        assert!(
            String::from_utf8_lossy(&fresh).contains("\"rounds\":[]"),
            "the reloaded prober's: {fresh:?}"
        );
    }

    /// Walks of every node's history go one at a time, waited for before
    /// any work: a request waiting for its turn holds no thread, and one
    /// dropped while it waits costs nothing. One node's does not wait.
    #[tokio::test]
    async fn history_walks_take_turns() {
        let state = ApiState::new(
            crate::endpoint::shared_view(),
            watch::channel(prober()).1,
            Nodes::new("none".into()),
            Health::default(),
            Duration::from_secs(1),
        );
        let turn = state.walks.clone().try_acquire_owned().expect("the turn");
        let uri: axum::http::Uri = "/v1/status/history".parse().expect("uri");
        let waiting = history(State(state.clone()), uri.clone());
        assert!(
            tokio::time::timeout(Duration::from_millis(200), waiting)
                .await
                .is_err(),
            "a walk while another has the turn waits"
        );
        assert_eq!(state.walks.available_permits(), 0);
        // One node's history waits for no walk.
        let one = tokio::time::timeout(
            Duration::from_secs(5),
            history(
                State(state.clone()),
                "/v1/status/history?node=a".parse().expect("uri"),
            ),
        )
        .await
        .expect("at once");
        assert_eq!(one.status(), StatusCode::OK);
        drop(turn);
        let answer =
            tokio::time::timeout(Duration::from_secs(5), history(State(state.clone()), uri))
                .await
                .expect("its turn");
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(state.walks.available_permits(), 1, "given back");
    }
}
