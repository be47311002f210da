//! The API server. It starts before the endpoint is created and answers
//! from the published view, never waiting for the endpoint's work.

use std::{
    io,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::{Path as UrlPath, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, put},
};
use tokio::{net::UnixListener, sync::watch};

use tokio_util::sync::CancellationToken;

use super::types::{ApiError, Healthz, NodesView, paths};
use crate::{
    cluster::discovery::Nodes,
    datapath::KernelReport,
    endpoint::{EndpointView, SharedView, lifecycle},
    probe::{Prober, path::ProbeResult, status::ClusterStatus},
    supervisor::{Health, TaskState},
};

/// Longest deadline a `PUT /v1/status/probe` may ask for.
const MAX_PROBE_DEADLINE: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("serving the API")]
    Serve(#[source] io::Error),
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
        }
    }

    /// Shows `kernel` (with the programs attached at each request) in
    /// `/v1/healthz`.
    #[must_use]
    pub fn with_kernel(mut self, kernel: KernelReport) -> Self {
        self.kernel = Some(kernel);
        self
    }
}

impl ApiState {
    fn prober(&self) -> Arc<Prober> {
        self.prober.borrow().clone()
    }
}

type AppState = ApiState;

/// Removes the socket file when dropped.
pub struct SocketGuard {
    path: PathBuf,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `path` (mode 0660, owned by `group` when given: a group name or
/// number, whose members may then use the API); the socket file goes when
/// the guard drops.
pub fn bind(path: &Path, group: Option<&str>) -> Result<(SocketGuard, UnixListener), ServerError> {
    let io = |op, source| ServerError::Io {
        op,
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", e))?;
    }
    let listener = UnixListener::bind(path).map_err(|e| io("binding", e))?;
    let guard = SocketGuard {
        path: path.to_owned(),
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| io("setting mode 0660 on", e))?;
    if let Some(group) = group {
        let gid = group_id(group)?;
        std::os::unix::fs::chown(path, None, Some(gid))
            .map_err(|e| io("changing the group of", e))?;
    }
    Ok((guard, listener))
}

/// The ID of `group`, a name or a number.
fn group_id(group: &str) -> Result<u32, ServerError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(ServerError::Group {
            group: group.to_owned(),
            reason: "no such group".into(),
        }),
        Err(e) => Err(ServerError::Group {
            group: group.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// Serves the API on `listener` until `shutdown`, then lets requests in
/// flight finish.
pub async fn serve(
    listener: UnixListener,
    state: ApiState,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(ServerError::Serve)
}

fn router(state: AppState) -> Router {
    Router::new()
        .route(paths::HEALTHZ, get(healthz))
        .route(paths::ENDPOINTS, get(endpoints))
        .route(paths::ENDPOINT, get(endpoint))
        .route(paths::STATUS, get(status))
        .route(paths::STATUS_PROBE, put(probe))
        .route(paths::NODES, get(nodes))
        .fallback(not_found)
        .with_state(state)
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

async fn not_found(uri: axum::http::Uri) -> Response {
    error(StatusCode::NOT_FOUND, format!("no such API path: {uri}"))
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

async fn endpoint(State(state): State<AppState>, UrlPath(id): UrlPath<String>) -> Response {
    let Ok(id) = id.parse::<u16>() else {
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
    use axum::http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE};
    let Some(query) = uri.query().filter(|q| !q.is_empty()) else {
        let gzip = headers
            .get_all(ACCEPT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|e| e.split(';').next().is_some_and(|e| e.trim() == "gzip"));
        return if gzip {
            (
                [
                    (CONTENT_TYPE, "application/json"),
                    (CONTENT_ENCODING, "gzip"),
                ],
                state.prober().status_json_gzip(),
            )
                .into_response()
        } else {
            (
                [(CONTENT_TYPE, "application/json")],
                state.prober().status_json(),
            )
                .into_response()
        };
    };
    let mut want_state = None;
    let mut want_node = None;
    let mut summary = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("state", v)) => match v {
                "success" => want_state = Some(ProbeResult::Success),
                "failure" => want_state = Some(ProbeResult::Failure),
                "unknown" => want_state = Some(ProbeResult::Unknown),
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        format!("state {v:?}: expected success, failure or unknown"),
                    );
                }
            },
            Some(("node", v)) if !v.is_empty() => want_node = Some(v.to_owned()),
            Some(("summary", "true")) => summary = true,
            Some(("summary", "false")) => summary = false,
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "unknown query parameter {pair:?} (state=success|failure|unknown, node=NAME, summary=true)"
                    ),
                );
            }
        }
    }
    let status = state.prober().status();
    if summary {
        return Json(status.summary()).into_response();
    }
    let filtered = status.filtered(|n| {
        want_state.is_none_or(|s| n.state() == s) && want_node.as_ref().is_none_or(|w| &n.name == w)
    });
    if let Some(name) = &want_node
        && filtered.nodes.is_empty()
        && !status.nodes.iter().any(|n| &n.name == name)
    {
        return error(StatusCode::NOT_FOUND, format!("node {name:?} not found"));
    }
    Json(filtered).into_response()
}

/// A fresh round, synchronously, within `?timeout=` (default 30s).
async fn probe(State(state): State<AppState>, uri: axum::http::Uri) -> Response {
    let mut deadline = Duration::from_secs(30);
    for pair in uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=') {
            Some(("timeout", v)) => match crate::util::duration::parse(v) {
                Ok(d) if d <= MAX_PROBE_DEADLINE => deadline = d,
                Ok(_) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        format!("timeout {v} is over the {MAX_PROBE_DEADLINE:?} limit"),
                    );
                }
                Err(e) => return error(StatusCode::BAD_REQUEST, format!("timeout: {e}")),
            },
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("unknown query parameter {pair:?} (only timeout=DURATION)"),
                );
            }
        }
    }
    match tokio::time::timeout(deadline, state.prober().round()).await {
        Ok(status) => Json(ClusterStatus::clone(&status)).into_response(),
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

async fn nodes(State(state): State<AppState>) -> Json<NodesView> {
    Json(NodesView::new(state.nodes.current(), state.nodes.status()))
}
