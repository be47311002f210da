//! `cargo xtask bench soak`: one agent probing N peers behind a router
//! (the `bench round` topology, half of the peers silent) for a long run:
//! its resident set and descriptor count (at rest: the fewest over 1.5 s)
//! sampled every 10 s, its CPU
//! averaged over windows (10 minutes by default); after the warm-up (the
//! first 5 minutes), every sample and every window must stay within
//! ±10 % of their median: no growth, no leak.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::{
    bench_round::{self, Lab, serve_peers},
    usage::usage,
};

#[derive(Debug, Clone, Copy)]
pub(crate) struct Options {
    pub(crate) peers: usize,
    pub(crate) minutes: u64,
    pub(crate) interval: Duration,
}

/// How often RSS and descriptors are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// One sample: the time since the start, CPU time so far, RSS, descriptors.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    cpu: Duration,
    rss_kib: u64,
    fds: usize,
}

pub(crate) fn run(opts: &Options) -> anyhow::Result<String> {
    if opts.minutes == 0 {
        bail!("--minutes must be at least 1");
    }
    let total = Duration::from_secs(opts.minutes * 60);
    // 5 minutes of warm-up and 10-minute CPU windows, shortened for a
    // short run (a third of it, and a third of what is left: two windows
    // fit with room for the samples' late ends, and two are needed to
    // call the CPU flat).
    let warmup = Duration::from_secs(300).min(total / 3);
    let window = Duration::from_secs(600)
        .min(total.saturating_sub(warmup) / 3)
        .max(SAMPLE_EVERY);
    eprintln!(
        "soak: {} peers (half silent), probe interval {:?}, {} min; warm-up {} s, CPU windows {} s",
        opts.peers,
        opts.interval,
        opts.minutes,
        warmup.as_secs(),
        window.as_secs()
    );
    let round_opts = bench_round::Options {
        peers: opts.peers,
        silent_pct: 50,
        rounds: 0,
        interval: opts.interval,
        network_thread: false,
    };
    let mut lab = Lab::new(&round_opts)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let stop_peers = serve_peers(&rt, &lab.peers)?;
    let nodes_file = lab.nodes_file(opts.peers)?;
    let pid = lab.start_agent(&nodes_file, opts.interval)?;
    let start = Instant::now();
    let mut samples = Vec::new();
    while start.elapsed() < total {
        crate::stop::sleep(SAMPLE_EVERY.min(total.saturating_sub(start.elapsed())))?;
        if lab.agent_ended().is_some() {
            bail!(
                "the agent ended {} s into the soak: {}",
                start.elapsed().as_secs(),
                lab.agent_report()
            );
        }
        let (cpu, rss) = usage(pid)?;
        // At rest: the fewest over 1.5 s (a round's probes each hold a
        // socket for a moment).
        let mut fds = usize::MAX;
        for _ in 0..10 {
            let dir = format!("/proc/{pid}/fd");
            let open = std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))?;
            fds = fds.min(open.count());
            crate::stop::sleep(Duration::from_millis(150))?;
        }
        let s = Sample {
            at: start.elapsed(),
            cpu,
            rss_kib: rss.now_kib,
            fds,
        };
        eprintln!(
            "  {:>5} s  RSS {:>7} KiB  fds {:>5}  CPU {:>8.2} s",
            s.at.as_secs(),
            s.rss_kib,
            s.fds,
            s.cpu.as_secs_f64()
        );
        samples.push(s);
    }
    stop_peers.cancel();
    drop(lab);
    let (text, flat) = render(opts, &samples, warmup, window);
    if !flat {
        bail!("not flat:\n{text}");
    }
    Ok(text)
}

/// The median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The largest deviation of `v` from its median, in percent.
fn spread_pct(v: &[f64]) -> f64 {
    let mid = median(&mut v.to_vec());
    if mid == 0.0 {
        return 0.0;
    }
    v.iter()
        .map(|x| (x - mid).abs() / mid * 100.0)
        .fold(0.0, f64::max)
}

fn render(
    opts: &Options,
    samples: &[Sample],
    warmup: Duration,
    window: Duration,
) -> (String, bool) {
    use std::fmt::Write as _;
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.at >= warmup).collect();
    #[allow(
        clippy::cast_precision_loss,
        reason = "kilobytes and descriptors, far below 2^52"
    )]
    let rss: Vec<f64> = steady.iter().map(|s| s.rss_kib as f64).collect();
    #[allow(clippy::cast_precision_loss, reason = "descriptors, far below 2^52")]
    let fds: Vec<f64> = steady.iter().map(|s| s.fds as f64).collect();
    // CPU percent of one core in each whole window after the warm-up.
    let mut cpu = Vec::new();
    let mut from = steady.first().copied();
    for s in &steady {
        if let Some(f) = from
            && s.at >= f.at + window
        {
            // The windows' own lengths, not whole seconds: a window of
            // 10 s read as 10 when it was 10.9 would be 9 % off.
            let secs = s.at.saturating_sub(f.at).as_secs_f64();
            cpu.push((s.cpu.saturating_sub(f.cpu)).as_secs_f64() / secs * 100.0);
            from = Some(*s);
        }
    }
    let (rss_spread, fd_spread, cpu_spread) =
        (spread_pct(&rss), spread_pct(&fds), spread_pct(&cpu));
    // A spread of one window is no evidence of a flat CPU.
    let flat = !steady.is_empty()
        && cpu.len() >= 2
        && rss_spread <= 10.0
        && fd_spread <= 10.0
        && cpu_spread <= 10.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "soak: 1 agent, {} peers (half silent), probe interval {:?}, {} min; samples every {} s, \
         {} after the {} s warm-up; CPU in {} windows of {} s",
        opts.peers,
        opts.interval,
        opts.minutes,
        SAMPLE_EVERY.as_secs(),
        steady.len(),
        warmup.as_secs(),
        cpu.len(),
        window.as_secs()
    );
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        (lo, hi)
    };
    let (r0, r1) = range(&rss);
    let (f0, f1) = range(&fds);
    let (c0, c1) = range(&cpu);
    let _ = writeln!(
        out,
        "  RSS          {r0:>9.0} to {r1:>9.0} KiB   spread {rss_spread:>5.1} % of the median"
    );
    let _ = writeln!(
        out,
        "  descriptors  {f0:>9.0} to {f1:>9.0}       spread {fd_spread:>5.1} %"
    );
    let _ = writeln!(
        out,
        "  CPU          {c0:>9.2} to {c1:>9.2} % of a core  spread {cpu_spread:>5.1} %"
    );
    let _ = writeln!(
        out,
        "  {}",
        if flat {
            "flat: every figure within ±10 % of its median after the warm-up"
        } else {
            "NOT flat: a figure moved more than 10 % from its median after the warm-up"
        }
    );
    (out, flat)
}
