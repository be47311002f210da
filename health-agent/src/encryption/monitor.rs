//! After each round: the probe counters read (and the watched addresses
//! kept to the probed peers'), the WireGuard device read, the counting
//! programs attached to interfaces that appeared, every probed address
//! judged. Blocking (netlink and map syscalls): the prober runs it on a
//! blocking thread.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::SystemTime,
};

use health_common::encrypt::WatchCounts;
use tracing::{info, warn};

use super::{
    settings::EncryptionSettings,
    state::{EncState, EncryptionView, PathEncryption},
    verdict::{Context, Coverage, Seen, judge},
};
use crate::{
    datapath::{Attachments, DatapathHandle, Interface, TcHook, encrypt_watch},
    membership::{Node, NodeSet},
    sys::{
        netlink::LinkSummary,
        wireguard::{self, WgDevice},
    },
    util::errors::chain,
};

/// Rounds a path's probe counts are judged over.
const WINDOW: usize = 3;

/// Each watched address's counters: the last reading and the increments
/// of the last [`WINDOW`] rounds.
#[derive(Debug, Default)]
struct Counted {
    last: WatchCounts,
    recent: [WatchCounts; WINDOW],
    next: usize,
}

impl Counted {
    /// An address first watched when its entry read `reading`: an entry
    /// kept from before (a restart keeps the map) counts only what comes
    /// after, not its whole life as one round.
    fn starting_at(reading: WatchCounts) -> Self {
        Self {
            last: reading,
            ..Self::default()
        }
    }

    fn push(&mut self, now: WatchCounts) {
        // A counter that went back (the map entry was made again, or, rarely,
        // a CPU's late write undid increments another CPU made: the value is
        // shared, without atomics) starts over from zero: a round may count
        // more packets than went, never a destination's plain text as none.
        let delta = |n: u64, l: u64| if n >= l { n - l } else { n };
        self.recent[self.next % WINDOW] = WatchCounts {
            tunnel: delta(now.tunnel, self.last.tunnel),
            plain: delta(now.plain, self.last.plain),
        };
        self.next += 1;
        self.last = now;
    }

    fn seen(&self) -> Seen {
        self.recent.iter().fold(Seen::default(), |s, c| Seen {
            tunnel: s.tunnel + c.tunnel,
            plain: s.plain + c.plain,
        })
    }
}

/// Addresses watched from now on start from their entries' readings in
/// `present` (zero for an entry made just now).
fn prime(
    counted: &mut HashMap<IpAddr, Counted>,
    present: &BTreeMap<IpAddr, WatchCounts>,
    wanted: &BTreeSet<IpAddr>,
) {
    for ip in wanted {
        counted
            .entry(*ip)
            .or_insert_with(|| Counted::starting_at(present.get(ip).copied().unwrap_or_default()));
    }
}

/// Each wanted address's probes over the window, with the round's reading
/// `present` pushed; a reading that failed (`None`) pushes nothing, so the
/// next good one counts from the last good one, not from zero.
fn tally(
    counted: &mut HashMap<IpAddr, Counted>,
    wanted: &BTreeSet<IpAddr>,
    present: Option<&BTreeMap<IpAddr, WatchCounts>>,
) -> HashMap<IpAddr, Seen> {
    counted.retain(|ip, _| wanted.contains(ip));
    wanted
        .iter()
        .map(|ip| {
            let reading = present.map(|p| p.get(ip).copied().unwrap_or_default());
            let seen = match (counted.get_mut(ip), reading) {
                (Some(c), Some(now)) => {
                    c.push(now);
                    c.seen()
                }
                (Some(c), None) => c.seen(),
                // Not primed (the reading before the round failed): this
                // reading is where it starts.
                (None, Some(now)) => {
                    counted.insert(*ip, Counted::starting_at(now));
                    Seen::default()
                }
                (None, None) => Seen::default(),
            };
            (*ip, seen)
        })
        .collect()
}

/// Where the counting programs are attached: interface name and index,
/// and whether it is the tunnel.
type Placement = BTreeSet<(String, u32, bool)>;

struct Watching {
    placed: Placement,
    attachments: Option<Attachments>,
    /// The node's addressed interfaces no program watches ([`unwatched`]).
    unwatched: Vec<String>,
}

pub struct EncryptionMonitor {
    settings: EncryptionSettings,
    /// The families this agent probes its peers in.
    families: Families,
    local: Option<String>,
    datapath: DatapathHandle,
    hook: TcHook,
    /// The endpoint's veth (its host side): probes from the endpoint
    /// cross it inbound, never out, so it is not counted.
    endpoint_iface: String,
    counted: Mutex<HashMap<IpAddr, Counted>>,
    watching: Mutex<Watching>,
    /// The node set [`Self::prepare`] last watched.
    prepared: Mutex<Option<NodeSet>>,
    view: RwLock<Arc<EncryptionView>>,
}

impl std::fmt::Debug for EncryptionMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptionMonitor")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl EncryptionMonitor {
    #[must_use]
    pub fn new(
        settings: EncryptionSettings,
        local: Option<String>,
        datapath: DatapathHandle,
        hook: TcHook,
        endpoint_iface: String,
        families: Families,
    ) -> Self {
        Self {
            settings,
            families,
            local,
            datapath,
            hook,
            endpoint_iface,
            counted: Mutex::default(),
            watching: Mutex::new(Watching {
                placed: Placement::new(),
                attachments: None,
                unwatched: Vec::new(),
            }),
            prepared: Mutex::default(),
            view: RwLock::default(),
        }
    }

    /// The last judgement.
    #[must_use]
    pub fn view(&self) -> Arc<EncryptionView> {
        self.view
            .read()
            .map_or_else(|p| p.into_inner().clone(), |v| v.clone())
    }

    fn pin_dir(&self) -> PathBuf {
        self.datapath.pin_dir().to_path_buf()
    }

    /// Before a round: the addresses of `nodes` watched and the counting
    /// programs in place, so that the round's own probes are counted
    /// (cheap when nothing changed since the last round).
    pub fn prepare(&self, nodes: &NodeSet) {
        let placed = self.watching.lock().is_ok_and(|w| w.attachments.is_some());
        let same = self
            .prepared
            .lock()
            .is_ok_and(|p| p.as_ref() == Some(nodes));
        if placed && same {
            return;
        }
        let peers: Vec<&Node> = self.peers(nodes);
        let wanted: BTreeSet<IpAddr> = peers
            .iter()
            .flat_map(|n| addresses(n, self.families))
            .collect();
        let dir = self.pin_dir();
        let present = encrypt_watch::counts(&dir).ok();
        if let Err(e) =
            encrypt_watch::set_watched(&dir, present.as_ref().unwrap_or(&BTreeMap::new()), &wanted)
        {
            warn!(
                "updating the encryption check's watched addresses: {}",
                chain(&e)
            );
        }
        if let Some(present) = &present {
            prime(
                &mut self.counted.lock().unwrap_or_else(PoisonError::into_inner),
                present,
                &wanted,
            );
        }
        if let Ok((links, devices)) = wireguard::read()
            && let Ok(dev) = choose(self.settings.encryption_device.as_deref(), &devices)
        {
            self.place(&links, dev);
            // Routes go into the device from the first sync on.
            if let Ok(mut v) = self.view.write()
                && v.device.is_none()
            {
                *v = Arc::new(EncryptionView {
                    device: Some(dev.name.clone()),
                    ..EncryptionView::default()
                });
            }
        }
        if let Ok(mut p) = self.prepared.lock() {
            *p = Some(nodes.clone());
        }
    }

    /// The WireGuard device health addresses are routed into: the one
    /// asked for, or the node's only one (read now: blocking). Never one
    /// chosen by what the node records say: `None` on a node without one,
    /// or with several and none named (routed as without encryption; the
    /// encryption view says why); why none is known when the devices
    /// cannot be read now (the routes then stay as they are).
    pub fn device(&self) -> Result<Option<String>, String> {
        if let Some(name) = &self.settings.encryption_device {
            return Ok(Some(name.clone()));
        }
        let (_, devices) = wireguard::read().map_err(|e| chain(&e))?;
        Ok(choose(None, &devices).ok().map(|d| d.name.clone()))
    }

    fn peers<'a>(&self, nodes: &'a NodeSet) -> Vec<&'a Node> {
        nodes
            .iter()
            .filter(|n| Some(n.name.as_str()) != self.local.as_deref())
            .collect()
    }

    /// Judges every address of `nodes` (but this node's) after a round.
    pub fn evaluate(&self, nodes: &NodeSet) {
        let peers: Vec<&Node> = self.peers(nodes);
        let wanted: BTreeSet<IpAddr> = peers
            .iter()
            .flat_map(|n| addresses(n, self.families))
            .collect();
        let seen = self.count(&wanted);
        let named = self.settings.encryption_device.as_deref();
        let view = match wireguard::read() {
            Ok((links, devices)) => match choose(named, &devices) {
                Ok(dev) => {
                    let unwatched = self.place(&links, dev);
                    judged(
                        dev,
                        &peers,
                        self.families,
                        &seen,
                        self.settings.stale_after(),
                        &unwatched,
                    )
                }
                Err(why) => unknown(&wanted, why),
            },
            Err(e) => unknown(&wanted, chain(&e)),
        };
        self.report(&view);
        if let Ok(mut v) = self.view.write() {
            *v = Arc::new(view);
        }
    }

    /// Reads the counters, keeps the watched addresses to `wanted`, and
    /// returns each address's probes over the window.
    fn count(&self, wanted: &BTreeSet<IpAddr>) -> HashMap<IpAddr, Seen> {
        let dir = self.pin_dir();
        let present = encrypt_watch::counts(&dir)
            .inspect_err(|e| warn!("reading the encryption check's counters: {}", chain(e)))
            .ok();
        if let Some(present) = &present
            && let Err(e) = encrypt_watch::set_watched(&dir, present, wanted)
        {
            warn!(
                "updating the encryption check's watched addresses: {}",
                chain(&e)
            );
        }
        let mut counted = self.counted.lock().unwrap_or_else(PoisonError::into_inner);
        tally(&mut counted, wanted, present.as_ref())
    }

    /// The counting programs on the device's egress and on that of every
    /// other Ethernet interface with an address of the node (where its
    /// traffic can leave; not the veths of pods or containers), made
    /// again whenever that set changes. Returns the addressed interfaces
    /// left unwatched ([`unwatched`]), warned of when they change.
    fn place(&self, links: &[LinkSummary], dev: &WgDevice) -> Vec<String> {
        let unwatched = unwatched(links, dev);
        let mut w = self.watching.lock().unwrap_or_else(PoisonError::into_inner);
        if w.unwatched != unwatched {
            if !unwatched.is_empty() {
                warn!(
                    interfaces = %unwatched.join(", "),
                    "encryption check: probes leaving through these interfaces (not Ethernet) are \
                     not counted; a path through one reads unobserved"
                );
            }
            w.unwatched.clone_from(&unwatched);
        }
        drop(w);
        self.attach_counters(links, dev);
        unwatched
    }

    fn attach_counters(&self, links: &[LinkSummary], dev: &WgDevice) {
        let wanted: Placement = links
            .iter()
            .filter_map(|l| {
                if l.index == dev.index {
                    Some((l.name.clone(), l.index, true))
                } else if l.ethernet
                    && l.addressed
                    && !l.is_wireguard()
                    && l.name != self.endpoint_iface
                {
                    Some((l.name.clone(), l.index, false))
                } else {
                    None
                }
            })
            .collect();
        let mut w = self.watching.lock().unwrap_or_else(PoisonError::into_inner);
        if w.placed == wanted && w.attachments.is_some() {
            return;
        }
        // Dropping the old set detaches its programs.
        w.attachments = None;
        let set = self.datapath.attachments();
        let mut failed = Vec::new();
        for (name, _, tunnel) in &wanted {
            if let Err(e) =
                set.attach_watch(&Interface::new(name.clone(), None), *tunnel, self.hook)
            {
                failed.push(format!("{name}: {}", chain(&e)));
            }
        }
        if failed.is_empty() {
            info!(
                device = %dev.name,
                interfaces = wanted.len(),
                "probe counters attached for the encryption check"
            );
        } else {
            warn!(
                "probe counters not attached to {} interfaces (retried next round); first: {}",
                failed.len(),
                failed[0]
            );
        }
        w.attachments = Some(set);
        w.placed = if failed.is_empty() {
            wanted
        } else {
            Placement::new()
        };
    }

    /// Logs the counts when they change.
    fn report(&self, view: &EncryptionView) {
        let problems = view.paths.values().filter(|p| p.state.is_problem()).count();
        let before = self.view();
        let before_problems = before
            .paths
            .values()
            .filter(|p| p.state.is_problem())
            .count();
        if problems != before_problems || view.error != before.error {
            let counts: Vec<String> = view
                .counts()
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .map(|(s, n)| format!("{n} {s}"))
                .collect();
            match &view.error {
                Some(e) => warn!("encryption check: {e}"),
                None if problems > 0 => warn!(
                    "encryption check: {} (status names the paths)",
                    counts.join(", ")
                ),
                None => info!("encryption check: {}", counts.join(", ")),
            }
        }
    }
}

/// The interfaces of the node that hold an address and are up, but that
/// the counting programs do not watch: not Ethernet (a tun device, an IP
/// tunnel), neither the device nor another WireGuard device, nor the
/// loopback. Sorted by name.
fn unwatched(links: &[LinkSummary], dev: &WgDevice) -> Vec<String> {
    let mut names: Vec<String> = links
        .iter()
        .filter(|l| {
            l.addressed
                && l.up
                && !l.ethernet
                && l.index != dev.index
                && !l.is_wireguard()
                && l.name != "lo"
        })
        .map(|l| l.name.clone())
        .collect();
    names.sort_unstable();
    names
}

/// The address families this agent probes its peers in: those its
/// endpoint has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Families {
    pub ipv4: bool,
    pub ipv6: bool,
}

/// A node's own and health addresses in the families this agent probes
/// it in: only those are judged, so a family it never probes (its
/// endpoint has none, or the node lacks its node or health address in
/// it) raises no `not_covered`.
fn addresses(n: &Node, families: Families) -> impl Iterator<Item = IpAddr> {
    probed_pairs(n, families).flat_map(|(node, health)| [node, health])
}

/// Each probed family's (node, health) addresses of `n`, IPv4 first.
fn probed_pairs(n: &Node, families: Families) -> impl Iterator<Item = (IpAddr, IpAddr)> {
    let v4 = n
        .node_ip
        .zip(n.health_ip)
        .filter(|_| families.ipv4)
        .map(|(a, b)| (IpAddr::V4(a), IpAddr::V4(b)));
    let v6 = n
        .node_ip6
        .zip(n.health_ip6)
        .filter(|_| families.ipv6)
        .map(|(a, b)| (IpAddr::V6(a), IpAddr::V6(b)));
    v4.into_iter().chain(v6)
}

fn judged(
    dev: &WgDevice,
    peers: &[&Node],
    families: Families,
    seen: &HashMap<IpAddr, Seen>,
    stale_after: std::time::Duration,
    unwatched: &[String],
) -> EncryptionView {
    let coverage = Coverage::of(dev);
    let cx = Context {
        device: dev,
        coverage: &coverage,
        now: SystemTime::now(),
        stale_after,
        unwatched,
    };
    let mut paths = HashMap::new();
    for n in peers {
        for (node, health) in probed_pairs(n, families) {
            let expected = coverage.peer(node);
            for ip in [node, health] {
                let s = seen.get(&ip).copied().unwrap_or_default();
                paths.insert(ip, judge(cx, ip, expected, s));
            }
        }
    }
    EncryptionView {
        device: Some(dev.name.clone()),
        error: None,
        paths,
    }
}

fn unknown(wanted: &BTreeSet<IpAddr>, why: String) -> EncryptionView {
    EncryptionView {
        device: None,
        paths: wanted
            .iter()
            .map(|ip| {
                (
                    *ip,
                    PathEncryption {
                        state: EncState::Unknown,
                        peer: None,
                        reason: Some(why.clone()),
                    },
                )
            })
            .collect(),
        error: Some(why),
    }
}

/// The device `named`, or without a name the node's only one: which of
/// several devices the health routes go into is the operator's choice,
/// never one the node records' addresses could make. Why there is none,
/// otherwise.
fn choose<'a>(named: Option<&str>, devices: &'a [WgDevice]) -> Result<&'a WgDevice, String> {
    if let Some(name) = named {
        return devices
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| format!("no WireGuard device {name:?} on this node"));
    }
    match devices {
        [] => Err("no WireGuard device on this node".to_owned()),
        [only] => Ok(only),
        several => Err(format!(
            "{} WireGuard devices on this node ({}): name the one the cluster's traffic uses with --encryption-device",
            several.len(),
            several
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dual-stack peer judged by an agent probing IPv4 only, through a
    /// device whose AllowedIPs are IPv4: its IPv6 addresses, never probed,
    /// are not judged (before, they read `not_covered`); an agent probing
    /// both judges a peer's IPv6 only where it has both its addresses.
    #[test]
    fn only_the_families_probed_are_judged() {
        let dev = WgDevice {
            name: "wg0".into(),
            index: 4,
            peers: vec![wireguard::WgPeer {
                public_key: "BBBBBBBBkey".into(),
                endpoint: None,
                allowed_ips: vec!["198.18.0.0/15".parse().expect("net")],
                last_handshake: None,
                tx_bytes: 0,
                rx_bytes: 0,
            }],
        };
        let mut n = Node::v4(
            "b",
            std::net::Ipv4Addr::new(198, 18, 0, 2),
            std::net::Ipv4Addr::new(198, 18, 64, 2),
        );
        n.node_ip6 = Some("2001:2::2".parse().expect("ip"));
        n.health_ip6 = Some("2001:2:0:40::2".parse().expect("ip"));
        let v4_only = Families {
            ipv4: true,
            ipv6: false,
        };
        let view = judged(&dev, &[&n], v4_only, &HashMap::new(), WINDOW_STALE, &[]);
        assert_eq!(view.paths.len(), 2, "{:?}", view.paths.keys());
        assert!(view.paths.keys().all(IpAddr::is_ipv4));
        let dual = Families {
            ipv4: true,
            ipv6: true,
        };
        let view = judged(&dev, &[&n], dual, &HashMap::new(), WINDOW_STALE, &[]);
        assert_eq!(view.paths.len(), 4);
        // No health address of IPv6: its node's IPv6 is not probed either.
        n.health_ip6 = None;
        let view = judged(&dev, &[&n], dual, &HashMap::new(), WINDOW_STALE, &[]);
        assert_eq!(view.paths.len(), 2);
        assert_eq!(addresses(&n, dual).count(), 2);
    }

    const WINDOW_STALE: std::time::Duration = std::time::Duration::from_secs(180);

    /// A kept entry's lifetime counts are not one round's; a failed read
    /// counts nothing and the next good one counts from the last good one.
    #[test]
    fn counts_start_from_the_first_reading_and_skip_failed_reads() {
        let ip: IpAddr = "198.18.1.12".parse().expect("ip");
        let wanted: BTreeSet<IpAddr> = [ip].into_iter().collect();
        let reading = |plain| BTreeMap::from([(ip, WatchCounts { tunnel: 0, plain })]);
        let mut counted = HashMap::new();
        // Kept from before a restart: 500 packets in plain text long ago.
        prime(&mut counted, &reading(500), &wanted);
        let seen = tally(&mut counted, &wanted, Some(&reading(500)));
        assert_eq!(seen[&ip].plain, 0, "nothing this round");
        let seen = tally(&mut counted, &wanted, None);
        assert_eq!(seen[&ip].plain, 0, "a failed read counts nothing");
        let seen = tally(&mut counted, &wanted, Some(&reading(502)));
        assert_eq!(seen[&ip].plain, 2, "counted from the last good reading");
        // Not primed: its first reading is where it starts.
        let other: IpAddr = "198.18.1.13".parse().expect("ip");
        let both: BTreeSet<IpAddr> = [ip, other].into_iter().collect();
        let mut kept = reading(502);
        kept.insert(
            other,
            WatchCounts {
                tunnel: 0,
                plain: 900,
            },
        );
        let seen = tally(&mut counted, &both, Some(&kept));
        assert_eq!(seen[&other].plain, 0, "not its lifetime's 900");
        kept.insert(
            other,
            WatchCounts {
                tunnel: 0,
                plain: 901,
            },
        );
        let seen = tally(&mut counted, &both, Some(&kept));
        assert_eq!(seen[&other].plain, 1);
        // Priming again leaves a watched address as it is.
        prime(&mut counted, &reading(0), &wanted);
        for _ in 0..WINDOW {
            tally(&mut counted, &wanted, Some(&reading(502)));
        }
        let seen = tally(&mut counted, &wanted, Some(&reading(505)));
        assert_eq!(seen[&ip].plain, 3, "from 502, not from the priming's 0");
    }

    /// The device is the one named, or the only one: with several and
    /// none named there is none, whatever the node records' addresses
    /// (which would otherwise pick the device every health route goes
    /// into).
    #[test]
    fn the_device_is_named_or_the_only_one_never_chosen_by_records() {
        let dev = |name: &str, index| WgDevice {
            name: name.to_owned(),
            index,
            peers: Vec::new(),
        };
        let (wg0, vpn) = (dev("wg0", 4), dev("vpn", 9));
        assert_eq!(
            choose(None, std::slice::from_ref(&wg0)).map(|d| d.index),
            Ok(4)
        );
        let both = [wg0, vpn];
        assert_eq!(choose(Some("vpn"), &both).map(|d| d.index), Ok(9));
        assert_eq!(
            choose(Some("wg1"), &both).map(|d| d.index),
            Err("no WireGuard device \"wg1\" on this node".to_owned())
        );
        let why = choose(None, &both)
            .map(|d| d.index)
            .expect_err("none chosen");
        assert!(
            why.contains("2 WireGuard devices on this node (wg0, vpn)")
                && why.contains("--encryption-device"),
            "{why}"
        );
        assert_eq!(
            choose(None, &[]).map(|d| d.index),
            Err("no WireGuard device on this node".to_owned())
        );
    }

    #[test]
    fn counts_are_judged_over_the_last_rounds_only() {
        let mut c = Counted::default();
        let at = |tunnel, plain| WatchCounts { tunnel, plain };
        c.push(at(4, 0));
        c.push(at(8, 1));
        assert_eq!(
            c.seen(),
            Seen {
                tunnel: 8,
                plain: 1
            }
        );
        c.push(at(12, 1));
        c.push(at(16, 1));
        assert_eq!(
            c.seen(),
            Seen {
                tunnel: 12,
                plain: 1
            }
        );
        c.push(at(20, 1));
        assert_eq!(
            c.seen(),
            Seen {
                tunnel: 12,
                plain: 0
            },
            "the plain one left the window"
        );
        // A counter made again starts from zero.
        c.push(at(2, 0));
        assert_eq!(
            c.seen(),
            Seen {
                tunnel: 10,
                plain: 0
            }
        );
    }

    /// Addressed interfaces that are up and not Ethernet are named, but
    /// neither the device, another WireGuard device, nor the loopback;
    /// Ethernet ones and those without an address are not.
    #[test]
    fn the_addressed_interfaces_not_watched_are_named() {
        use crate::sys::netlink::LinkSummary;
        let link = |index, name: &str, kind: Option<&str>, ethernet, addressed| LinkSummary {
            index,
            name: name.to_owned(),
            kind: kind.map(str::to_owned),
            ethernet,
            up: true,
            addressed,
        };
        let mut down = link(8, "tun1", Some("tun"), false, true);
        down.up = false;
        let links = [
            link(1, "lo", None, false, true),
            link(2, "eth0", None, true, true),
            link(3, "veth-pod", Some("veth"), true, false),
            link(4, "wg0", Some("wireguard"), false, true),
            link(5, "wg1", Some("wireguard"), false, true),
            link(6, "tun0", Some("tun"), false, true),
            link(7, "ipip0", Some("ipip"), false, true),
            down,
            link(9, "sit0", Some("sit"), false, false),
        ];
        let dev = WgDevice {
            name: "wg0".into(),
            index: 4,
            peers: Vec::new(),
        };
        assert_eq!(unwatched(&links, &dev), ["ipip0", "tun0"]);
    }
}
