//! `bench-linear`: whether the agent's CPU per round grows linearly with
//! its peers. `bench-round` at each size, in passes whose order alternates
//! (smallest first, then largest first, ...), so that a machine that gets
//! faster or slower during the run weighs on every size alike; then the
//! agent's CPU per round per peer at each size, averaged over the passes,
//! and their spread (largest over smallest).
//!
//! Run one size at a time, hours apart, the per-peer figures move by up
//! to 30 % with the machine's per-packet cost, more than with anything the
//! agent does per round: the spread is only meaningful within one run.

use std::{fmt::Write as _, time::Duration};

use anyhow::bail;

use crate::bench_round;

pub(crate) struct Options {
    pub(crate) sizes: Vec<usize>,
    /// What every size runs with (its `peers` set by the size).
    pub(crate) each: bench_round::Options,
    pub(crate) passes: u32,
    /// The largest spread that passes, in percent.
    pub(crate) within_pct: f64,
}

/// One size's CPU per round per peer in each pass.
struct Size {
    peers: usize,
    per_pass: Vec<Duration>,
}

impl Size {
    fn mean(&self) -> Duration {
        let n = u32::try_from(self.per_pass.len())
            .unwrap_or(u32::MAX)
            .max(1);
        self.per_pass.iter().sum::<Duration>() / n
    }
}

/// The sizes in the order pass `pass` runs them: ascending in even passes,
/// descending in odd ones.
fn order(sizes: &[usize], pass: u32) -> Vec<usize> {
    let mut v = sizes.to_vec();
    v.sort_unstable();
    if pass % 2 == 1 {
        v.reverse();
    }
    v
}

/// The spread of `means`: the largest over the smallest, less one, in
/// percent.
fn spread_pct(means: &[Duration]) -> f64 {
    let lo = means.iter().min().map_or(0.0, Duration::as_secs_f64);
    let hi = means.iter().max().map_or(0.0, Duration::as_secs_f64);
    if lo > 0.0 {
        100.0 * (hi / lo - 1.0)
    } else {
        f64::INFINITY
    }
}

pub(crate) fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> anyhow::Result<String> {
    if opts.sizes.len() < 2 {
        bail!("--sizes needs at least two sizes, e.g. 500,2000,5000,10000");
    }
    if opts.each.rounds < 2 {
        bail!(
            "--rounds {}: at least 2 (the first round is not a steady one)",
            opts.each.rounds
        );
    }
    let mut sizes: Vec<Size> = order(&opts.sizes, 0)
        .into_iter()
        .map(|peers| Size {
            peers,
            per_pass: Vec::new(),
        })
        .collect();
    for pass in 0..opts.passes.max(1) {
        for peers in order(&opts.sizes, pass) {
            progress(&format!(
                "pass {} of {}: {peers} peers",
                pass + 1,
                opts.passes.max(1)
            ));
            let report = bench_round::run(&bench_round::Options { peers, ..opts.each })?;
            for line in report.text().lines() {
                progress(&format!("  {line}"));
            }
            let Some(per_peer) = report.cpu_per_peer() else {
                bail!("{peers} peers: no steady round was measured");
            };
            if let Some(s) = sizes.iter_mut().find(|s| s.peers == peers) {
                s.per_pass.push(per_peer);
            }
        }
    }
    Ok(render(opts, &sizes))
}

fn render(opts: &Options, sizes: &[Size]) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "bench-linear: agent CPU per round per peer, {}% silent, {} rounds at {} ms, {} passes in alternating order",
        opts.each.silent_pct,
        opts.each.rounds,
        opts.each.interval.as_millis(),
        opts.passes.max(1)
    );
    for s in sizes {
        let passes: Vec<String> = s
            .per_pass
            .iter()
            .map(|d| format!("{:.3}", ms(*d)))
            .collect();
        let _ = writeln!(
            text,
            "{:>6} peers: {:.3} ms a peer, {:.1} µs a probe (passes: {})",
            s.peers,
            ms(s.mean()),
            ms(s.mean()) * 1000.0 / f64::from(bench_round::PROBES_A_PEER),
            passes.join(", ")
        );
    }
    let means: Vec<Duration> = sizes.iter().map(Size::mean).collect();
    let spread = spread_pct(&means);
    let _ = writeln!(
        text,
        "spread: {spread:.1} % (largest over smallest; target within {:.0} %): {}",
        opts.within_pct,
        if spread <= opts.within_pct {
            "met"
        } else {
            "NOT met"
        }
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_alternate_the_order_of_the_sizes() {
        let sizes = [5000, 500, 10_000, 2000];
        assert_eq!(order(&sizes, 0), [500, 2000, 5000, 10_000]);
        assert_eq!(order(&sizes, 1), [10_000, 5000, 2000, 500]);
        assert_eq!(order(&sizes, 2), [500, 2000, 5000, 10_000]);
    }

    #[test]
    fn the_spread_is_the_largest_over_the_smallest() {
        let us = Duration::from_micros;
        assert!((spread_pct(&[us(100), us(120), us(110)]) - 20.0).abs() < 1e-9);
        assert!(spread_pct(&[us(100), us(100)]).abs() < 1e-9);
        assert!(spread_pct(&[us(0), us(100)]).is_infinite());
    }

    #[test]
    fn a_size_averages_its_passes() {
        let s = Size {
            peers: 500,
            per_pass: vec![Duration::from_micros(110), Duration::from_micros(130)],
        };
        assert_eq!(s.mean(), Duration::from_micros(120));
    }
}
