//! Request and response bodies.

use serde::{Deserialize, Serialize};

/// `GET /v1/healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Healthz {
    /// `ok` once the endpoint is ready, otherwise what the agent is doing.
    pub state: String,
    pub uptime_seconds: u64,
    pub pid: u32,
}

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub code: u16,
    pub message: String,
}
