//! Connection tracking and in-kernel RTT on `lxc_health`, both directions,
//! IPv4 and IPv6 in the same maps. Never drops: untracked or unparsable
//! packets are counted and passed on.

use aya_ebpf::{
    bindings::{BPF_NOEXIST, TC_ACT_UNSPEC},
    helpers::bpf_ktime_get_ns,
    macros::classifier,
    programs::TcContext,
};
use health_common::{
    ct::{
        CtConfig, CtCounter, CtEntry, CtKey, DIR_IN, DIR_OUT, Flow, IPPROTO_TCP, TCP_ACK, TCP_RST,
        TCP_SYN,
    },
    flow,
    rtt::{self, RttKey, RttStats},
};

use super::{
    maps::{CT_CONFIG, CT_MAP, CT_STATS, RTT_PENDING, RTT_STATS},
    packet::{self, FLOW_HEADERS},
};

/// Packets leaving the endpoint (ingress of the host side of its veth).
#[classifier]
pub fn health_lxc_ingress(ctx: TcContext) -> i32 {
    track(&ctx, true)
}

/// Packets going to the endpoint (egress of the host side of its veth).
#[classifier]
pub fn health_lxc_egress(ctx: TcContext) -> i32 {
    track(&ctx, false)
}

#[inline(always)]
fn count(counter: CtCounter) {
    if let Some(slot) = CT_STATS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot.
        unsafe { *slot += 1 };
    }
}

/// The program's own frame holds the flow and little else: the map work
/// is done by subprograms (`#[inline(never)]`: own stack frames, called
/// one after the other), which only get the flow, never a packet pointer.
#[inline(always)]
fn track(ctx: &TcContext, from_endpoint: bool) -> i32 {
    let mut frame = packet::headers(ctx, FLOW_HEADERS);
    let mut flow = Flow::default();
    if !flow::parse_into(&mut frame, &mut flow) {
        count(CtCounter::Unparsed);
        return TC_ACT_UNSPEC;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    account(&flow, from_endpoint, now);
    if from_endpoint {
        start_rtt(&flow, now);
    } else {
        finish_rtt(&flow, now);
    }
    TC_ACT_UNSPEC
}

/// Finds the flow's entry and accounts the packet; creates an entry for a
/// new flow. The endpoint opens most flows it sees (its probes, four a
/// peer, against the two a peer opens to it): a packet leaving it is
/// looked up in its own direction first, one coming back in the reverse
/// of its own, so that a probe's packets each take one lookup. A bare SYN
/// opens a flow in its own direction: only that direction is looked up (a
/// retransmitted SYN finds its entry; a SYN on the reversed ports of a
/// flow the other side opened, the ports reused or a simultaneous open,
/// gets an entry of its own). A function of its own (a BPF subprogram with its own
/// stack frame): its two 40-byte keys and the new entry do not share the
/// 512 bytes with the RTT code's.
#[inline(never)]
fn account(flow: &Flow, from_endpoint: bool, now: u64) {
    let cfg: &CtConfig = &CT_CONFIG.get(0).copied().unwrap_or_default();
    count(CtCounter::Lookups);
    let (own_dir, other_dir) = if from_endpoint {
        (DIR_OUT, DIR_IN)
    } else {
        (DIR_IN, DIR_OUT)
    };
    let own = CtKey {
        dir: own_dir,
        ..flow.key
    };
    let reply = flow.key.reversed(other_dir);
    let proto = flow.key.proto;
    let (first, second) = if from_endpoint {
        (&own, &reply)
    } else {
        (&reply, &own)
    };
    let found = if proto == IPPROTO_TCP && flow.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
        CT_MAP.get_ptr_mut(&own)
    } else {
        CT_MAP
            .get_ptr_mut(first)
            .or_else(|| CT_MAP.get_ptr_mut(second))
    };
    if let Some(e) = found {
        // SAFETY: a valid map value pointer; concurrent updates from other
        // CPUs may lose an increment (no atomics on this target).
        unsafe { (*e).account(now, flow.len, flow.tcp_flags, from_endpoint, cfg, proto) };
        return;
    }
    let mut entry = CtEntry {
        created_ns: now,
        ..CtEntry::default()
    };
    entry.account(now, flow.len, flow.tcp_flags, from_endpoint, cfg, proto);
    if CT_MAP.insert(&own, &entry, u64::from(BPF_NOEXIST)).is_ok() {
        count(CtCounter::Created);
    } else {
        count(CtCounter::InsertFailures);
    }
}

/// Timestamps echo requests (ICMP and `ICMPv6`) and TCP SYNs leaving the
/// endpoint, up to [`rtt::TIMED_MAX_LEN`] bytes (not the path-MTU probes),
/// echoes only past [`rtt::UNTIMED_MAX_TTL`] (not the path traces') (a
/// subprogram, as [`account`]).
#[inline(never)]
fn start_rtt(flow: &Flow, now: u64) {
    if flow.len > rtt::TIMED_MAX_LEN {
        return;
    }
    let is_syn = flow.key.proto == IPPROTO_TCP && flow.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    if flow.is_echo_request() && flow.ttl > rtt::UNTIMED_MAX_TTL {
        let key = rtt::request_key(flow);
        let _ = RTT_PENDING.insert(&key, &now, 0);
    } else if is_syn {
        // A SYN sent again (the same ISN, so the same key) keeps the first
        // one's time, marked: Karn's rule.
        let key = rtt::request_key(flow);
        // SAFETY: the value is copied out at once.
        let pending = unsafe { RTT_PENDING.get(&key) }.copied();
        let _ = RTT_PENDING.insert(&key, &rtt::after_syn(pending, now), 0);
    }
}

/// Closes the sample on an echo reply or SYN-ACK coming back, unless its
/// SYN was sent more than once (a subprogram, as [`account`]). A reset
/// with its ACK flag on a pending SYN's ports answers it too (a closed
/// port, a firewall rejecting with a reset; a bare reset cannot, as TCP
/// takes none in SYN-SENT): the request is closed, not left for the loss
/// sweep, and times nothing (it may come from a box on the way). A
/// SYN-ACK or reset closes only the SYN it acknowledges (its ISN plus
/// one, in the key): one for an older connection on the same ports, or a
/// forged one, closes nothing, as TCP would take neither.
#[inline(never)]
fn finish_rtt(flow: &Flow, now: u64) {
    let is_tcp = flow.key.proto == IPPROTO_TCP;
    let is_reset = is_tcp && flow.tcp_flags & (TCP_RST | TCP_ACK) == TCP_RST | TCP_ACK;
    let is_synack = is_tcp && flow.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK;
    let is_echo_reply = flow.is_echo_reply();
    if !is_synack && !is_echo_reply && !is_reset {
        return;
    }
    let key = rtt::reply_key(flow);
    // SAFETY: the value is read before the entry is removed.
    let Some(sent) = (unsafe { RTT_PENDING.get(&key) }).copied() else {
        return;
    };
    let _ = RTT_PENDING.remove(&key);
    if is_reset {
        return;
    }
    let Some(sample) = rtt::sample(sent, now) else {
        return;
    };
    let stats_key = RttKey {
        peer: key.peer,
        proto: key.proto,
        pad: [0; 3],
    };
    if let Some(s) = RTT_STATS.get_ptr_mut(&stats_key) {
        record_in(s, sample, now);
    } else {
        first_sample(&stats_key, sample, now);
    }
}

/// Records a sample in the value at `s`. The value is shared by the CPUs:
/// a reply of the same peer and protocol taken on another CPU at the same
/// moment may lose an increment, as a CT entry's counters may (no atomics
/// on this target).
#[inline(always)]
fn record_in(s: *mut RttStats, sample: u64, now: u64) {
    // SAFETY: a valid map value pointer, from a lookup of this program.
    unsafe { (*s).record(sample, now) };
}

/// Makes the peer's statistics with their first sample: the value is 240
/// bytes of stack, in a frame of its own. When another CPU made them
/// meanwhile, the sample goes into theirs.
#[inline(never)]
fn first_sample(key: &RttKey, sample: u64, now: u64) {
    let mut s = RttStats::default();
    s.record(sample, now);
    if RTT_STATS.insert(key, &s, u64::from(BPF_NOEXIST)).is_err()
        && let Some(shared) = RTT_STATS.get_ptr_mut(key)
    {
        record_in(shared, sample, now);
    }
}
