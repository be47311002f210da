//! The endpoint as the API shows it (`cilium endpoint get` style).

use std::{
    net::Ipv4Addr,
    sync::{Arc, RwLock},
};

use serde::{Deserialize, Serialize};

use super::{
    EndpointConfig,
    lifecycle::{Lifecycle, State, Transition},
    record::{EndpointRecord, HEALTH_IDENTITY, HEALTH_LABEL},
};

/// The last published view; `None` until the endpoint exists.
pub type SharedView = Arc<RwLock<Option<EndpointView>>>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointView {
    pub id: u16,
    pub identity: u32,
    pub labels: Vec<String>,
    pub ipv4: Ipv4Addr,
    pub interface: String,
    pub netns: String,
    pub state: Option<State>,
    pub repairs: u64,
    pub history: Vec<Transition>,
}

impl EndpointView {
    pub(super) fn new(
        record: &EndpointRecord,
        cfg: &EndpointConfig,
        lifecycle: &Lifecycle,
        repairs: u64,
    ) -> Self {
        Self {
            id: record.id,
            identity: HEALTH_IDENTITY,
            labels: vec![HEALTH_LABEL.to_owned()],
            ipv4: record.ipv4,
            interface: cfg.host_iface.clone(),
            netns: record.netns.clone(),
            state: lifecycle.state(),
            repairs,
            history: lifecycle.history().cloned().collect(),
        }
    }
}
