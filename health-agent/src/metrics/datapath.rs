//! The datapath's counters, read from the pinned maps at each scrape (a
//! few per-CPU array lookups), and what the maintenance task's last walk
//! of the maps found (entries, pressure, evictions, RTT samples and
//! losses), which is too costly to take per scrape at scale.

use std::path::PathBuf;

use health_common::{
    ct::CtCounter,
    maps::{EchoCounter, MapId},
    nat::NatCounter,
};
use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::encode::{counter, counters, gauge, gauges};
use crate::datapath::{maps::read_counters, read_pinned_stats, report::MapsReport};

#[derive(Debug)]
pub(super) struct DatapathCollector {
    pub(super) pin_dir: PathBuf,
    pub(super) report: MapsReport,
}

impl DatapathCollector {
    fn echo(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(stats) = read_pinned_stats(&self.pin_dir) else {
            return Ok(());
        };
        let by = EchoCounter::ALL.map(|c| {
            let v = match c {
                EchoCounter::Answered => stats.answered,
                EchoCounter::Passed => stats.passed,
                EchoCounter::Malformed => stats.malformed,
            };
            ([("verdict", c.name())], v)
        });
        counters(
            enc,
            "echo_packets",
            "Packets seen by the eBPF echo responder: answered in the kernel program, passed to the stack, dropped as malformed",
            by,
        )
    }

    /// Every counter of a per-CPU counter array, as `<prefix>_<name>_total`.
    fn array(
        &self,
        enc: &mut DescriptorEncoder,
        map: MapId,
        prefix: &str,
        wanted: &[(&'static str, u32)],
    ) -> Result<(), std::fmt::Error> {
        let Ok(values) = read_counters(&self.pin_dir, map, wanted) else {
            return Ok(());
        };
        for (name, v) in values {
            counter(
                enc,
                &format!("{prefix}_{name}"),
                &format!("{} (map {})", counter_help(prefix, name), map.name()),
                v,
            )?;
        }
        Ok(())
    }

    fn walked(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = self.report.latest() else {
            return Ok(());
        };
        let entries = |name| i64::try_from(s.entries(name).unwrap_or(0)).unwrap_or(i64::MAX);
        gauge(
            enc,
            "ct_entries",
            "Connection-tracking entries (at the last walk of the maps)",
            entries(MapId::CtMap.name()),
        )?;
        counter(
            enc,
            "ct_evicted",
            "CT entries evicted by the kernel (LRU) rather than removed by the collector",
            s.ct_evicted,
        )?;
        gauge(
            enc,
            "nat_entries",
            "Masquerade pairs (at the last walk of the maps)",
            entries(MapId::NatMap.name()),
        )?;
        gauge(
            enc,
            "rtt_samples",
            "Kernel RTT samples held for the peers in the map",
            i64::try_from(s.rtt_samples).unwrap_or(i64::MAX),
        )?;
        gauge(
            enc,
            "rtt_losses",
            "Requests the kernel saw unanswered, for the peers in the map",
            i64::try_from(s.rtt_losses).unwrap_or(i64::MAX),
        )?;
        let hashes = || s.rows.iter().filter(|r| r.fills_up());
        gauges(
            enc,
            "map_entries",
            "Entries of each hash map",
            hashes().map(|r| {
                (
                    [("map", r.name.as_str())],
                    i64::try_from(r.entries).unwrap_or(i64::MAX),
                )
            }),
        )?;
        gauges(
            enc,
            "map_max_entries",
            "Size of each hash map",
            hashes().map(|r| ([("map", r.name.as_str())], i64::from(r.max_entries))),
        )?;
        gauges(
            enc,
            "map_pressure_ratio",
            "Entries over size of each hash map (the agent warns above 0.9)",
            hashes().map(|r| ([("map", r.name.as_str())], r.pressure)),
        )
    }
}

/// What each counter of the CT and NAT arrays counts.
fn counter_help(prefix: &str, name: &str) -> &'static str {
    match (prefix, name) {
        ("ct", "lookups") => "Connection-tracking lookups by the endpoint's programs",
        ("ct", "created") => "Connection-tracking entries created",
        ("ct", "insert_failures") => "Connection-tracking entries that could not be inserted",
        ("ct", "removed") => "Expired connection-tracking entries removed by the agent's collector",
        ("ct", "unparsed") => "Packets the CT programs could not parse (passed on untouched)",
        ("nat", "snat") => "Packets whose source was masqueraded to the node IP (egress)",
        ("nat", "rev_snat") => "Replies whose destination was translated back (ingress)",
        ("nat", "created") => "Masquerade pairs created",
        ("nat", "alloc_failures") => "Packets dropped because no masquerade port was free",
        ("nat", "removed") => "Masquerade pairs removed by the agent's collector",
        ("nat", "rewrite_failures") => "Packets whose masquerade rewrite failed",
        ("nat", "frag_snat") => {
            "Later fragments whose source was masqueraded like their first fragment's (egress)"
        }
        ("nat", "frag_rev_snat") => {
            "Later fragments whose destination was translated back like their first fragment's (ingress)"
        }
        ("nat", "frag_dropped") => {
            "Later fragments dropped for want of a live record of their datagram's first fragment"
        }
        ("nat", "node_held") => {
            "Masquerade ports or echo identifiers held for a flow of the node's own toward a peer"
        }
        _ => "Datapath counter",
    }
}

impl Collector for DatapathCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.echo(&mut enc)?;
        let ct: Vec<_> = CtCounter::ALL
            .iter()
            .map(|c| (c.name(), *c as u32))
            .collect();
        self.array(&mut enc, MapId::CtStats, "ct", &ct)?;
        let nat: Vec<_> = NatCounter::ALL
            .iter()
            .map(|c| (c.name(), *c as u32))
            .collect();
        self.array(&mut enc, MapId::NatStats, "nat", &nat)?;
        self.walked(&mut enc)
    }
}
