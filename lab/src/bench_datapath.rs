//! `cargo xtask bench datapath`: what each datapath program costs per
//! packet, measured by the kernel (`BPF_PROG_TEST_RUN`).
//!
//! A rewriting program changes the test packet in place, so `repeat` would
//! time the rewrite once and then the pass-through path: every sample is
//! one run on a fresh copy of the packet instead, and the kernel's own
//! duration (which excludes the syscall) is averaged over many samples.
//! Every flow exists before timing starts: these are the steady-state
//! (hit) paths a probe takes.

use health_common::maps::{EchoConfig, ProgId};
use std::{fmt::Write as _, time::Duration};

use anyhow::Context as _;
use aya::programs::{SchedClassifier, TestRun as _, TestRunOptions};
use health_agent::datapath::Datapath;
use health_common::ct::CtConfig;

use health_tests::{
    nat_setup::{EP, NODE, PEER, PEER_HEALTH, config},
    packets::Echo,
    pins::PinDir,
};

/// The node-side identifier the first request gets (in range: kept).
const ID: u16 = 62_000;

/// One measured case.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub name: &'static str,
    pub per_packet: Duration,
}

/// Which program a case runs.
#[derive(Clone, Copy)]
enum Prog {
    Track,
    NatEgress,
    NatIngress,
}

fn program(r: &mut Datapath, p: Prog) -> anyhow::Result<&mut SchedClassifier> {
    Ok(match p {
        Prog::Track => r.classifier(ProgId::LxcIngress)?,
        Prog::NatEgress => r.classifier(ProgId::NatEgress)?,
        Prog::NatIngress => r.classifier(ProgId::NatIngress)?,
    })
}

fn once(r: &mut Datapath, p: Prog, frame: &[u8]) -> anyhow::Result<Duration> {
    let mut out = vec![0u8; frame.len() + 64];
    let res = program(r, p)?
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        })
        .context("BPF_PROG_TEST_RUN")?;
    anyhow::ensure!(
        res.return_value == u32::MAX,
        "the program did not pass the packet"
    );
    Ok(res.duration)
}

/// Runs every case `samples` times; reports the mean per packet.
pub(crate) fn run(samples: u32) -> anyhow::Result<Vec<Case>> {
    let pins = PinDir::new();
    let mut r = Datapath::load(pins.path())?;
    r.set_ct_config(CtConfig::default())?;
    r.set_nat_config(config(61_000, 65_535))?;
    let request = Echo::request(EP, PEER, ID, 1).frame();
    let mut reply = Echo::request(PEER, NODE, ID, 1);
    reply.kind = 0;
    let reply = reply.frame();
    let routed = Echo::request(EP, PEER_HEALTH, ID, 1).frame();
    let cases: [(&'static str, Prog, &[u8]); 4] = [
        (
            "CT + RTT on lxc_health (echo request, entry exists)",
            Prog::Track,
            &request,
        ),
        (
            "masquerade SNAT (echo request, pair exists)",
            Prog::NatEgress,
            &request,
        ),
        (
            "masquerade reverse SNAT (echo reply)",
            Prog::NatIngress,
            &reply,
        ),
        (
            "masquerade, not translated (to the health range)",
            Prog::NatEgress,
            &routed,
        ),
    ];
    let mut results = Vec::new();
    for (name, prog, frame) in cases {
        crate::stop::check()?;
        // Warm up: creates the flow's entries.
        once(&mut r, prog, frame)?;
        let mut total = Duration::ZERO;
        for _ in 0..samples {
            total += once(&mut r, prog, frame)?;
        }
        results.push(Case {
            name,
            per_packet: total / samples.max(1),
        });
    }
    Ok(results)
}

/// What the echo responder costs per request it answers, by the kernel
/// (`BPF_PROG_TEST_RUN`): the tc program and the XDP one (the same for
/// generic and native XDP), each the mean of `samples` runs on a fresh
/// copy of `request` (the program turns its packet into the reply, so the
/// kernel's `repeat` would time one reply and then the reply passed on).
/// Every run must answer.
pub(crate) fn echo_per_packet(
    request: &[u8],
    config: EchoConfig,
    samples: u32,
) -> anyhow::Result<[Duration; 2]> {
    let pins = PinDir::new();
    let mut r = Datapath::load_programs(pins.path(), &[ProgId::EchoTc, ProgId::EchoXdp])?;
    r.set_echo_config(config)?;
    let mut out = vec![0u8; request.len() + 64];
    let mut per = [Duration::ZERO; 2];
    // TC_ACT_REDIRECT, XDP_TX: the request answered.
    for (slot, (prog, answered)) in [(ProgId::EchoTc, 7), (ProgId::EchoXdp, 3)]
        .into_iter()
        .enumerate()
    {
        let mut total = Duration::ZERO;
        // The first run warms up and is not counted: the mean is of
        // `samples` runs, as the report says.
        for run in 0..=samples {
            let opts = TestRunOptions {
                data_in: Some(request),
                data_out: Some(&mut out),
                ..TestRunOptions::default()
            };
            let res = match prog {
                ProgId::EchoXdp => r.xdp(prog)?.test_run(opts),
                _ => r.classifier(prog)?.test_run(opts),
            }
            .context("BPF_PROG_TEST_RUN")?;
            anyhow::ensure!(
                res.return_value == answered,
                "{prog:?} did not answer the request (verdict {})",
                res.return_value
            );
            if run > 0 {
                total += res.duration;
            }
        }
        per[slot] = total / samples.max(1);
    }
    Ok(per)
}

#[must_use]
pub(crate) fn render(cases: &[Case], samples: u32) -> String {
    let mut out = format!("per packet, kernel-measured mean of {samples} runs each\n");
    for c in cases {
        let _ = writeln!(out, "  {:<55} {:>6} ns", c.name, c.per_packet.as_nanos());
    }
    out
}
