//! The agent itself: its endpoint's lifecycle state and repairs, the node
//! set's size and source, rejected node updates, the kvstore connection,
//! and the build.

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::encode::{counter, counters, gauge, gauges};
use crate::{
    endpoint::SharedView,
    endpoint::lifecycle::State,
    membership::published::{Nodes, REWRITTEN_AFTER},
};

#[derive(Debug)]
pub(super) struct AgentCollector {
    pub(super) view: SharedView,
    pub(super) nodes: Nodes,
}

impl Collector for AgentCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (state, repairs) = self
            .view
            .read()
            .ok()
            .and_then(|v| v.as_ref().map(|v| (v.state, v.repairs)))
            .unwrap_or((None, 0));
        gauges(
            &mut enc,
            "endpoint_state",
            "The health endpoint's lifecycle state: 1 for the current one",
            State::ALL.map(|s| ([("state", s.as_str())], i64::from(Some(s) == state))),
        )?;
        counter(
            &mut enc,
            "endpoint_repairs",
            "Repairs of the health endpoint by its controller",
            repairs,
        )?;
        let status = self.nodes.status();
        let kind = status.source.split(':').next().unwrap_or("none").to_owned();
        gauges(
            &mut enc,
            "nodes",
            "Nodes in the node set, by source",
            [(
                [("source", kind.as_str())],
                i64::try_from(self.nodes.current().len()).unwrap_or(i64::MAX),
            )],
        )?;
        counter(
            &mut enc,
            "node_updates_rejected",
            "Node-set updates rejected as a whole (the last good set stays)",
            self.nodes.updates_rejected(),
        )?;
        gauge(
            &mut enc,
            "node_records_rejected",
            "Records of the last accepted node-set update that were rejected",
            i64::try_from(status.rejected_total).unwrap_or(i64::MAX),
        )?;
        if kind == "etcd" {
            gauge(
                &mut enc,
                "kvstore_connected",
                "1 while the last exchange with the kvstore succeeded",
                i64::from(status.connected == Some(true)),
            )?;
            counters(
                &mut enc,
                "own_record_rewrites",
                "This node's record written back, by whose change it undid: deleted, written without a lease, under this agent's lease, or under another (a second agent given this node's name?)",
                REWRITTEN_AFTER
                    .into_iter()
                    .zip(self.nodes.rewrites())
                    .map(|(after, n)| ([("after", after)], n)),
            )?;
            gauge(
                &mut enc,
                "allocations_uncounted",
                "Health allocations that count for nothing: refused, or overlapping another (--kvstore-allocations)",
                i64::try_from(status.allocations_uncounted_total).unwrap_or(i64::MAX),
            )?;
        }
        gauges(
            &mut enc,
            "build_info",
            "The agent's version",
            [([("version", env!("CARGO_PKG_VERSION"))], 1i64)],
        )
    }
}
