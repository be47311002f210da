//! Running the echo programs on the frame classes of
//! [`crate::echo_classes`] and [`crate::echo_classes6`], for both families:
//! once by `BPF_PROG_TEST_RUN` ([`run`], [`test_run_classes`]) and once over
//! a veth against the kernel's own answers ([`against_kernel`]).

use std::net::{Ipv4Addr, Ipv6Addr};

use aya::programs::{TestRun as _, TestRunOptions};
use health_agent::datapath::{AttachMode, Datapath, EchoStats, Interface};
use health_common::maps::{EchoConfig, ProgId};

use crate::{
    echo_classes::{Class, Expect},
    pins::PinDir,
    topology::{A_IF, B_IF, TwoNodes},
};

/// A responder for `v4` and `v6` on B's end of the veth, attached in
/// `mode` (A's end gets what native XDP needs there).
#[must_use]
pub fn responder_on_b(
    nodes: &TwoNodes,
    mode: AttachMode,
    v4: Option<Ipv4Addr>,
    v6: Option<Ipv6Addr>,
) -> (Datapath, PinDir) {
    let pins = PinDir::new();
    let mut responder = Datapath::load(pins.path()).expect("load");
    let iface = Interface::new(B_IF, Some(nodes.b.clone()));
    let cfg = responder.set_echo_targets(&iface, v4, v6).expect("address");
    assert_ne!(
        cfg.flags & EchoConfig::REPLY_TO_PEER,
        0,
        "B's veth has its peer in A's namespace: the tc responder hands replies to it"
    );
    let peer = Interface::new(A_IF, Some(nodes.a.clone()));
    responder
        .attach_echo(&iface, mode, Some(&peer))
        .expect("attach");
    (responder, pins)
}

/// The echo program a test run goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prog {
    Xdp,
    Tc,
}

/// A program's return values for a reply, a pass and a drop.
#[derive(Clone, Copy, Debug)]
pub struct Verdicts {
    pub reply: u32,
    pub pass: u32,
    pub drop: u32,
}

impl Prog {
    pub const BOTH: [Self; 2] = [Self::Xdp, Self::Tc];

    #[must_use]
    pub const fn verdicts(self) -> Verdicts {
        match self {
            // XDP_TX, XDP_PASS, XDP_DROP
            Self::Xdp => Verdicts {
                reply: 3,
                pass: 2,
                drop: 1,
            },
            // TC_ACT_REDIRECT, TC_ACT_UNSPEC (TCX_NEXT), TC_ACT_SHOT
            Self::Tc => Verdicts {
                reply: 7,
                pass: u32::MAX,
                drop: 2,
            },
        }
    }
}

/// Runs `prog` once on `input`; returns the verdict and the output packet.
pub fn run(r: &mut Datapath, prog: Prog, input: &[u8]) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; input.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(input),
        data_out: Some(&mut out),
        ..TestRunOptions::default()
    };
    let res = match prog {
        Prog::Xdp => r.xdp(ProgId::EchoXdp).expect("xdp").test_run(opts),
        Prog::Tc => r.classifier(ProgId::EchoTc).expect("tc").test_run(opts),
    }
    .unwrap_or_else(|e| panic!("{prog:?} test run on {} bytes: {e}", input.len()));
    out.truncate(usize::try_from(res.data_size_out).expect("a frame's size"));
    (res.return_value, out)
}

/// Every class through `prog`: the verdict, the exact reply (then checked
/// by `verify`, the tests' own checksum code), an untouched pass, and
/// counters that moved by exactly one, in the right place.
pub fn test_run_classes(
    r: &mut Datapath,
    prog: Prog,
    classes: &[Class],
    verify: impl Fn(&[u8]) -> Result<(), String>,
) {
    let v = prog.verdicts();
    for class in classes {
        let before = r.echo_stats().expect("stats");
        let (verdict, out) = run(r, prog, &class.frame);
        let delta = r.echo_stats().expect("stats").since(before);
        let what = format!("{prog:?}: {}", class.name);
        let [answered, passed, malformed] = match &class.expect {
            Expect::Reply(want) => {
                assert_eq!(verdict, v.reply, "{what}: verdict");
                assert_eq!(&out, want, "{what}: reply bytes");
                verify(&out).unwrap_or_else(|e| panic!("{what}: {e}"));
                [1, 0, 0]
            }
            Expect::Pass => {
                assert_eq!(verdict, v.pass, "{what}: verdict");
                assert_eq!(out, class.frame, "{what}: modified");
                [0, 1, 0]
            }
            Expect::Drop => {
                assert_eq!(verdict, v.drop, "{what}: verdict");
                [0, 0, 1]
            }
        };
        let want = EchoStats {
            answered,
            passed,
            malformed,
        };
        assert_eq!(delta, want, "{what}: counters");
    }
}

/// What else reaches the responder while a class is sent over the veth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Background {
    /// Nothing: a passed class is the only packet passed.
    None,
    /// Neighbour discovery and MLD (IPv6): passed too, never answered.
    Ipv6Control,
}

/// Every class sent over the veth by `send` (which returns the reply, if
/// any) to the attached `responder`, compared with `kernel`, the replies
/// the kernel's own echo gave to the same frames: the responder answers
/// exactly the classes the kernel answers (the expected reply byte for
/// byte, equal to the kernel's in `essentials`), drops what the kernel
/// drops and passes the rest; the counters say which it did.
pub fn against_kernel(
    mode: AttachMode,
    classes: &[Class],
    kernel: &[Option<Vec<u8>>],
    responder: &Datapath,
    send: impl Fn(&[u8]) -> Option<Vec<u8>>,
    essentials: impl Fn(&[u8]) -> Vec<u8>,
    background: Background,
) {
    for (class, by_kernel) in classes.iter().zip(kernel) {
        let what = format!("{mode}: {}", class.name);
        let before = responder.echo_stats().expect("stats");
        let got = send(&class.frame);
        let delta = responder.echo_stats().expect("stats").since(before);
        match &class.expect {
            Expect::Reply(want) => {
                assert_eq!(got.as_ref(), Some(want), "{what}: the responder's reply");
                let k = by_kernel
                    .as_ref()
                    .unwrap_or_else(|| panic!("{what}: the kernel did not answer"));
                assert_eq!(
                    essentials(k),
                    essentials(want),
                    "{what}: kernel vs responder"
                );
                assert_eq!(delta.answered, 1, "{what}: counters {delta:?}");
            }
            Expect::Drop => {
                assert_eq!(got, None, "{what}: answered");
                assert_eq!(by_kernel, &None, "{what}: the kernel answered it");
                assert_eq!(delta.malformed, 1, "{what}: counters {delta:?}");
            }
            Expect::Pass => {
                assert_eq!(got, None, "{what}: answered with the kernel's echo off");
                match background {
                    Background::None => {
                        assert_eq!(delta.passed, 1, "{what}: counters {delta:?}");
                    }
                    Background::Ipv6Control => {
                        assert!(delta.passed >= 1, "{what}: counters {delta:?}");
                        assert_eq!(delta.answered + delta.malformed, 0, "{what}: {delta:?}");
                    }
                }
            }
        }
    }
}
