//! The latest cluster view, published by the agent's cluster-view task and
//! read by the API: its JSON made once per view, not per request.

use std::sync::{Arc, RwLock};

use bytes::Bytes;

use super::view::ClusterView;

#[derive(Debug, Clone)]
struct Published {
    view: Arc<ClusterView>,
    json: Bytes,
}

/// Shared between the task that assembles the view and its readers.
#[derive(Debug, Clone, Default)]
pub struct ClusterViewCell {
    latest: Arc<RwLock<Option<Published>>>,
}

impl ClusterViewCell {
    /// Replaces the view (serialised here, outside the lock).
    pub fn publish(&self, view: ClusterView) {
        let json = Bytes::from(serde_json::to_vec(&view).unwrap_or_default());
        let made = Published {
            view: Arc::new(view),
            json,
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

    /// The latest view as JSON.
    #[must_use]
    pub fn json(&self) -> Option<Bytes> {
        self.latest.read().ok()?.as_ref().map(|p| p.json.clone())
    }
}
