//! The endpoint as the API shows it (`cilium endpoint get` style).

use std::{
    net::{Ipv4Addr, Ipv6Addr},
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
    /// The endpoint's IPv4 address (`null` when it has none).
    #[serde(default)]
    pub ipv4: Option<Ipv4Addr>,
    /// The endpoint's IPv6 address (`null` when it has none).
    #[serde(default)]
    pub ipv6: Option<Ipv6Addr>,
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
            ipv6: record.ipv6,
            interface: cfg.host_iface.clone(),
            netns: record.netns.clone(),
            state: lifecycle.state(),
            repairs,
            history: lifecycle.history().cloned().collect(),
        }
    }
}

/// The endpoint's IPv4 address once it exists and when it has one.
#[must_use]
pub fn ipv4(view: &SharedView) -> Option<Ipv4Addr> {
    view.read()
        .ok()
        .and_then(|v| v.as_ref().and_then(|v| v.ipv4))
}

/// The endpoint's IPv6 address once it exists and when it has one.
#[must_use]
pub fn ipv6(view: &SharedView) -> Option<Ipv6Addr> {
    view.read()
        .ok()
        .and_then(|v| v.as_ref().and_then(|v| v.ipv6))
}
