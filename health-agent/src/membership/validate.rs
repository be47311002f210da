//! Node records are untrusted (anyone who can write the nodes file or put a
//! key under the etcd prefix writes them): every record, from either
//! source, is checked here, one by one. A bad record is rejected with an
//! error naming it and the rule it breaks; the others make the set.
//!
//! The rules:
//!
//! - the name is non-empty, at most [`MAX_NAME_LEN`] bytes, of letters,
//!   digits, `.`, `_` and `-`, and starts with a letter or a digit; in etcd
//!   it is the last segment of the record's key;
//! - a record has a node and a health address in at least one family, and
//!   each family it has comes with both;
//! - no address is unspecified (`0.0.0.0/8`, `::`), loopback, link-local
//!   (`169.254.0.0/16`, `fe80::/10`), multicast, the limited broadcast
//!   address, otherwise reserved (`240.0.0.0/4`) or an IPv4-mapped IPv6
//!   address;
//! - a peer's addresses are not inside this node's own health CIDR (this
//!   node's own record is exempt: its endpoint's address is in it);
//! - with etcd and `--kvstore-allocations`, a peer's health addresses lie
//!   in the CIDRs allocated to its node, and its node addresses outside
//!   the health range and every allocated CIDR, are the ones its
//!   allocation names where it names one, and none that another node's
//!   names ([`super::allocations`]);
//! - names are unique and so are addresses: no address is the node IP or
//!   the health IP of two records, or both of one.
//!
//! When two records conflict the first (in file order, or etcd key order)
//! is kept and the later one is rejected, naming the first; this node's own
//! record is taken first wherever it is, so that no other record can push
//! it out. Uniqueness is checked with hash maps: one pass, O(N).

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use super::{
    Node, NodeSet,
    allocations::Allocations,
    claims::Holders,
    record::{Candidate, Field, LocalNode, MAX_NAME_LEN, Origin, Rejected, Rule, Validated},
};

/// What is wrong with `ip` as a node's address, if anything.
#[must_use]
pub fn address_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => address_class4(ip),
        IpAddr::V6(ip) => address_class6(ip),
    }
}

/// What is wrong with an IPv6 address as a node's address, if anything.
fn address_class6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_unspecified() {
        Some("unspecified (::)")
    } else if ip.is_loopback() {
        Some("loopback (::1)")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local (fe80::/10)")
    } else if ip.is_multicast() {
        Some("multicast (ff00::/8)")
    } else if ip.to_ipv4_mapped().is_some() {
        Some("IPv4-mapped (::ffff:0:0/96)")
    } else {
        None
    }
}

/// What is wrong with an IPv4 address as a node's address, if anything.
fn address_class4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if a == 0 {
        Some("unspecified (0.0.0.0/8)")
    } else if ip.is_loopback() {
        Some("loopback (127.0.0.0/8)")
    } else if a == 169 && b == 254 {
        Some("link-local (169.254.0.0/16)")
    } else if ip.is_multicast() {
        Some("multicast (224.0.0.0/4)")
    } else if ip.is_broadcast() {
        Some("the limited broadcast address")
    } else if a >= 240 {
        Some("reserved (240.0.0.0/4)")
    } else {
        None
    }
}

/// Longest zone name (a DNS label's length).
pub const MAX_ZONE_LEN: usize = 63;

/// A zone name: 1 to [`MAX_ZONE_LEN`] letters, digits, '.', '_' or '-'.
pub fn zone(z: &str) -> Result<&str, String> {
    if z.is_empty() {
        return Err("a zone name is not empty".into());
    }
    if z.len() > MAX_ZONE_LEN {
        return Err(format!("{} bytes, more than {MAX_ZONE_LEN}", z.len()));
    }
    if !z
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("only letters, digits, '.', '_' and '-'".into());
    }
    Ok(z)
}

/// Checks a name alone.
pub(crate) fn check_name(name: &str) -> Result<(), Rule> {
    if name.is_empty() {
        return Err(Rule::EmptyName);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Rule::NameTooLong { len: name.len() });
    }
    let first_ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric());
    if !first_ok
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(Rule::NameCharset {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// Whether `node` is where a record of its name counts: an etcd record at
/// exactly the prefix and the name (no deeper key, no other name); a
/// file's anywhere.
fn at_its_key(node: &Node, origin: &Origin) -> bool {
    match origin {
        Origin::Etcd { key, prefix_len } => key.get(*prefix_len..) == Some(node.name.as_str()),
        Origin::File { .. } => true,
    }
}

/// Checks a record alone (everything but uniqueness).
fn check_record(
    node: &Node,
    origin: &Origin,
    is_local: bool,
    (local, allocations): (&LocalNode, Option<&Allocations>),
) -> Result<(), Rule> {
    check_shape(node, origin)?;
    if is_local {
        return Ok(());
    }
    check_ranges(node, local)?;
    if let Some(allocations) = allocations {
        allocations.check(node)?;
    }
    let fields = fields(node);
    for (field, ip) in fields.iter().flatten().copied() {
        let inside = match ip {
            IpAddr::V4(v4) => local
                .health_cidr
                .filter(|c| c.contains(&v4))
                .map(|c| c.to_string()),
            IpAddr::V6(v6) => local
                .health_cidr6
                .filter(|c| c.contains(&v6))
                .map(|c| c.to_string()),
        };
        if let Some(cidr) = inside {
            return Err(Rule::InLocalCidr { field, ip, cidr });
        }
    }
    Ok(())
}

/// The checks of a record that need nothing but the record: its name,
/// zone, key, families and address classes. A record failing them can
/// never be a node, whatever this node's settings.
pub(super) fn check_shape(node: &Node, origin: &Origin) -> Result<(), Rule> {
    check_name(&node.name)?;
    if let Some(z) = &node.zone {
        zone(z).map_err(|reason| Rule::Zone {
            // A writer's bytes, shown in part.
            zone: z.chars().take(MAX_ZONE_LEN).collect(),
            reason,
        })?;
    }
    if let Origin::Etcd { key, prefix_len } = origin
        && !at_its_key(node, origin)
    {
        let prefix = key.get(..*prefix_len).unwrap_or_default();
        return Err(Rule::KeyNotExact {
            name: node.name.clone(),
            expected: format!("{prefix}{}", node.name),
        });
    }
    let fields = fields(node);
    check_families(node)?;
    for (field, ip) in fields.iter().flatten().copied() {
        if let Some(class) = address_class(ip) {
            return Err(Rule::Address { field, ip, class });
        }
    }
    for (node_ip, health_ip) in [(fields[0], fields[1]), (fields[2], fields[3])] {
        if let (Some((node, ip)), Some((health, health_ip))) = (node_ip, health_ip)
            && ip == health_ip
        {
            return Err(Rule::SameAddresses { node, health, ip });
        }
    }
    Ok(())
}

/// A peer's health addresses lie inside the cluster's health range of their
/// family (where one is given): routes are made to them.
fn check_ranges(node: &Node, local: &LocalNode) -> Result<(), Rule> {
    let outside = |field, ip: IpAddr, range: String, flag| {
        Err(Rule::OutsideRange {
            field,
            ip,
            range,
            flag,
        })
    };
    if let (Some(ip), Some(range)) = (node.health_ip, local.health_range)
        && !range.contains(&ip)
    {
        return outside(
            Field::HealthIp,
            ip.into(),
            range.to_string(),
            "--health-range",
        );
    }
    if let (Some(ip), Some(range)) = (node.health_ip6, local.health_range6)
        && !range.contains(&ip)
    {
        return outside(
            Field::HealthIp6,
            ip.into(),
            range.to_string(),
            "--health-range6",
        );
    }
    Ok(())
}

/// A record's four address fields, those it has.
fn fields(node: &Node) -> [Option<(Field, IpAddr)>; 4] {
    [
        node.node_ip.map(|ip| (Field::NodeIp, IpAddr::V4(ip))),
        node.health_ip.map(|ip| (Field::HealthIp, IpAddr::V4(ip))),
        node.node_ip6.map(|ip| (Field::NodeIp6, IpAddr::V6(ip))),
        node.health_ip6.map(|ip| (Field::HealthIp6, IpAddr::V6(ip))),
    ]
}

/// At least one family, each with both addresses.
fn check_families(node: &Node) -> Result<(), Rule> {
    let half = |has: Field, missing: Field| Err(Rule::HalfFamily { has, missing });
    match (node.node_ip.is_some(), node.health_ip.is_some()) {
        (true, false) => return half(Field::NodeIp, Field::HealthIp),
        (false, true) => return half(Field::HealthIp, Field::NodeIp),
        _ => {}
    }
    match (node.node_ip6.is_some(), node.health_ip6.is_some()) {
        (true, false) => return half(Field::NodeIp6, Field::HealthIp6),
        (false, true) => return half(Field::HealthIp6, Field::NodeIp6),
        _ => {}
    }
    if node.node_ip.is_none() && node.node_ip6.is_none() {
        return Err(Rule::NoAddress);
    }
    Ok(())
}

/// Checks every candidate: the good ones make the set, the others are
/// rejected, each with its rule. An address two records claim goes to the
/// one that holds it in `holders` (the last good set); when neither holds
/// it, neither takes it. This node's own record is taken first.
#[must_use]
pub fn validate(candidates: Vec<Candidate>, local: &LocalNode, holders: &Holders) -> Validated {
    validate_allocated(candidates, (local, None), holders)
}

/// [`validate`], where a peer's addresses must also agree with its node's
/// allocation when `allocations` are given (`--kvstore-allocations`): a
/// record that does not claims nothing, and a claim the allocations back
/// outranks another node's hold on the address.
#[must_use]
pub fn validate_allocated(
    candidates: Vec<Candidate>,
    (local, allocations): (&LocalNode, Option<&Allocations>),
    holders: &Holders,
) -> Validated {
    let n = candidates.len();
    // This node's record: a copy of it at another key (which sorts
    // first) is rejected as any misplaced record, and takes nothing from it.
    let local_at = local.name.as_deref().and_then(|me| {
        candidates.iter().position(|c| {
            c.node
                .as_ref()
                .is_ok_and(|node| node.name == me && at_its_key(node, &c.record.origin))
        })
    });
    let mut verdict: Vec<Option<Rule>> = vec![None; n];
    let names = check_alone(&candidates, (local, allocations), local_at, &mut verdict);
    check_claims(
        &candidates,
        (local_at, allocations),
        &names,
        holders,
        &mut verdict,
    );
    let mut rejected = Vec::new();
    let order = local_at
        .into_iter()
        .chain((0..n).filter(|i| Some(*i) != local_at));
    for i in order {
        if let Some(rule) = &verdict[i] {
            rejected.push(Rejected {
                record: candidates[i].record.clone(),
                rule: rule.clone(),
            });
        }
    }
    let nodes = candidates
        .into_iter()
        .zip(verdict)
        .filter_map(|(c, v)| v.is_none().then_some(c.node.ok()).flatten())
        .collect();
    Validated {
        nodes: NodeSet::from_unique(nodes),
        rejected,
        unheld: 0,
    }
}

/// Checks each record alone and the names' uniqueness (the first good
/// record of a name keeps it, this node's own first): the verdict of each
/// record, and the index of the first record of each name at its own key
/// (good or not).
fn check_alone<'a>(
    candidates: &'a [Candidate],
    rules: (&LocalNode, Option<&Allocations>),
    local_at: Option<usize>,
    verdict: &mut [Option<Rule>],
) -> HashMap<&'a str, usize> {
    let n = candidates.len();
    let order = local_at
        .into_iter()
        .chain((0..n).filter(|i| Some(*i) != local_at));
    let mut named: HashMap<&str, usize> = HashMap::with_capacity(n);
    let mut valid: HashMap<&str, usize> = HashMap::with_capacity(n);
    for i in order {
        let c = &candidates[i];
        let node = match &c.node {
            Err(detail) => {
                verdict[i] = Some(Rule::Malformed(detail.clone()));
                continue;
            }
            Ok(node) => node,
        };
        // Only a record at its own key names its node: a copy elsewhere
        // (refused) would otherwise keep a name's claims for it.
        if at_its_key(node, &c.record.origin) {
            named.entry(node.name.as_str()).or_insert(i);
        }
        if let Err(rule) = check_record(node, &c.record.origin, Some(i) == local_at, rules) {
            verdict[i] = Some(rule);
        } else if let Some(&first) = valid.get(node.name.as_str()) {
            verdict[i] = Some(Rule::DuplicateName {
                name: node.name.clone(),
                first: Box::new(candidates[first].record.clone()),
            });
        } else {
            valid.insert(node.name.as_str(), i);
        }
    }
    named
}

/// Decides every address claimed by records that passed alone: one
/// claimant takes it unless another node holds it; of several, this node
/// or the holder takes it, or none does. With allocations, the one
/// claimant they give the address to takes it after this node and before
/// the holder.
fn check_claims(
    candidates: &[Candidate],
    (local_at, allocations): (Option<usize>, Option<&Allocations>),
    names: &HashMap<&str, usize>,
    holders: &Holders,
    verdict: &mut [Option<Rule>],
) {
    // The holders' clock: tokio's, which is the system's but in tests
    // whose time is paused.
    let now = tokio::time::Instant::now().into_std();
    let mut claims: HashMap<IpAddr, Vec<(usize, Field)>> =
        HashMap::with_capacity(2 * candidates.len());
    for (i, c) in candidates.iter().enumerate() {
        if let (None, Ok(node)) = (&verdict[i], &c.node) {
            for (field, ip) in fields(node).into_iter().flatten() {
                claims.entry(ip).or_default().push((i, field));
            }
        }
    }
    let name_of = |i: usize| candidates[i].node.as_ref().map(|n| n.name.as_str()).ok();
    let mut lost: Vec<(usize, Rule)> = Vec::new();
    for (ip, claimants) in &claims {
        // The one claimant the allocations give the address to outranks
        // any hold: it wins before the holder is asked.
        let backed = allocations.and_then(|a| {
            let mut backed = claimants
                .iter()
                .filter(|(i, field)| name_of(*i).is_some_and(|n| a.backs(n, *field, *ip)));
            match (backed.next(), backed.next()) {
                (Some(one), None) => Some(one),
                _ => None,
            }
        });
        let holder = holders.holder(*ip, now).filter(|(name, lasts)| {
            // A holder still in the update keeps the address while its
            // record claims it (or is refused), and when its hold outlasts
            // the record's claim (etcd, where every hold lasts: a record
            // moved away from the address holds it as one departing; so
            // the claim and the refusal count for the nodes file alone);
            // one without a record, only when its hold outlasts the
            // record.
            match names.get(name) {
                Some(&at) => {
                    *lasts || verdict[at].is_some() || claimants.iter().any(|(i, _)| *i == at)
                }
                None => *lasts,
            }
        });
        let winner = claimants
            .iter()
            .find(|(i, _)| Some(*i) == local_at)
            .or(backed)
            .or_else(|| {
                holder.and_then(|(h, _)| claimants.iter().find(|(i, _)| name_of(*i) == Some(h)))
            })
            .copied();
        match (winner, holder) {
            (Some((w, wf)), _) => lost.extend(claimants.iter().filter(|(i, _)| *i != w).map(
                |&(i, field)| {
                    (
                        i,
                        Rule::DuplicateAddress {
                            field,
                            ip: *ip,
                            first: Box::new(candidates[w].record.clone()),
                            first_field: wf,
                        },
                    )
                },
            )),
            (None, Some((h, _))) => lost.extend(claimants.iter().map(|&(i, field)| {
                (
                    i,
                    Rule::Held {
                        field,
                        ip: *ip,
                        holder: h.to_owned(),
                    },
                )
            })),
            (None, None) if claimants.len() > 1 => {
                lost.extend(claimants.iter().enumerate().map(|(k, &(i, field))| {
                    let (o, other_field) = claimants[usize::from(k == 0)];
                    (
                        i,
                        Rule::Contested {
                            field,
                            ip: *ip,
                            other: Box::new(candidates[o].record.clone()),
                            other_field,
                        },
                    )
                }));
            }
            (None, None) => {}
        }
    }
    // One rule per record: the first address it lost, in field order.
    lost.sort_by_key(|(i, rule)| (*i, field_rank(rule)));
    for (i, rule) in lost {
        verdict[i].get_or_insert(rule);
    }
}

/// The order of a claim rule's field, so that a record names the same
/// address whatever order the claims were decided in.
fn field_rank(rule: &Rule) -> u8 {
    match rule {
        Rule::DuplicateAddress { field, .. }
        | Rule::Contested { field, .. }
        | Rule::Held { field, .. } => *field as u8,
        _ => u8::MAX,
    }
}

#[cfg(test)]
mod tests;
