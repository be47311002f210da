//! The latest cluster view, published by the agent's cluster-view task and
//! read by the API: its JSON made once per view, not per request.

use std::sync::{Arc, RwLock};

use bytes::Bytes;

use super::{matrix::ClusterMatrix, view::ClusterView};

#[derive(Debug, Clone)]
struct Published {
    view: Arc<ClusterView>,
    json: Bytes,
    matrix: Bytes,
}

/// Shared between the task that assembles the view and its readers.
#[derive(Debug, Clone, Default)]
pub struct ClusterViewCell {
    latest: Arc<RwLock<Option<Published>>>,
}

impl ClusterViewCell {
    /// Replaces the view and its matrix (serialised here, outside the
    /// lock).
    pub fn publish(&self, view: ClusterView, matrix: &ClusterMatrix) {
        let json = Bytes::from(serde_json::to_vec(&view).unwrap_or_default());
        let made = Published {
            view: Arc::new(view),
            json,
            matrix: Bytes::from(serde_json::to_vec(matrix).unwrap_or_default()),
        };
        if let Ok(mut l) = self.latest.write() {
            *l = Some(made);
        }
    }

    /// The latest view, if one was assembled.
    #[must_use]
    pub fn view(&self) -> Option<Arc<ClusterView>> {
        self.latest.read().ok()?.as_ref().map(|p| p.view.clone())
    }

    /// The latest view's matrix as JSON.
    #[must_use]
    pub fn matrix_json(&self) -> Option<Bytes> {
        self.latest.read().ok()?.as_ref().map(|p| p.matrix.clone())
    }

    /// The latest view as JSON.
    #[must_use]
    pub fn json(&self) -> Option<Bytes> {
        self.latest.read().ok()?.as_ref().map(|p| p.json.clone())
    }
}
