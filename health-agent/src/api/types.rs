//! Request and response bodies, and the API's paths.

use serde::{Deserialize, Serialize};

use crate::{
    datapath::KernelReport,
    membership::{NodeSet, published::SourceStatus, record::RejectedRecord},
    supervisor::TaskStatus,
};

/// Longest deadline a `PUT /v1/status/probe` may ask for.
pub const PROBE_DEADLINE_MAX: std::time::Duration = std::time::Duration::from_secs(120);

/// The API's paths, for the server's routes and the client's calls.
pub mod paths {
    pub const HEALTHZ: &str = "/v1/healthz";
    pub const ENDPOINTS: &str = "/v1/endpoints";
    pub const ENDPOINT: &str = "/v1/endpoints/{id}";
    pub const STATUS: &str = "/v1/status";
    pub const STATUS_PROBE: &str = "/v1/status/probe";
    /// `?node=NAME`: a node's paths; `?stats=true`: every node's figures;
    /// neither: every node's strips.
    pub const STATUS_HISTORY: &str = "/v1/status/history";
    /// `?node=NAME`: a node's paths over the sliding windows (loss with
    /// its confidence interval, RTT percentiles, degraded or not).
    pub const STATUS_QUALITY: &str = "/v1/status/quality";
    pub const NODES: &str = "/v1/nodes";
    /// Prometheus metrics (`OpenMetrics` text), as on the metrics listener.
    pub const METRICS: &str = "/metrics";
    /// The cluster view assembled from every agent's summaries.
    pub const CLUSTER: &str = "/v1/cluster";
    /// The cluster view as an observers-by-targets matrix.
    pub const CLUSTER_MATRIX: &str = "/v1/cluster/matrix";
}

/// `GET /v1/healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Healthz {
    /// `ok` once the endpoint is ready and no task is degraded; otherwise
    /// what the agent is doing (`starting`, `endpoint regenerating`) or
    /// `degraded: <task>, ...`.
    pub state: String,
    pub uptime_seconds: u64,
    pub pid: u32,
    /// The agent's supervised tasks.
    #[serde(default)]
    pub tasks: Vec<TaskStatus>,
    /// The kernel release, its features, and how each program is attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelReport>,
}

/// `GET /v1/nodes`: the node set in use and how its source is doing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodesView {
    /// `file:<path>`, `etcd:<endpoint><prefix>`, or `none`.
    pub source: String,
    pub nodes: NodeSet,
    /// Why the latest update was rejected as a whole (the set above is the
    /// last good one).
    pub error: Option<String>,
    /// Epoch milliseconds of the last accepted update.
    pub updated_ms: Option<u64>,
    /// The records of the set's update that were rejected one by one
    /// (where, name, why): the first 100, in file or key order.
    #[serde(default)]
    pub rejected: Vec<RejectedRecord>,
    /// How many records were rejected in all.
    #[serde(default)]
    pub rejected_total: usize,
    /// Peers' health addresses the agent refused to route, each with why
    /// (the first 100).
    #[serde(default)]
    pub refused_routes: Vec<crate::membership::routes::RefusedRoute>,
    /// How many were refused in all.
    #[serde(default)]
    pub refused_routes_total: usize,
    /// With `--kvstore-allocations`: the health allocations that count for
    /// nothing (refused, or overlapping another), at their etcd keys, each
    /// with why (the first 100, by name).
    #[serde(default)]
    pub allocations_uncounted: Vec<RejectedRecord>,
    /// How many in all.
    #[serde(default)]
    pub allocations_uncounted_total: usize,
}

impl NodesView {
    #[must_use]
    pub fn new(nodes: NodeSet, status: SourceStatus) -> Self {
        Self {
            source: status.source,
            nodes,
            error: status.error,
            updated_ms: status.updated_ms,
            rejected: status.rejected,
            rejected_total: status.rejected_total,
            refused_routes: status.refused_routes,
            refused_routes_total: status.refused_routes_total,
            allocations_uncounted: status.allocations_uncounted,
            allocations_uncounted_total: status.allocations_uncounted_total,
        }
    }
}

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub code: u16,
    pub message: String,
}
