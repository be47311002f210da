//! The node's datapath task: through the object's owner
//! ([`DatapathHandle`]; the first request loads the object and creates
//! the pins) it writes the datapath's configuration (CT lifetimes,
//! masquerade) and keeps masquerade attached to the uplink (re-attached
//! when the uplink is recreated), and it maintains the maps: the NAT and
//! CT collectors (the CT one in slices, [`super::collect`]) and the RTT
//! loss sweep. On shutdown it detaches. The pins outlive a restart of this
//! task (the endpoint's programs share the maps): [`PinsGuard`] removes
//! them when the agent ends.

use std::{path::PathBuf, time::Duration};

use health_common::{
    ct::CtConfig,
    maps::{MapId, MapSizes},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    Attachments, DatapathError, DatapathHandle, Interface, MissingAttachment, TcHook,
    collect::{Collector, LossTimeout, PassDone},
    maps,
    masquerade::Masquerade,
    nat, remove_pins,
    report::{self, MapsReport},
};

use crate::{supervisor::Problem, sys::netlink::in_netns, util::errors::chain};

/// What the node's datapath is made of.
#[derive(Debug, Clone)]
pub struct DatapathConfig {
    /// bpffs directory of the pinned maps.
    pub pin_dir: PathBuf,
    /// Connection-tracking lifetimes.
    pub ct: CtConfig,
    /// Masquerade on the uplink (`None`: routed mode).
    pub masquerade: Option<Masquerade>,
    /// Period of the collectors' passes and the loss sweep (each pass is
    /// walked in slices over the period).
    pub gc_interval: Duration,
    /// A request unanswered for this long counts as an RTT loss: the probe
    /// timeout as reloads leave it, read at each sweep.
    pub probe_timeout: watch::Receiver<LossTimeout>,
    /// On shutdown, leave the pins for the next agent.
    pub keep_pins: bool,
    /// Sizes of the maps that grow with the cluster (`--max-peers`,
    /// `--ct-map-size`, `--nat-map-size`), as the object's owner loads
    /// them: the collectors' slices follow them.
    pub map_sizes: MapSizes,
    /// The tc hook masquerade is attached with (tcx or classic tc).
    pub tc_hook: TcHook,
    /// Where each walk of the maps (on the pressure cadence) is published.
    pub report: MapsReport,
}

/// A map is said to be under pressure above this share of its entries,
/// once, and again only after it fell below [`PRESSURE_CLEAR`].
pub const PRESSURE_WARN: f64 = 0.9;
pub const PRESSURE_CLEAR: f64 = 0.8;

/// How often map pressure is looked at: counting a map's entries walks it
/// with a syscall per key, so it is done once a minute, not at every pass
/// of the collectors.
pub const PRESSURE_EVERY: Duration = Duration::from_secs(60);

/// Which maps were last said to be under pressure.
#[derive(Debug, Default)]
pub struct Pressure {
    warned: Vec<String>,
    /// When the maps were last counted.
    last: Option<std::time::Instant>,
}

impl Pressure {
    /// Whether the maps are due to be counted again (and, if so, notes that
    /// they are being counted now).
    pub fn due(&mut self, now: std::time::Instant) -> bool {
        if self
            .last
            .is_some_and(|at| now.saturating_duration_since(at) < PRESSURE_EVERY)
        {
            return false;
        }
        self.last = Some(now);
        true
    }

    /// Warns once for each map of `rows` that went above
    /// [`PRESSURE_WARN`]; returns the names newly warned about.
    pub fn check(&mut self, rows: &[maps::MapRow]) -> Vec<String> {
        let mut new = Vec::new();
        // Arrays are full by construction; only hash maps fill up.
        for row in rows.iter().filter(|r| r.fills_up()) {
            let warned = self.warned.contains(&row.name);
            if row.pressure > PRESSURE_WARN && !warned {
                warn!(
                    map = %row.name,
                    entries = row.entries,
                    max_entries = row.max_entries,
                    "map is over {:.0} % full: raise --max-peers (RTT maps) or --ct-map-size / --nat-map-size",
                    PRESSURE_WARN * 100.0
                );
                self.warned.push(row.name.clone());
                new.push(row.name.clone());
            } else if row.pressure < PRESSURE_CLEAR && warned {
                info!(map = %row.name, "map pressure is back under {:.0} %", PRESSURE_CLEAR * 100.0);
                self.warned.retain(|n| n != &row.name);
            }
        }
        new
    }
}

/// Removes the pins under its directory when dropped (the agent's end,
/// however it ends), unless they are kept for the next agent.
#[derive(Debug)]
pub struct PinsGuard {
    pub dir: PathBuf,
    pub keep: bool,
}

impl Drop for PinsGuard {
    fn drop(&mut self) {
        if !self.keep
            && let Err(e) = remove_pins(&self.dir)
        {
            warn!("removing the pins: {}", chain(&e));
        }
    }
}

/// Masquerade's programs (none in routed mode) and the uplink they are
/// attached to.
struct Node {
    nat: Attachments,
    uplink_index: Option<u32>,
    pressure: Pressure,
    /// When the pins were last looked for.
    pins_checked: Option<std::time::Instant>,
}

/// How often the pins are looked for (bpffs unmounted under the agent, a
/// pin removed): a `stat` of each.
const PINS_EVERY: Duration = Duration::from_secs(1);

/// Runs until `shutdown`; `ready` is called once the configuration is
/// written and masquerade (if any) is attached. Pins that could not be
/// restored are reported through `problem`.
pub async fn run(
    cfg: DatapathConfig,
    kernel: DatapathHandle,
    problem: Problem,
    shutdown: CancellationToken,
    ready: impl FnOnce() + Send,
) -> Result<(), DatapathError> {
    let (c, k) = (cfg.clone(), kernel.clone());
    let mut node = blocking(move || set_up(&c, &k)).await?;
    ready();
    let mut collector = Collector::new(
        cfg.gc_interval,
        cfg.probe_timeout.clone(),
        &cfg.map_sizes,
        std::time::Instant::now(),
    )
    .with_lifetimes(&cfg.ct);
    let mut tick = tokio::time::interval(collector.tick());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let (c, k, p) = (cfg.clone(), kernel.clone(), problem.clone());
        (node, collector) = blocking(move || {
            keep_pins(&k, &mut node, &p);
            maintain(&c, &k, node, collector)
        })
        .await?;
    }
    drop(node);
    Ok(())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DatapathError> + Send + 'static,
) -> Result<T, DatapathError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DatapathError::Panicked(e.to_string()))?
}

/// Writes the configuration and attaches masquerade, through the owner
/// (which loads the object at the first request).
fn set_up(cfg: &DatapathConfig, kernel: &DatapathHandle) -> Result<Node, DatapathError> {
    kernel.set_ct_config(cfg.ct)?;
    // Always written: pins reused from a masquerading run must not keep
    // translating after a switch to routed mode.
    kernel.set_nat_config(
        cfg.masquerade
            .as_ref()
            .map(|m| m.config)
            .unwrap_or_default(),
    )?;
    let nat = kernel.attachments();
    let uplink_index = match &cfg.masquerade {
        Some(m) => {
            nat.attach_nat(&Interface::new(m.uplink.clone(), None), cfg.tc_hook)?;
            uplink_index(&m.uplink)
        }
        None => None,
    };
    Ok(Node {
        nat,
        uplink_index,
        pressure: Pressure::default(),
        pins_checked: None,
    })
}

/// The pins still there (once per [`PINS_EVERY`]): any that are gone are
/// pinned again from the maps the agent holds; what cannot be is the
/// task's problem until it can.
fn keep_pins(kernel: &DatapathHandle, node: &mut Node, problem: &Problem) {
    let now = std::time::Instant::now();
    if node
        .pins_checked
        .is_some_and(|at| now.saturating_duration_since(at) < PINS_EVERY)
    {
        return;
    }
    node.pins_checked = Some(now);
    match kernel.repin() {
        Ok(pinned) => {
            if !pinned.is_empty() {
                warn!(
                    dir = %kernel.pin_dir().display(),
                    maps = %pinned.join(", "),
                    "pinned maps were gone (bpffs unmounted or pins removed): pinned again"
                );
            }
            problem.set(None);
        }
        Err(e) => problem.set(Some(format!(
            "pinned maps under {} are gone and cannot be pinned again (the datapath runs on; \
             the bpf commands and the collectors wait for the pins): {}",
            kernel.pin_dir().display(),
            chain(&e)
        ))),
    }
}

fn uplink_index(name: &str) -> Option<u32> {
    let name = name.to_owned();
    in_netns(None, |nl| async move { nl.link_index(&name).await })
        .map_err(|e| warn!("looking up the uplink: {}", chain(&e)))
        .ok()
        .flatten()
}

/// The masquerade programs no longer on the uplink (a tc filter deleted
/// by someone else, the clsact qdisc removed, a tcx link detached).
fn missing_nat(node: &Node) -> Vec<MissingAttachment> {
    node.nat
        .missing()
        .map_err(|e| warn!("checking the uplink's programs: {}", chain(&e)))
        .unwrap_or_default()
}

/// One maintenance tick: when a pass starts, masquerade still on the
/// uplink, the NAT collector and the loss sweep; at every tick of a pass, a
/// slice of the CT collector ([`Collector`]); when a pass completes, map pressure
/// (on its cadence) and freed memory back to the kernel. Failures are
/// logged; the next pass retries.
fn maintain(
    cfg: &DatapathConfig,
    kernel: &DatapathHandle,
    mut node: Node,
    mut collector: Collector,
) -> Result<(Node, Collector), DatapathError> {
    if collector.start_if_due(std::time::Instant::now()) {
        node = keep_masquerade(cfg, kernel, node)?;
        // NAT first: it removes pairs whose CT entry expired, which the CT
        // collector is about to delete. Neither when no CT entry can have
        // expired, but for one collection after a walk that removed
        // entries (one that expired after that pass's NAT collection
        // left its pair).
        if collector.plan_walk(kernel.pin_dir())
            && let Err(e) = nat::gc(kernel.pin_dir())
        {
            warn!("NAT garbage collection: {}", chain(&e));
        }
        // Records of fragmented datagrams last 30 s, whatever the flows:
        // the map is nearly always empty, and its walk then one system
        // call.
        if cfg.masquerade.is_some()
            && let Err(e) = nat::gc_fragments(kernel.pin_dir())
        {
            warn!("NAT fragment records' collection: {}", chain(&e));
        }
    }
    if !collector.running() {
        return Ok((node, collector));
    }
    match collector.step(kernel.pin_dir()) {
        Ok(Some(done)) => pass_done(cfg, kernel, &mut node, &done),
        Ok(None) => {}
        Err(e) => warn!("datapath maintenance: {}", chain(&e)),
    }
    // The slice's buffers are freed: hand their pages back now (a slice
    // runs during a probe round, whose peak it would otherwise raise).
    crate::util::memory::release_free();
    Ok((node, collector))
}

/// A completed pass: logged, and the map pressure counted when due, with
/// the entries the pass left in the maps it walked (not walked again).
fn pass_done(cfg: &DatapathConfig, kernel: &DatapathHandle, node: &mut Node, done: &PassDone) {
    debug!(
        ct_removed = done.ct_removed,
        ct_left = done.ct_left,
        lost = done.lost,
        pending_left = done.pending_left,
        slices = done.slices,
        took_ms = done.took.as_millis(),
        ct_walked = done.ct_walked,
        "datapath maintenance pass"
    );
    if node.pressure.due(std::time::Instant::now()) {
        let counted = vec![
            (MapId::CtMap, done.ct_left),
            (MapId::RttPending, done.pending_left),
        ];
        match report::snapshot_counted(kernel.pin_dir(), counted, Some(done.ct_evicted)) {
            Ok(snapshot) => {
                drop(node.pressure.check(&snapshot.rows));
                cfg.report.publish(snapshot);
            }
            Err(e) => warn!("reading map pressure: {}", chain(&e)),
        }
    }
}

/// Masquerade still attached to the uplink: attached again when the uplink
/// was recreated or its programs detached.
fn keep_masquerade(
    cfg: &DatapathConfig,
    kernel: &DatapathHandle,
    node: Node,
) -> Result<Node, DatapathError> {
    let Some(m) = &cfg.masquerade else {
        return Ok(node);
    };
    if uplink_index(&m.uplink) == node.uplink_index {
        let missing = missing_nat(&node);
        if missing.is_empty() {
            return Ok(node);
        }
        warn!(
            uplink = %m.uplink,
            missing = %super::render_missing(&missing),
            "masquerade programs were detached from the uplink: attaching them again"
        );
    } else {
        warn!(uplink = %m.uplink, "the uplink was recreated: attaching masquerade again");
    }
    // The old set goes first: one program of each per hook.
    drop(node);
    let node = set_up(cfg, kernel)?;
    info!(uplink = %m.uplink, "masquerade attached again");
    Ok(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(entries: u64) -> maps::MapRow {
        maps::MapRow {
            name: "CT_MAP".into(),
            kind: "lru_hash".into(),
            entries,
            max_entries: 100,
            #[allow(clippy::cast_precision_loss, reason = "small test counts")]
            pressure: entries as f64 / 100.0,
        }
    }

    #[test]
    fn pressure_is_counted_once_a_minute() {
        let mut p = Pressure::default();
        let t0 = std::time::Instant::now();
        assert!(p.due(t0), "at the first pass");
        assert!(!p.due(t0 + Duration::from_secs(10)));
        assert!(!p.due(t0 + Duration::from_secs(59)));
        assert!(p.due(t0 + PRESSURE_EVERY));
        assert!(!p.due(t0 + PRESSURE_EVERY + Duration::from_secs(1)));
    }

    #[test]
    fn pressure_is_said_once_and_again_only_after_it_eased() {
        let mut p = Pressure::default();
        assert_eq!(p.check(&[row(50)]), Vec::<String>::new());
        assert_eq!(p.check(&[row(95)]), ["CT_MAP"]);
        assert_eq!(p.check(&[row(99)]), Vec::<String>::new(), "not repeated");
        assert_eq!(
            p.check(&[row(85)]),
            Vec::<String>::new(),
            "still above the clear mark"
        );
        assert_eq!(
            p.check(&[row(92)]),
            Vec::<String>::new(),
            "not re-armed yet"
        );
        assert_eq!(p.check(&[row(10)]), Vec::<String>::new());
        assert_eq!(p.check(&[row(91)]), ["CT_MAP"], "re-armed below 80 %");
    }
}
