//! Masquerade on the node's uplink: SNAT of health traffic leaving the
//! node (egress) and the reverse translation of its replies and of the
//! ICMP errors about it (ingress), before the stack sees them. A flow that
//! cannot be translated is dropped, never sent with the endpoint's own
//! address. The later fragments of a datagram follow its first (see
//! [`fragments`]). IPv4 only: IPv6 (and anything else without an IPv4 NAT
//! key) passes untouched.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_NOEXIST, TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::classifier,
    programs::TcContext,
};
use health_common::{
    ct::{DIR_IN, DIR_OUT, Flow, IPPROTO_TCP, IPPROTO_UDP},
    flow,
    frame::Frame as _,
    headers::{EthHdr, Ipv4Hdr, ipv4_header_len, is_ipv4},
    nat::{
        self, ALLOC_RETRIES, NatConfig, NatCounter, NatEntry, NatKey,
        fragments::{self, FragEntry, FragKey, Fragment},
        quoted,
    },
};

use super::{
    maps::{NAT_CONFIG, NAT_FRAGS, NAT_MAP, NAT_STATS},
    packet::{self, FLOW_HEADERS},
};

/// Offsets of the IPv4 checksum, source and destination in the frame.
const IP_CSUM: usize = EthHdr::LEN + 10;
const IP_SRC: usize = EthHdr::LEN + 12;
const IP_DST: usize = EthHdr::LEN + 16;

/// Leaving the node: masquerade health sources.
#[classifier]
pub fn health_nat_egress(ctx: TcContext) -> i32 {
    let Some(cfg) = config() else {
        return TC_ACT_UNSPEC;
    };
    let Some((flow, first)) = ipv4_flow(&ctx, DIR_OUT) else {
        return later_fragment_out(&ctx, &cfg);
    };
    let Some((out, port)) = nat::out_key(&flow) else {
        passed_whole(first, &cfg);
        return TC_ACT_UNSPEC;
    };
    if cfg.node_flow_in_range(&out, port) {
        hold_for_node(&cfg, &out, port, flow.tcp_flags);
        return TC_ACT_UNSPEC;
    }
    if !cfg.masquerades(out.saddr, out.daddr) {
        return TC_ACT_UNSPEC;
    }
    if nat::answers_inbound(&flow) {
        // No flow of the endpoint's: its answer to a connection from
        // outside leaves as it is.
        passed_whole(first, &cfg);
        return TC_ACT_UNSPEC;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(xlate) = mapping(&cfg, &out, port, now) else {
        count(NatCounter::AllocFailures);
        return TC_ACT_SHOT;
    };
    let side = Side {
        addr_at: IP_SRC,
        port_at: usize::from(flow.l4) + nat::port_offset(flow.key.proto, true),
    };
    let done = rewrite(&ctx, &flow, &side, (out.saddr, cfg.node_ip), (port, xlate));
    remember(first, done, cfg.node_ip, now);
    verdict(done, NatCounter::Snat)
}

/// Arriving at the node: translate replies of masqueraded flows back, and
/// the ICMP errors about them.
#[classifier]
pub fn health_nat_ingress(ctx: TcContext) -> i32 {
    let Some(cfg) = config() else {
        return TC_ACT_UNSPEC;
    };
    let Some((flow, first)) = ipv4_flow(&ctx, DIR_IN) else {
        return later_fragment_in(&ctx, &cfg).unwrap_or_else(|| quoted_error(&ctx, &cfg));
    };
    let Some(key) = nat::arriving_key(&flow) else {
        return TC_ACT_UNSPEC;
    };
    if key.daddr != cfg.node_ip {
        return TC_ACT_UNSPEC;
    }
    let Some(e) = NAT_MAP.get_ptr_mut(&key) else {
        // The node's own traffic.
        return TC_ACT_UNSPEC;
    };
    // SAFETY: a valid map value pointer; the copy is taken before any
    // helper call that could invalidate it.
    let back = unsafe {
        (*e).last_ns = bpf_ktime_get_ns();
        *e
    };
    if nat::held_by_node(&key, &back) {
        // A reply to a flow of the node's own.
        return TC_ACT_UNSPEC;
    }
    let side = Side {
        addr_at: IP_DST,
        port_at: usize::from(flow.l4) + nat::port_offset(flow.key.proto, false),
    };
    let done = rewrite(
        &ctx,
        &flow,
        &side,
        (cfg.node_ip, back.xlate_addr),
        (key.dport, back.xlate_port),
    );
    remember(first, done, back.xlate_addr, back.last_ns);
    verdict(done, NatCounter::RevSnat)
}

/// Records the datagram of a first fragment translated to `xlate_addr` at
/// `now`, so that its later fragments follow it.
#[inline(always)]
fn remember(first: Option<FragKey>, done: Result<(), i64>, xlate_addr: [u8; 4], now: u64) {
    if let (Some(key), Ok(())) = (first, done) {
        // A full map evicts its oldest record: a datagram whose later
        // fragments come after that is lost, as after its lifetime.
        let _ = NAT_FRAGS.insert(&key, &FragEntry::new(xlate_addr, now), 0);
    }
}

/// A first fragment leaving that the masquerade covers but passes as it
/// is (an echo reply): recorded to its own source, so that its later
/// fragments pass with it.
#[inline(always)]
fn passed_whole(first: Option<FragKey>, cfg: &NatConfig) {
    if let Some(key) = first
        && fragments::translated_proto(key.proto)
        && cfg.masquerades(key.saddr, key.daddr)
    {
        // SAFETY: plain helper call.
        let now = unsafe { bpf_ktime_get_ns() };
        remember(first, Ok(()), key.saddr, now);
    }
}

/// The live record of `key`, copied out.
#[inline(always)]
fn record(key: &FragKey) -> Option<FragEntry> {
    // SAFETY: the value is copied out at once.
    let e = (unsafe { NAT_FRAGS.get(key) }).copied()?;
    // SAFETY: plain helper call.
    e.live(unsafe { bpf_ktime_get_ns() }).then_some(e)
}

/// A later fragment leaving: its source rewritten as its datagram's first
/// fragment's was (or left, when that one passed as it was); dropped when
/// masquerade covers it and its datagram has no live record. Anything
/// else passes.
#[inline(always)]
fn later_fragment_out(ctx: &TcContext, cfg: &NatConfig) -> i32 {
    let Some(ip) = later_fragment(ctx) else {
        return TC_ACT_UNSPEC;
    };
    if !fragments::translated_proto(ip.proto) || !cfg.masquerades(ip.src_addr, ip.dst_addr) {
        return TC_ACT_UNSPEC;
    }
    let Some(e) = record(&fragments::out_key(&ip)) else {
        count(NatCounter::FragDropped);
        return TC_ACT_SHOT;
    };
    if e.xlate_addr == ip.src_addr {
        // Its first passed as it was.
        return TC_ACT_UNSPEC;
    }
    verdict(
        rewrite_addr(ctx, IP_SRC, ip.src_addr, e.xlate_addr),
        NatCounter::FragSnat,
    )
}

/// A later fragment arriving at the node IP, of a datagram whose first
/// fragment was translated back: its destination rewritten the same way.
/// `None` when the packet is not a later fragment.
#[inline(always)]
fn later_fragment_in(ctx: &TcContext, cfg: &NatConfig) -> Option<i32> {
    let ip = later_fragment(ctx)?;
    if ip.dst_addr != cfg.node_ip || !fragments::translated_proto(ip.proto) {
        return Some(TC_ACT_UNSPEC);
    }
    let Some(e) = record(&fragments::in_key(&ip)) else {
        // The node's own datagram.
        return Some(TC_ACT_UNSPEC);
    };
    Some(verdict(
        rewrite_addr(ctx, IP_DST, ip.dst_addr, e.xlate_addr),
        NatCounter::FragRevSnat,
    ))
}

/// The IPv4 header of a well-formed later fragment.
#[inline(always)]
fn later_fragment(ctx: &TcContext) -> Option<Ipv4Hdr> {
    let mut frame = packet::headers(ctx, (EthHdr::LEN + Ipv4Hdr::LEN) as u32);
    if !is_ipv4(&frame.read::<EthHdr>(0)?) {
        return None;
    }
    let ip = frame.read::<Ipv4Hdr>(EthHdr::LEN)?;
    let well_formed = ip.vihl >> 4 == 4 && ipv4_header_len(&ip) >= Ipv4Hdr::LEN;
    (well_formed && fragments::fragment_of(&ip) == Fragment::Later).then_some(ip)
}

/// Replaces the IPv4 address at `at` (source or destination) and updates
/// the header checksum: a later fragment has no L4 header to update.
#[inline(always)]
fn rewrite_addr(ctx: &TcContext, at: usize, old: [u8; 4], new: [u8; 4]) -> Result<(), i64> {
    let (from, to) = (
        u64::from(u32::from_ne_bytes(old)),
        u64::from(u32::from_ne_bytes(new)),
    );
    ctx.l3_csum_replace(IP_CSUM, from, to, 4)?;
    ctx.store(at, &new, 0)?;
    Ok(())
}

#[inline(always)]
fn count(counter: NatCounter) {
    if let Some(slot) = NAT_STATS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
fn verdict(done: Result<(), i64>, counter: NatCounter) -> i32 {
    if done.is_ok() {
        count(counter);
        TC_ACT_UNSPEC
    } else {
        count(NatCounter::RewriteFailures);
        TC_ACT_SHOT
    }
}

/// The configuration when masquerade is on.
#[inline(always)]
fn config() -> Option<NatConfig> {
    let cfg = *NAT_CONFIG.get(0)?;
    (cfg.enabled == 1).then_some(cfg)
}

/// The packet's flow when it is a tracked IPv4 one (IPv6 is never
/// masqueraded: it is not even parsed), and, when the packet is the first
/// fragment of a datagram, that datagram's key in direction `dir`.
#[inline(always)]
fn ipv4_flow(ctx: &TcContext, dir: u8) -> Option<(Flow, Option<FragKey>)> {
    let mut frame = packet::headers(ctx, FLOW_HEADERS);
    let mut flow = Flow::default();
    if !flow::parse_ipv4_into(&mut frame, &mut flow) {
        return None;
    }
    let first = frame
        .read::<Ipv4Hdr>(EthHdr::LEN)
        .filter(|ip| fragments::fragment_of(ip) == Fragment::First)
        .map(|ip| fragments::key_of(&ip, dir));
    Some((flow, first))
}

/// An ICMP error about a masqueraded flow, translated back to the
/// endpoint: the outer destination, and the quoted source address and
/// port (see [`quoted`]). Any other packet passes as it is.
#[inline(always)]
fn quoted_error(ctx: &TcContext, cfg: &NatConfig) -> i32 {
    // From the headers read already: only an ICMP error reads further.
    if quoted::error_at(&mut packet::headers(ctx, FLOW_HEADERS), cfg.node_ip).is_none() {
        return TC_ACT_UNSPEC;
    }
    let mut frame = packet::headers(ctx, quoted::QUOTE_HEADERS);
    let Some(q) = quoted::quoted_error(&mut frame, cfg.node_ip) else {
        return TC_ACT_UNSPEC;
    };
    // SAFETY: the value is copied out at once.
    let Some(back) = (unsafe { NAT_MAP.get(&q.key) }).copied() else {
        // About the node's own traffic.
        return TC_ACT_UNSPEC;
    };
    if nat::held_by_node(&q.key, &back) {
        // About a flow of the node's own on a port of the range.
        return TC_ACT_UNSPEC;
    }
    verdict(
        rewrite_quoted(ctx, &q, cfg.node_ip, &back),
        NatCounter::RevSnat,
    )
}

/// The rewrites of [`quoted_error`]. The quoted header's sum, its
/// checksum included, is the same after its source and checksum change,
/// so the ICMP checksum changes only with the quoted port. The quoted L4
/// checksum is left: the quote is often cut before it, and no stack checks
/// it.
#[inline(always)]
fn rewrite_quoted(
    ctx: &TcContext,
    q: &quoted::QuotedError,
    node_ip: [u8; 4],
    back: &NatEntry,
) -> Result<(), i64> {
    let (node, ep) = (
        u64::from(u32::from_ne_bytes(node_ip)),
        u64::from(u32::from_ne_bytes(back.xlate_addr)),
    );
    ctx.l3_csum_replace(IP_CSUM, node, ep, 4)?;
    ctx.store(IP_DST, &back.xlate_addr, 0)?;
    ctx.l3_csum_replace(q.quote_at + 10, node, ep, 4)?;
    ctx.store(q.quote_at + 12, &back.xlate_addr, 0)?;
    if q.key.dport != back.xlate_port {
        let (from_p, to_p) = (
            u64::from(u16::from_ne_bytes(q.key.dport)),
            u64::from(u16::from_ne_bytes(back.xlate_port)),
        );
        ctx.l4_csum_replace(q.icmp_at + 2, from_p, to_p, 2)?;
        ctx.store(q.quote_port_at, &back.xlate_port, 0)?;
    }
    Ok(())
}

/// Holds the port (or echo identifier) of `out`, a flow of the node's own
/// on a port of the range, toward its peer: an `IN` entry translating to
/// the node itself, which no endpoint flow can claim (claims insert with
/// `BPF_NOEXIST`) while it lives. An endpoint flow that held the port
/// toward that peer loses it to the node, whose replies these are: its
/// next packet finds its reverse half gone and takes another port (see
/// [`mapping`]). The hold lasts while the node's flow sends, and goes
/// with the agent's collector after its protocol's idle lifetime, a TCP
/// connection's as its FIN or RST say. A reset makes no hold
/// ([`nat::makes_hold`]). (A subprogram: its own stack frame.)
#[inline(never)]
fn hold_for_node(cfg: &NatConfig, out: &NatKey, port: [u8; 2], tcp_flags: u8) {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let inbound = nat::in_key(out, cfg.node_ip, port);
    if let Some(e) = NAT_MAP.get_ptr_mut(&inbound) {
        // SAFETY: a valid map value pointer, read and written at once.
        let held = unsafe { nat::held_by_node(&inbound, &*e) };
        if held {
            // SAFETY: as above.
            unsafe {
                (*e).last_ns = now;
                (*e).closing = NatEntry::closing_after((*e).closing, tcp_flags);
            }
            return;
        }
    }
    if !nat::makes_hold(tcp_flags) {
        return;
    }
    let held = NatEntry {
        closing: NatEntry::closing_after(0, tcp_flags),
        ..NatEntry::made(cfg.node_ip, port, now)
    };
    if NAT_MAP.insert(&inbound, &held, 0).is_ok() {
        count(NatCounter::NodeHeld);
    }
}

/// The node port of flow `out`: its existing pair's, or a newly allocated
/// one. `None` when every attempt collided.
#[inline(always)]
fn mapping(cfg: &NatConfig, out: &NatKey, port: [u8; 2], now: u64) -> Option<[u8; 2]> {
    if let Some(e) = NAT_MAP.get_ptr_mut(out) {
        // SAFETY: a valid map value pointer, copied before further calls.
        let fwd = unsafe {
            (*e).last_ns = now;
            *e
        };
        let inbound = nat::in_key(out, cfg.node_ip, fwd.xlate_port);
        // The reverse half, when it is this flow's; evicted by the LRU, it
        // is restored (or another CPU restored it first).
        if reverse_is(&inbound, out)
            || NAT_MAP
                .insert(
                    &inbound,
                    &reverse_entry(out, port, now, fwd.created_ns),
                    u64::from(BPF_NOEXIST),
                )
                .is_ok()
            || reverse_is(&inbound, out)
        {
            return Some(fwd.xlate_port);
        }
        // Another flow took the port since the eviction: this one starts
        // over, never sharing its wire tuple.
        let _ = NAT_MAP.remove(out);
    }
    allocate(cfg, out, port, now)
}

/// Whether the entry at `inbound` is the reverse half of flow `out`.
#[inline(always)]
fn reverse_is(inbound: &NatKey, out: &NatKey) -> bool {
    // SAFETY: the value is copied out at once.
    unsafe { NAT_MAP.get(inbound) }.is_some_and(|back| nat::out_key_of(inbound, back) == *out)
}

#[inline(always)]
const fn reverse_entry(out: &NatKey, port: [u8; 2], now: u64, created_ns: u64) -> NatEntry {
    NatEntry {
        created_ns,
        ..NatEntry::made(out.saddr, port, now)
    }
}

/// Claims a free node port for `out` by inserting its `IN` entry with
/// `BPF_NOEXIST` (the claim is atomic), then records the `OUT` entry.
#[inline(always)]
fn allocate(cfg: &NatConfig, out: &NatKey, port: [u8; 2], now: u64) -> Option<[u8; 2]> {
    if cfg.range_len() == 0 {
        return None;
    }
    let own = u16::from_be_bytes(port);
    let back = reverse_entry(out, port, now, now);
    let mut chosen = None;
    for attempt in 0..ALLOC_RETRIES {
        // SAFETY: plain helper call.
        let random = unsafe { bpf_get_prandom_u32() };
        let candidate = cfg.candidate(own, attempt, random).to_be_bytes();
        let inbound = nat::in_key(out, cfg.node_ip, candidate);
        if NAT_MAP
            .insert(&inbound, &back, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            chosen = Some(candidate);
            break;
        }
    }
    let chosen = chosen?;
    let fwd = NatEntry::made(cfg.node_ip, chosen, now);
    if NAT_MAP.insert(out, &fwd, u64::from(BPF_NOEXIST)).is_err() {
        // Another CPU made this flow's pair first: use it, free ours.
        let _ = NAT_MAP.remove(&nat::in_key(out, cfg.node_ip, chosen));
        // SAFETY: copied out at once.
        return unsafe { NAT_MAP.get(out) }.map(|e| e.xlate_port);
    }
    count(NatCounter::Created);
    Some(chosen)
}

/// Where the rewritten address and port sit in the frame.
struct Side {
    addr_at: usize,
    port_at: usize,
}

/// Replaces an address (and, when it changes, a port) and updates the
/// IPv4 and L4 checksums incrementally, pseudo-header included.
#[inline(always)]
fn rewrite(
    ctx: &TcContext,
    flow: &Flow,
    side: &Side,
    (old_addr, new_addr): ([u8; 4], [u8; 4]),
    (old_port, new_port): ([u8; 2], [u8; 2]),
) -> Result<(), i64> {
    let proto = flow.key.proto;
    let csum_at = usize::from(flow.l4) + nat::l4_csum_offset(proto).ok_or(-1i64)?;
    let mangled0 = if proto == IPPROTO_UDP {
        u64::from(BPF_F_MARK_MANGLED_0)
    } else {
        0
    };
    let (from_a, to_a) = (
        u64::from(u32::from_ne_bytes(old_addr)),
        u64::from(u32::from_ne_bytes(new_addr)),
    );
    if proto == IPPROTO_TCP || proto == IPPROTO_UDP {
        ctx.l4_csum_replace(
            csum_at,
            from_a,
            to_a,
            u64::from(BPF_F_PSEUDO_HDR) | mangled0 | 4,
        )?;
    }
    if old_port != new_port {
        let (from_p, to_p) = (
            u64::from(u16::from_ne_bytes(old_port)),
            u64::from(u16::from_ne_bytes(new_port)),
        );
        ctx.l4_csum_replace(csum_at, from_p, to_p, mangled0 | 2)?;
        ctx.store(side.port_at, &new_port, 0)?;
    }
    ctx.l3_csum_replace(IP_CSUM, from_a, to_a, 4)?;
    ctx.store(side.addr_at, &new_addr, 0)?;
    Ok(())
}
