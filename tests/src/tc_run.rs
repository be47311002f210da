//! The tc programs run by the kernel on one frame (`BPF_PROG_TEST_RUN`):
//! the fixture of the tracking and masquerade test runs, for both families.

use aya::programs::{TestRun as _, TestRunOptions};
use health_agent::datapath::{Datapath, ct};
use health_common::{ct::CtConfig, maps::ProgId};

use crate::{pins::PinDir, require_root};

/// `TCX_NEXT`: the verdict of a program that hands the packet on.
pub const TCX_NEXT: u32 = u32::MAX;

/// The datapath loaded in a fresh bpffs directory, CT lifetimes set.
#[must_use]
pub fn loaded() -> (Datapath, PinDir) {
    require_root();
    let pins = PinDir::new();
    let mut r = Datapath::load(pins.path()).expect("load");
    r.set_ct_config(CtConfig::default()).expect("ct config");
    (r, pins)
}

/// Runs `prog` on `input`: its verdict and the frame it leaves.
pub fn run(r: &mut Datapath, prog: ProgId, input: &[u8]) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; input.len() + 64];
    let res = r
        .classifier(prog)
        .expect("program")
        .test_run(TestRunOptions {
            data_in: Some(input),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        })
        .expect("test run");
    out.truncate(res.data_size_out as usize);
    (res.return_value, out)
}

/// Runs the tracking program from the endpoint (`from_endpoint`: the
/// ingress of `lxc_health`) or toward it; asserts the packet is handed on
/// unchanged, byte for byte.
pub fn track(r: &mut Datapath, from_endpoint: bool, input: &[u8]) {
    let prog = if from_endpoint {
        ProgId::LxcIngress
    } else {
        ProgId::LxcEgress
    };
    let (verdict, out) = run(r, prog, input);
    assert_eq!(verdict, TCX_NEXT, "always handed on");
    assert_eq!(out, input, "never modified");
}

/// The CT counter `name`.
#[must_use]
pub fn ct_counter(pins: &PinDir, name: &str) -> u64 {
    crate::counter(&ct::counters(pins.path()).expect("counters"), name)
}

/// The one CT entry in `pins`: its direction, source, and packets
/// received and sent.
#[must_use]
pub fn only_entry(pins: &PinDir) -> (&'static str, std::net::IpAddr, u64, u64) {
    let rows = ct::list(pins.path()).expect("ct");
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let e = &rows[0];
    (e.dir, e.src, e.rx_packets, e.tx_packets)
}
