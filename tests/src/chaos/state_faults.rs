//! The faults of the agent's own storage: its state directory made
//! read-only, the bpffs of its pins unmounted.

use std::{
    collections::BTreeSet,
    fs,
    path::Path,
    time::{Duration, Instant},
};

use health_agent::sys::netlink::in_netns;
use health_common::maps::MapId;
use nix::sys::signal::Signal;

use super::{Chaos, Row, stopped};

impl Chaos {
    /// Polls node `i`'s `/v1/healthz` until `accept` holds: how long it
    /// took, or `None` after `timeout`.
    fn wait_healthz(
        &self,
        i: usize,
        timeout: Duration,
        accept: impl Fn(&health_agent::api::types::Healthz) -> bool,
    ) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < timeout && !stopped() {
            if self.cluster.nodes[i].healthz().is_some_and(|h| accept(&h)) {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        None
    }

    /// The state directory made read-only under a running agent (a
    /// read-only bind mount: root ignores permissions), and the endpoint's
    /// veth deleted so that its repair must record the new one. The agent
    /// repairs it, says it is degraded (its record unsaved), keeps
    /// answering and probing; once the directory is writable again the
    /// record is saved, naming the veth in place.
    pub(super) fn state_read_only(&mut self, row: &mut Row) {
        let victim = self.n() - 1;
        let node = &self.cluster.nodes[victim];
        let name = node.name.clone();
        let state = node.dir.join("state");
        row.fault = format!("{name}'s state directory read-only, its lxc_health deleted");
        let ro = match ReadOnly::bind(&state) {
            Ok(ro) => ro,
            Err(e) => {
                row.fail(format!("read-only bind mount of {}: {e}", state.display()));
                return;
            }
        };
        let ns = node.ns.clone();
        if let Err(e) = in_netns(
            Some(&ns),
            |nl| async move { nl.delete_link("lxc_health").await },
        ) {
            row.fail(format!("deleting {name}'s lxc_health: {e}"));
            return;
        }
        let degraded = self.wait_healthz(victim, Duration::from_secs(15), |h| {
            h.tasks.iter().any(|t| {
                t.name == "endpoint" && t.problem.as_deref().is_some_and(|p| p.contains("record"))
            })
        });
        match degraded {
            Some(t) => row.held.push(format!(
                "{name} repaired its endpoint and said in {:.1}s its record is unsaved",
                t.as_secs_f64()
            )),
            None => row.fail(format!(
                "{name} did not say its record is unsaved: {:?}",
                self.cluster.nodes[victim].healthz()
            )),
        }
        self.watch(row, Duration::from_secs(5), None, &BTreeSet::new());
        if self.settled() {
            row.held.push(format!(
                "{name} answered and probed on, every node reachable"
            ));
        } else {
            row.fail(format!(
                "not every node reachable while read-only:\n{}",
                self.describe()
            ));
        }
        drop(ro);
        let ended = Instant::now();
        let saved = self.wait_healthz(victim, Duration::from_secs(15), |h| h.state == "ok");
        row.recovery = saved.map(|_| ended.elapsed());
        if saved.is_none() {
            row.fail(format!(
                "{name} still degraded once writable: {:?}",
                self.cluster.nodes[victim].healthz()
            ));
            return;
        }
        let recorded = health_agent::endpoint::record::EndpointRecord::load(&state)
            .ok()
            .flatten()
            .and_then(|r| r.owned?.host)
            .map(|h| h.ifindex);
        let ns = self.cluster.nodes[victim].ns.clone();
        let live = in_netns(
            Some(&ns),
            |nl| async move { nl.link_index("lxc_health").await },
        )
        .ok()
        .flatten();
        if recorded.is_some() && recorded == live {
            row.held.push(format!(
                "record saved once writable, naming the lxc_health in place (index {})",
                live.unwrap_or(0)
            ));
        } else {
            row.fail(format!(
                "record names lxc_health {recorded:?}, the live one is {live:?}"
            ));
        }
    }

    /// The bpffs that holds an agent's pins unmounted under it: the
    /// agent pins the same maps again (their counters carry on), keeps
    /// answering and probing, and is not degraded once they are back.
    pub(super) fn bpffs_unmounted(&mut self, row: &mut Row) {
        let victim = self.n() - 1;
        let name = self.cluster.nodes[victim].name.clone();
        let pins = self.cluster.nodes[victim].pins.clone();
        row.fault = format!("{name}'s bpffs unmounted under its agent");
        // The agent's pins in a bpffs of their own, so that unmounting it
        // touches nothing else of this machine.
        self.cluster.stop_agent(victim, Signal::SIGTERM);
        let mount = match OwnBpffs::mount(&pins) {
            Ok(m) => m,
            Err(e) => {
                row.fail(format!("mounting a bpffs on {}: {e}", pins.display()));
                self.cluster.start_agent(victim);
                return;
            }
        };
        self.cluster.start_agent(victim);
        if self
            .wait_healthz(victim, Duration::from_secs(30), |h| h.state == "ok")
            .is_none()
        {
            row.fail(format!("{name} did not start on its own bpffs"));
            return;
        }
        self.resync(row, Duration::from_secs(30));
        row.recovery = None;
        let before = pinned(&pins);
        let answered = health_agent::datapath::read_pinned_stats(&pins).map_or(0, |s| s.answered);
        let ids_before = map_ids(&pins);
        let rounds = self.rounds();
        drop(mount);
        let gone = pinned(&pins);
        let unmounted = Instant::now();
        let mut back = None;
        while unmounted.elapsed() < Duration::from_secs(15) && !stopped() {
            if pinned(&pins) == pinned_maps().count() {
                back = Some(unmounted.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        row.recovery = back;
        let Some(t) = back else {
            row.fail(format!(
                "pins not back in 15s: {} of {before}",
                pinned(&pins)
            ));
            return;
        };
        row.held.push(format!(
            "{before} pins, {gone} left by the unmount, all pinned again in {:.1}s",
            t.as_secs_f64()
        ));
        self.watch(row, Duration::from_secs(4), None, &BTreeSet::new());
        let again = health_agent::datapath::read_pinned_stats(&pins).map_or(0, |s| s.answered);
        let ids_after = map_ids(&pins);
        if ids_after == ids_before && again > answered {
            row.held.push(format!(
                "the same maps pinned again (their kernel IDs), echo replies counted on from {answered} to {again}"
            ));
        } else {
            row.fail(format!(
                "map IDs {ids_before:?} before, {ids_after:?} after; echo replies {answered} before, {again} after"
            ));
        }
        let advanced = rounds.iter().zip(self.rounds()).all(|(b, a)| a > *b);
        match self.cluster.nodes[victim].healthz() {
            Some(h) if h.state == "ok" && advanced => {
                row.held.push(format!("{name} probed on and is ok"));
            }
            h => row.fail(format!(
                "{name} after the unmount: {h:?}, rounds advanced: {advanced}"
            )),
        }
    }
}

/// A read-only bind mount of a directory over itself, removed when
/// dropped.
struct ReadOnly(std::path::PathBuf);

impl ReadOnly {
    fn bind(dir: &Path) -> nix::Result<Self> {
        use nix::mount::{MsFlags, mount};
        mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
        let ro = Self(dir.to_owned());
        mount(
            None::<&str>,
            dir,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )?;
        Ok(ro)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A bpffs of its own mounted on a directory (made if needed), unmounted
/// (lazily: whatever holds it keeps it) when dropped.
struct OwnBpffs(std::path::PathBuf);

impl OwnBpffs {
    fn mount(dir: &Path) -> Result<Self, String> {
        fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        nix::mount::mount(
            Some("bpf"),
            dir,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            Some("mode=0700"),
        )
        .map_err(|e| e.to_string())?;
        Ok(Self(dir.to_owned()))
    }
}

impl Drop for OwnBpffs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The kernel IDs of the maps pinned in `dir`, in [`MapId::ALL`] order
/// (`None` where a pin is missing).
fn map_ids(dir: &Path) -> Vec<Option<u32>> {
    MapId::ALL
        .iter()
        .map(|m| {
            aya::maps::MapInfo::from_pin(dir.join(m.name()))
                .ok()
                .map(|i| i.id())
        })
        .collect()
}

/// The maps the agent pins: all but aya-log's ring buffer.
fn pinned_maps() -> impl Iterator<Item = MapId> {
    MapId::ALL.into_iter().filter(|m| *m != MapId::AyaLogs)
}

/// How many of [`pinned_maps`] are pinned under `dir`.
fn pinned(dir: &Path) -> usize {
    pinned_maps()
        .filter(|m| fs::symlink_metadata(dir.join(m.name())).is_ok())
        .count()
}
