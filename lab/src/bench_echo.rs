//! `cargo xtask bench echo`: echo replies per second on one veth, the eBPF
//! responder in each attach mode against the kernel stack's own echo.
//!
//! Node `a` floods node `b` with one prebuilt echo request (ICMP over IPv4,
//! or `ICMPv6` with `--family ipv6`) over `AF_PACKET`
//! (`sendmmsg`, no qdisc) from one thread per CPU; replies are counted from
//! `a`'s interface counters. Modes are interleaved over rounds and the
//! median is reported, so drift on the machine hits every mode alike.
//!
//! Once counted, the replies are dropped at `a`'s tcx ingress, as the
//! sender ceiling's frames are dropped on arrival at `b`: on a network the
//! requester is another machine, and here its stack taking every reply in
//! would share the two CPUs with the responder measured. With
//! `--replies-to-stack` they go up `a`'s stack as before.

use std::{fmt::Write as _, time::Duration};

use health_agent::{
    datapath::{AttachMode, Datapath, Interface},
    sys::netlink::in_netns,
};
use health_common::maps::EchoConfig;

use crate::blaster::blast;
use health_tests::{
    packets::Echo,
    packets6::Echo6,
    pinger::ping,
    pinger6::ping6,
    pins::PinDir,
    topology::{A_IF, A_IP, A_IP6, B_IF, B_IP, B_IP6, TwoNodes},
};

/// Who answers the echo requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EchoResponder {
    Kernel,
    Ebpf(AttachMode),
}

impl EchoResponder {
    pub(crate) const ALL: [Self; 4] = [
        Self::Kernel,
        Self::Ebpf(AttachMode::Tcx),
        Self::Ebpf(AttachMode::XdpGeneric),
        Self::Ebpf(AttachMode::XdpNative),
    ];

    #[must_use]
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Kernel => "kernel stack",
            Self::Ebpf(m) => m.as_str(),
        }
    }
}

/// One measurement window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub offered_pps: f64,
    pub replies_pps: f64,
    /// Replies the eBPF program counted as answered (0 for the kernel).
    pub answered_in_kernel_program: u64,
}

pub(crate) struct Options {
    /// `ICMPv6` echo to b's IPv6 address instead of ICMP over IPv4.
    pub ipv6: bool,
    pub seconds: u32,
    pub rounds: u32,
    pub senders: usize,
    /// Let `a`'s stack take the replies in, instead of dropping them once
    /// counted.
    pub replies_to_stack: bool,
}

/// What one benchmark run found.
pub(crate) struct Results {
    /// Frames per second the sender pushes when nothing answers.
    pub sender_ceiling_pps: f64,
    /// Median sample per responder.
    pub medians: Vec<(EchoResponder, Sample)>,
    /// The tc and the XDP program per request answered, by the kernel
    /// (`BPF_PROG_TEST_RUN`, [`crate::bench_datapath::echo_per_packet`]).
    pub program: [Duration; 2],
}

/// Runs each echo program alone this many times for its cost per packet.
const PROGRAM_SAMPLES: u32 = 20_000;

impl EchoResponder {
    /// Its program's cost per request, where it has one.
    fn program(self, per: &[Duration; 2]) -> Option<Duration> {
        match self {
            Self::Kernel => None,
            Self::Ebpf(AttachMode::Tcx | AttachMode::Tc) => Some(per[0]),
            Self::Ebpf(_) => Some(per[1]),
        }
    }
}

/// Runs the benchmark.
pub(crate) fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> anyhow::Result<Results> {
    let nodes = TwoNodes::new();
    let pins = PinDir::new();
    let (a_index, a_mac) = in_netns(Some(&nodes.a), |nl| async move { nl.link_l2(A_IF).await })?;
    let (_, b_mac) = in_netns(Some(&nodes.b), |nl| async move { nl.link_l2(B_IF).await })?;
    let frame = if opts.ipv6 {
        nodes.add_ipv6();
        let mut req = Echo6::request(A_IP6, B_IP6, 0xbe7c, 1);
        req.src_mac = a_mac;
        req.dst_mac = b_mac;
        req.frame()
    } else {
        let mut req = Echo::request(A_IP, B_IP, 0xbe7c, 1);
        req.src_mac = a_mac;
        req.dst_mac = b_mac;
        req.frame()
    };
    // Let b learn a's MAC (the kernel's replies need it) and check the path.
    let answered = if opts.ipv6 {
        ping6(&nodes.a, A_IP6, B_IP6, 0xbe7d, 1, Duration::from_secs(1))?[0]
            .reply
            .is_some()
    } else {
        ping(&nodes.a, B_IP, 0xbe7d, 1, Duration::from_secs(1))?[0]
            .reply
            .is_some()
    };
    anyhow::ensure!(answered, "no echo reply from node b before the benchmark");
    let _drop_replies = if opts.replies_to_stack {
        None
    } else {
        Some(
            health_tests::faults::DropIcmp::attach_echo_replies(&nodes.a, A_IF, opts.ipv6)
                .map_err(|e| {
                    anyhow::anyhow!("dropping the replies at {A_IF}'s tcx ingress: {e}")
                })?,
        )
    };

    let window = Duration::from_secs(u64::from(opts.seconds));
    let ceiling = sender_ceiling(&nodes, &pins, a_index, &frame, opts, window)?;
    progress(&format!(
        "sender ceiling (frames dropped on arrival): {ceiling:>10.0}/s"
    ));
    let mut samples: Vec<(EchoResponder, Vec<Sample>)> = EchoResponder::ALL
        .iter()
        .map(|k| (*k, Vec::new()))
        .collect();
    for round in 1..=opts.rounds {
        for (kind, list) in &mut samples {
            let s = measure(&nodes, &pins, *kind, a_index, &frame, opts, window)?;
            crate::stop::check()?;
            progress(&format!(
                "round {round}/{}: {:<12} offered {:>10.0}/s  replies {:>10.0}/s",
                opts.rounds,
                kind.name(),
                s.offered_pps,
                s.replies_pps
            ));
            list.push(s);
        }
    }
    let mut config = EchoConfig {
        addr: B_IP.octets(),
        mac: b_mac,
        ..EchoConfig::default()
    };
    if opts.ipv6 {
        config.addr6 = B_IP6.octets();
    }
    let program = crate::bench_datapath::echo_per_packet(&frame, config, PROGRAM_SAMPLES)?;
    Ok(Results {
        program,
        sender_ceiling_pps: ceiling,
        medians: samples
            .into_iter()
            .map(|(k, list)| (k, median(list)))
            .collect(),
    })
}

/// The addresses the responder answers for.
fn targets(opts: &Options) -> (Option<std::net::Ipv4Addr>, Option<std::net::Ipv6Addr>) {
    (Some(B_IP), opts.ipv6.then_some(B_IP6))
}

/// What the sender can push when the far side does the least possible:
/// frames with a corrupt IPv4 header checksum (IPv6: a corrupt `ICMPv6`
/// checksum), dropped by the tcx responder right after parsing. (Generic
/// XDP would cost more than the tcx row itself: it gives every frame a
/// socket sent a larger head, a copy each.) Checks every frame was seen
/// and dropped.
fn sender_ceiling(
    nodes: &TwoNodes,
    pins: &PinDir,
    a_index: u32,
    frame: &[u8],
    opts: &Options,
    window: Duration,
) -> anyhow::Result<f64> {
    let mut bad = frame.to_vec();
    // Ethernet 14 + IPv4 checksum at 10; Ethernet 14 + IPv6 40 + ICMPv6
    // checksum at 2.
    bad[if opts.ipv6 { 56 } else { 24 }] ^= 0xff;
    let mut r = Datapath::load(pins.path())?;
    let iface = Interface::new(B_IF, Some(nodes.b.clone()));
    let (v4, v6) = targets(opts);
    r.set_echo_targets(&iface, v4, v6)?;
    r.attach_echo(&iface, AttachMode::Tcx, None)?;
    let before = r.echo_stats()?;
    let sent = blast(&nodes.a, a_index, &bad, opts.senders, window)?;
    let dropped = r.echo_stats()?.since(before).malformed;
    anyhow::ensure!(
        dropped == sent,
        "sender ceiling: sent {sent} frames but the responder dropped {dropped}"
    );
    #[allow(
        clippy::cast_precision_loss,
        reason = "packet counts stay far below 2^52"
    )]
    Ok(sent as f64 / window.as_secs_f64())
}

fn measure(
    nodes: &TwoNodes,
    pins: &PinDir,
    kind: EchoResponder,
    a_index: u32,
    frame: &[u8],
    opts: &Options,
    window: Duration,
) -> anyhow::Result<Sample> {
    let senders = opts.senders;
    // The kernel's echo is on only when it is the responder measured, so an
    // eBPF figure can never include replies from the stack.
    let ignore_all = if kind == EchoResponder::Kernel {
        "0"
    } else {
        "1"
    };
    let sysctl = if opts.ipv6 {
        "net/ipv6/icmp/echo_ignore_all"
    } else {
        "net/ipv4/icmp_echo_ignore_all"
    };
    TwoNodes::sysctl(&nodes.b, sysctl, ignore_all);
    let responder = match kind {
        EchoResponder::Kernel => None,
        EchoResponder::Ebpf(mode) => {
            let mut r = Datapath::load(pins.path())?;
            let iface = Interface::new(B_IF, Some(nodes.b.clone()));
            let (v4, v6) = targets(opts);
            r.set_echo_targets(&iface, v4, v6)?;
            let peer = Interface::new(A_IF, Some(nodes.a.clone()));
            r.attach_echo(&iface, mode, Some(&peer))?;
            Some(r)
        }
    };
    // Warm up caches and NAPI state outside the window.
    blast(
        &nodes.a,
        a_index,
        frame,
        senders,
        Duration::from_millis(200),
    )?;
    std::thread::sleep(Duration::from_millis(50));
    let answered_before = responder
        .as_ref()
        .map(Datapath::echo_stats)
        .transpose()?
        .unwrap_or_default();
    let rx_before = rx_packets(nodes)?;
    let sent = blast(&nodes.a, a_index, frame, senders, window)?;
    std::thread::sleep(Duration::from_millis(50));
    let rx_after = rx_packets(nodes)?;
    let answered_after = responder
        .as_ref()
        .map(Datapath::echo_stats)
        .transpose()?
        .unwrap_or_default();
    let secs = window.as_secs_f64();
    let replies = rx_after.saturating_sub(rx_before);
    let answered = answered_after.since(answered_before).answered;
    // In eBPF rows every reply must come from the program (the stack ignores
    // echo there); allow a few frames of slack for packets in flight.
    if responder.is_some() && answered + 1024 < replies {
        anyhow::bail!(
            "{}: {replies} replies seen but the program answered only {answered}",
            kind.name()
        );
    }
    // And every answer must be seen: a kernel that does not count a reply
    // handed to the veth's peer (bpf_redirect_peer) on the peer would
    // otherwise read as a responder that answers nothing.
    if responder.is_some() && replies + 1024 < answered {
        anyhow::bail!(
            "{}: the program answered {answered} but A's interface counted {replies} replies",
            kind.name()
        );
    }
    #[allow(
        clippy::cast_precision_loss,
        reason = "packet counts stay far below 2^52"
    )]
    Ok(Sample {
        offered_pps: sent as f64 / secs,
        replies_pps: replies as f64 / secs,
        answered_in_kernel_program: answered,
    })
}

fn rx_packets(nodes: &TwoNodes) -> anyhow::Result<u64> {
    Ok(in_netns(
        Some(&nodes.a),
        |nl| async move { nl.link_stats(A_IF).await },
    )?
    .rx_packets)
}

fn median(mut list: Vec<Sample>) -> Sample {
    list.sort_by(|x, y| x.replies_pps.total_cmp(&y.replies_pps));
    list[list.len() / 2]
}

/// The result table, with each mode's ratio to the kernel stack.
#[must_use]
pub(crate) fn render(results: &Results, opts: &Options) -> String {
    let kernel = results
        .medians
        .iter()
        .find(|(k, _)| *k == EchoResponder::Kernel)
        .map_or(f64::NAN, |(_, s)| s.replies_pps);
    let mut out = format!(
        "{} echo replies per second on one veth ({} s windows, median of {} rounds, {} sender thread(s))\n",
        if opts.ipv6 { "ICMPv6" } else { "ICMP (IPv4)" },
        opts.seconds,
        opts.rounds,
        opts.senders
    );
    let _ = writeln!(
        out,
        "{:<14} {:>12} {:>12} {:>9} {:>10} {:>14} {:>12}",
        "responder", "offered/s", "replies/s", "answered", "vs kernel", "by program", "program ns"
    );
    for (kind, s) in &results.medians {
        let _ = writeln!(
            out,
            "{:<14} {:>12.0} {:>12.0} {:>8.1}% {:>10} {:>14} {:>12}",
            kind.name(),
            s.offered_pps,
            s.replies_pps,
            100.0 * s.replies_pps / s.offered_pps.max(1.0),
            // No ratio to a kernel that answered nothing (or was not run).
            if kernel > 0.0 {
                format!("{:.2}x", s.replies_pps / kernel)
            } else {
                "n/a".to_owned()
            },
            s.answered_in_kernel_program,
            kind.program(&results.program)
                .map_or_else(|| "-".to_owned(), |d| d.as_nanos().to_string())
        );
    }
    let _ = writeln!(
        out,
        "program ns: the program alone per request answered, by the kernel (BPF_PROG_TEST_RUN, \
         mean of {PROGRAM_SAMPLES} runs on a fresh copy of the request; generic and native XDP run \
         the same program)"
    );
    let _ = writeln!(
        out,
        "sender ceiling (frames dropped by the tcx program on arrival): {:.0}/s.\n\
         veth runs the receiver in the sender's softirq, so each row is what the whole path\n\
         sustains on the CPUs: the sender is the same in every row and the responder's cost is\n\
         what differs",
        results.sender_ceiling_pps
    );
    let _ = writeln!(
        out,
        "{}",
        if opts.replies_to_stack {
            "replies: taken in by the requester's stack (--replies-to-stack)"
        } else {
            "replies: counted by the requester's veth, then dropped at its tcx ingress (its stack spared)"
        }
    );
    out
}
