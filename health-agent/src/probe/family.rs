//! Address families: which ones a node has, which ones this agent probes,
//! and the paths of a node per family (ICMP and HTTP to its node address
//! and to its health address: four per family, up to eight per node).

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use serde::{Deserialize, Serialize};

use crate::membership::Node;

/// An address family.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    #[default]
    Ipv4,
    Ipv6,
}

impl Family {
    /// Both, the primary (IPv4) first.
    pub const ALL: [Self; 2] = [Self::Ipv4, Self::Ipv6];

    /// The family of `ip`.
    #[must_use]
    pub const fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::Ipv4,
            IpAddr::V6(_) => Self::Ipv6,
        }
    }

    /// 0 for IPv4, 1 for IPv6.
    #[must_use]
    pub const fn index(self) -> usize {
        match self {
            Self::Ipv4 => 0,
            Self::Ipv6 => 1,
        }
    }

    /// `ipv4` or `ipv6`, as the JSON and the metrics name it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
        }
    }

    /// The unspecified address of the family.
    #[must_use]
    pub const fn unspecified(self) -> IpAddr {
        match self {
            Self::Ipv4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            Self::Ipv6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The families this agent's endpoint has, so the families it probes its
/// peers over: an IPv6-only agent does not probe peers' IPv4 addresses and
/// an IPv4-only one not their IPv6 addresses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Families {
    #[default]
    Ipv4,
    Ipv6,
    /// Both.
    Dual,
}

impl Families {
    /// The families of `ipv4` and `ipv6` together; `None` when neither.
    #[must_use]
    pub const fn from_flags(ipv4: bool, ipv6: bool) -> Option<Self> {
        match (ipv4, ipv6) {
            (true, true) => Some(Self::Dual),
            (true, false) => Some(Self::Ipv4),
            (false, true) => Some(Self::Ipv6),
            (false, false) => None,
        }
    }

    #[must_use]
    pub const fn contains(self, family: Family) -> bool {
        matches!(
            (self, family),
            (Self::Dual, _) | (Self::Ipv4, Family::Ipv4) | (Self::Ipv6, Family::Ipv6)
        )
    }
}

impl fmt::Display for Families {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
            Self::Dual => "dual",
        })
    }
}

/// A `--probe-families`-style value that is none of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown address families {0:?} (ipv4, ipv6, dual or ipv4,ipv6)")]
pub struct UnknownFamilies(pub String);

impl FromStr for Families {
    type Err = UnknownFamilies;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "ipv4" | "4" => Ok(Self::Ipv4),
            "ipv6" | "6" => Ok(Self::Ipv6),
            "dual" | "both" | "ipv4,ipv6" | "ipv6,ipv4" => Ok(Self::Dual),
            _ => Err(UnknownFamilies(s.to_owned())),
        }
    }
}

/// `node`'s node and health address in `family`, when it has both.
#[must_use]
pub fn addresses(node: &Node, family: Family) -> Option<(IpAddr, IpAddr)> {
    match family {
        Family::Ipv4 => Some((node.node_ip?.into(), node.health_ip?.into())),
        Family::Ipv6 => Some((node.node_ip6?.into(), node.health_ip6?.into())),
    }
}

/// The families (bit `Family::index`) in which `now` has other addresses
/// than `old`, the same node's earlier record: a family it had and has,
/// at another node or health address.
pub(super) fn moved(old: &Node, now: &Node) -> u8 {
    Family::ALL
        .into_iter()
        .filter(|&f| {
            matches!(
                (addresses(old, f), addresses(now, f)),
                (Some(a), Some(b)) if a != b
            )
        })
        .fold(0u8, |m, f| m | 1 << f.index())
}

/// The families a node is shown and probed in: the primary (the first of
/// the node's families this agent probes, IPv4 first) and the secondary
/// (the other one, when both are probed). When the node has no family this
/// agent probes, `primary` is the node's own primary family and `probed`
/// is false: its paths stay Unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown {
    pub primary: Family,
    pub secondary: Option<Family>,
    pub probed: bool,
}

impl Shown {
    /// How `node` is probed by an agent of `families`.
    #[must_use]
    pub fn of(node: &Node, families: Families) -> Self {
        let has = |f: Family| addresses(node, f).is_some();
        let mut probed = Family::ALL
            .into_iter()
            .filter(|f| families.contains(*f) && has(*f));
        match probed.next() {
            Some(primary) => Self {
                primary,
                secondary: probed.next(),
                probed: true,
            },
            None => Self {
                primary: Family::ALL
                    .into_iter()
                    .find(|f| has(*f))
                    .unwrap_or_default(),
                secondary: None,
                probed: false,
            },
        }
    }

    /// The probed families, primary first.
    pub fn probed(self) -> impl Iterator<Item = Family> {
        self.probed
            .then_some(self.primary)
            .into_iter()
            .chain(self.secondary)
    }

    /// The families shown, primary first.
    pub fn shown(self) -> impl Iterator<Item = Family> {
        std::iter::once(self.primary).chain(self.secondary)
    }
}

/// The four paths of a family, in this order; the path of family `f` and
/// kind `k` is at `4 * f.index() + k` among a node's eight.
pub const HOST_ICMP: usize = 0;
pub const HOST_HTTP: usize = 1;
pub const EP_ICMP: usize = 2;
pub const EP_HTTP: usize = 3;
/// Paths per family.
pub const PER_FAMILY: usize = 4;
/// Paths per node, at most.
pub const MAX_PATHS: usize = 2 * PER_FAMILY;

/// A node's path `kind` (`HOST_ICMP` .. `EP_HTTP`) in `family`, among its
/// eight.
#[must_use]
pub const fn path_index(family: Family, kind: usize) -> usize {
    family.index() * PER_FAMILY + kind
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dual() -> Node {
        Node {
            node_ip6: Some("2001:2:0:1::1".parse().expect("ip")),
            health_ip6: Some("2001:2:0:2::1".parse().expect("ip")),
            ..Node::v4(
                "n",
                Ipv4Addr::new(198, 18, 1, 1),
                Ipv4Addr::new(198, 18, 2, 1),
            )
        }
    }

    fn v6_only() -> Node {
        Node {
            node_ip: None,
            health_ip: None,
            ..dual()
        }
    }

    #[test]
    fn paths_per_family_follow_the_nodes_and_the_agents_families() {
        let v4 = Node::v4(
            "n",
            Ipv4Addr::new(198, 18, 1, 1),
            Ipv4Addr::new(198, 18, 2, 1),
        );
        let cases = [
            (&v4, Families::Ipv4, Family::Ipv4, None, true),
            (&v4, Families::Dual, Family::Ipv4, None, true),
            (&v4, Families::Ipv6, Family::Ipv4, None, false),
            (&dual(), Families::Ipv4, Family::Ipv4, None, true),
            (
                &dual(),
                Families::Dual,
                Family::Ipv4,
                Some(Family::Ipv6),
                true,
            ),
            (&dual(), Families::Ipv6, Family::Ipv6, None, true),
            (&v6_only(), Families::Dual, Family::Ipv6, None, true),
            (&v6_only(), Families::Ipv4, Family::Ipv6, None, false),
        ];
        for (node, families, primary, secondary, probed) in cases {
            let shown = Shown::of(node, families);
            assert_eq!(
                shown,
                Shown {
                    primary,
                    secondary,
                    probed
                },
                "{node} probed by a {families} agent"
            );
            let n = shown.probed().count();
            assert_eq!(n, usize::from(probed) + usize::from(secondary.is_some()));
        }
        assert_eq!(
            Shown::of(&dual(), Families::Dual)
                .probed()
                .collect::<Vec<_>>(),
            [Family::Ipv4, Family::Ipv6]
        );
        assert_eq!(
            addresses(&dual(), Family::Ipv6),
            Some((
                "2001:2:0:1::1".parse().expect("ip"),
                "2001:2:0:2::1".parse().expect("ip")
            ))
        );
        assert_eq!(addresses(&v6_only(), Family::Ipv4), None);
        assert_eq!(path_index(Family::Ipv6, EP_HTTP), 7);
    }

    #[test]
    fn families_parse_and_contain() {
        assert_eq!("ipv4,ipv6".parse(), Ok(Families::Dual));
        assert_eq!("IPv6".parse(), Ok(Families::Ipv6));
        assert!("ipx".parse::<Families>().is_err());
        assert!(Families::default().contains(Family::Ipv4));
        assert!(!Families::default().contains(Family::Ipv6));
        assert!(Families::Dual.contains(Family::Ipv6));
        assert_eq!(Families::from_flags(false, true), Some(Families::Ipv6));
        assert_eq!(Families::from_flags(false, false), None);
        assert_eq!(
            serde_json::to_string(&Family::Ipv6).expect("json"),
            "\"ipv6\""
        );
    }
}
