//! The summary's wire format, version 2 (the hand-written binary form)
//! against version 3 (the protobuf message), side by side on the
//! summaries of one simulated round: bytes per summary and the time to
//! decode every node's summary on one CPU; and the largest summary a node
//! writes ([`MAX_PEERS`] peers).

use std::{
    fmt::Write as _,
    hint::black_box,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::sim_nodes::{name, rtt_us};
use health_agent::{
    cluster::summary::{MAX_PEERS, PathSample, PeerSummary, Summary},
    probe::path::ProbeResult,
};

/// Decoding every summary this many times; the fastest pass is kept (the
/// others were slowed by something else on the machine).
const PASSES: usize = 3;

/// One format's figures.
struct Figures {
    bytes_mean: f64,
    bytes_max: usize,
    /// Every summary decoded once, the fastest pass.
    decode: Duration,
}

#[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
fn ratio(a: usize, b: usize) -> f64 {
    a as f64 / b.max(1) as f64
}

fn figures(encoded: &[Vec<u8>]) -> anyhow::Result<Figures> {
    let total: usize = encoded.iter().map(Vec::len).sum();
    let mut decode = Duration::MAX;
    for _ in 0..PASSES {
        let t0 = Instant::now();
        for b in encoded {
            black_box(Summary::decode(black_box(b)).context("a summary that does not decode")?);
        }
        decode = decode.min(t0.elapsed());
    }
    Ok(Figures {
        bytes_mean: ratio(total, encoded.len()),
        bytes_max: encoded.iter().map(Vec::len).max().unwrap_or(0),
        decode,
    })
}

/// A summary of [`MAX_PEERS`] simulated nodes, all reachable.
fn largest() -> anyhow::Result<Summary> {
    let peers = (1..=MAX_PEERS)
        .map(|t| {
            PeerSummary::new(
                name(t),
                std::array::from_fn(|p| {
                    PathSample::new(ProbeResult::Success, Some(rtt_us(0, t, p, 1)))
                }),
            )
        })
        .collect();
    Ok(Summary::new(name(0), 1, 1, peers)?)
}

/// The comparison, as report lines; `published`: one round's summaries as
/// agents write them (version 3).
pub(crate) fn compare(published: &[Vec<u8>]) -> anyhow::Result<String> {
    let summaries = published
        .iter()
        .map(|b| Summary::decode(b))
        .collect::<Result<Vec<_>, _>>()?;
    let v2: Vec<Vec<u8>> = summaries.iter().map(Summary::encode_version_2).collect();
    let v3: Vec<Vec<u8>> = summaries.iter().map(Summary::encode).collect();
    let (f2, f3) = (figures(&v2)?, figures(&v3)?);
    let big = largest()?;
    let (big2, big3) = (big.encode_version_2(), big.encode());
    let (b2, b3) = (figures(&[big2])?, figures(&[big3])?);
    let n = summaries.len();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let us_each = |d: Duration| d.as_secs_f64() * 1e6 / ratio(n, 1);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nsummary format, version 2 (hand-written) against 3 (protobuf), one round's {n} summaries, decoded on one CPU (fastest of {PASSES} passes):"
    );
    for (v, f, b) in [(2, &f2, &b2), (3, &f3, &b3)] {
        let _ = writeln!(
            s,
            "  version {v}: {:.0} B mean, {} B largest; decoding all {:.0} ms ({:.2} µs each); {MAX_PEERS} peers: {} B, decoded in {:.2} ms",
            f.bytes_mean,
            f.bytes_max,
            ms(f.decode),
            us_each(f.decode),
            b.bytes_max,
            ms(b.decode)
        );
    }
    let _ = writeln!(
        s,
        "  version 3 / version 2: bytes {:.3}, decode time {:.2}; {MAX_PEERS} peers: bytes {:.3}, decode time {:.2}",
        f3.bytes_mean / f2.bytes_mean,
        f3.decode.as_secs_f64() / f2.decode.as_secs_f64(),
        b3.bytes_mean / b2.bytes_mean,
        b3.decode.as_secs_f64() / b2.decode.as_secs_f64()
    );
    Ok(s)
}
