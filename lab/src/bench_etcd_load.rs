//! `bench-etcd-load`: a real etcd under the load of N agents.
//!
//! ```text
//! this process: N simulated agents over a few client connections
//!               (each: its lease, kept alive by its own keepalive stream,
//!               and a ~1.5 KiB summary put with it once per interval)
//!             + W watchers of the summaries prefix, a connection each
//!       │ loopback, gRPC (etcd-client)
//! etcd: a local one (temporary data directory, free ports), removed after
//! ```
//!
//! Each summary carries the time it was made (`"ts_us"`, wall clock, this
//! process); a watcher's delivery latency is its receive time minus that
//! stamp: the put's round trip to consensus plus the watch's fan-out.
//! Reported: puts per second achieved against asked, put latency, watch
//! deliveries (all of them must arrive) and their latency p50/p99/max,
//! etcd's database size (status API) and CPU. PASS when the delivery p99
//! is at most 1 s and no delivery is missing.

use std::{
    fmt::Write as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};
use etcd_client::{Client, ConnectOptions, EventType, PutOptions, WatchOptions};
use health_tests::etcd::LocalEtcd;
use tokio::time::Instant;

pub(crate) struct Options {
    pub(crate) agents: usize,
    pub(crate) seconds: u32,
    pub(crate) interval: Duration,
    pub(crate) watchers: usize,
    /// Client connections the agents' traffic is spread over.
    pub(crate) connections: usize,
}

/// The target: summaries reach every watcher within this, at p99.
const BUDGET: Duration = Duration::from_secs(1);
const PREFIX: &str = "/health/summaries/";
const SUMMARY_BYTES: usize = 1536;
const LEASE_TTL_S: i64 = 10;

#[derive(Default)]
struct Stats {
    puts: AtomicU64,
    put_errors: AtomicU64,
    keepalive_errors: AtomicU64,
    put_latency_us: Mutex<Vec<u64>>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Agent `i`'s summary, stamped now: JSON padded to [`SUMMARY_BYTES`].
fn summary(i: usize, seq: u64) -> Vec<u8> {
    let head = format!(
        "{{\"agent\":\"agent-{i:05}\",\"seq\":{seq},\"ts_us\":{},\"peers\":\"",
        now_us()
    );
    let mut v = head.into_bytes();
    v.resize(SUMMARY_BYTES - 2, b'.');
    v.extend_from_slice(b"\"}");
    v
}

/// The `ts_us` stamp of a summary.
fn stamp(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value.get(..100.min(value.len()))?).ok()?;
    let at = text.find("\"ts_us\":")? + 8;
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "an index into a sample of at most millions"
    )]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[expect(clippy::cast_precision_loss, reason = "microseconds to milliseconds")]
fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

async fn connect(endpoint: &str) -> anyhow::Result<Client> {
    let opts = ConnectOptions::new().with_connect_timeout(Duration::from_secs(3));
    Client::connect([format!("http://{endpoint}")], Some(opts))
        .await
        .with_context(|| format!("connecting to etcd at {endpoint}"))
}

/// One simulated agent: its lease, kept alive, and its summary put with
/// it every `interval` (at its own phase) until `end`.
async fn agent(
    i: usize,
    client: Client,
    opts_interval: Duration,
    phase: Duration,
    start: Instant,
    end: Instant,
    stats: Arc<Stats>,
) -> anyhow::Result<()> {
    let mut leases = client.lease_client();
    let lease = leases.grant(LEASE_TTL_S, None).await?.id();
    let (mut keeper, mut answers) = leases.keep_alive(lease).await?;
    let ka_stats = stats.clone();
    let keepalive = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(3));
        loop {
            tokio::select! {
                _ = tick.tick() => if keeper.keep_alive().await.is_err() {
                    ka_stats.keepalive_errors.fetch_add(1, Ordering::Relaxed);
                },
                msg = answers.message() => if !matches!(msg, Ok(Some(_))) {
                    ka_stats.keepalive_errors.fetch_add(1, Ordering::Relaxed);
                    return;
                },
            }
        }
    });
    let mut tick = tokio::time::interval_at(start + phase, opts_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut kv = client.kv_client();
    let key = format!("{PREFIX}agent-{i:05}");
    let mut latencies = Vec::new();
    for seq in 0.. {
        let at = tick.tick().await;
        if at >= end {
            break;
        }
        let sent = Instant::now();
        match kv
            .put(
                key.clone(),
                summary(i, seq),
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
        {
            Ok(_) => {
                stats.puts.fetch_add(1, Ordering::Relaxed);
                latencies.push(u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            Err(_) => {
                stats.put_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    keepalive.abort();
    if let Ok(mut all) = stats.put_latency_us.lock() {
        all.extend(latencies);
    }
    Ok(())
}

/// One watcher of the prefix: the delivery latency of every put it sees,
/// until `stop`.
async fn watcher(client: Client, stop: Instant) -> anyhow::Result<Vec<u64>> {
    let mut stream = client
        .watch_client()
        .watch(PREFIX, Some(WatchOptions::new().with_prefix()))
        .await?;
    let mut latencies = Vec::new();
    loop {
        let msg = tokio::select! {
            m = stream.message() => m?,
            () = tokio::time::sleep_until(stop) => break,
        };
        let Some(resp) = msg else {
            bail!("the watch ended");
        };
        if resp.canceled() {
            bail!("the watch was canceled: {}", resp.cancel_reason());
        }
        let now = now_us();
        for ev in resp.events() {
            if ev.event_type() == EventType::Put
                && let Some(ts) = ev.kv().and_then(|kv| stamp(kv.value()))
            {
                latencies.push(now.saturating_sub(ts));
            }
        }
    }
    Ok(latencies)
}

/// etcd's CPU time so far (user + system), from /proc.
fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
    Some(Duration::from_millis(ticks * 1000 / hz.max(1)))
}

pub(crate) fn run(opts: &Options) -> anyhow::Result<String> {
    let etcd = LocalEtcd::start();
    let pid = etcd.pid().context("etcd's pid")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = rt.block_on(load(opts, &etcd.endpoint, pid))?;
    drop(etcd);
    Ok(report)
}

async fn load(opts: &Options, endpoint: &str, pid: u32) -> anyhow::Result<String> {
    let mut clients = Vec::new();
    for _ in 0..opts.connections.max(1) {
        clients.push(connect(endpoint).await?);
    }
    let interval = opts.interval;
    // Agents start once every watcher is in place.
    let start = Instant::now() + Duration::from_secs(2);
    let end = start + Duration::from_secs(u64::from(opts.seconds));
    let drain = end + Duration::from_secs(3);
    let mut watchers = Vec::new();
    for _ in 0..opts.watchers {
        let c = connect(endpoint).await?;
        watchers.push(tokio::spawn(watcher(c, drain)));
    }
    let stats = Arc::new(Stats::default());
    let cpu_before = cpu_time(pid);
    let wall = Instant::now();
    let mut agents = Vec::new();
    for i in 0..opts.agents {
        let c = clients[i % clients.len()].clone();
        // Phases spread evenly over the interval.
        #[expect(
            clippy::cast_precision_loss,
            reason = "an agent's share of the interval"
        )]
        let phase = interval.mul_f64(i as f64 / opts.agents as f64);
        agents.push(tokio::spawn(agent(
            i,
            c,
            interval,
            phase,
            start,
            end,
            stats.clone(),
        )));
    }
    for a in agents {
        a.await.context("agent task")??;
    }
    let cpu_after = cpu_time(pid);
    let wall = wall.elapsed();
    let mut delivered: Vec<u64> = Vec::new();
    let mut per_watcher = Vec::new();
    for w in watchers {
        let l = w.await.context("watcher task")??;
        per_watcher.push(l.len());
        delivered.extend(l);
    }
    delivered.sort_unstable();
    let etcd_status = clients[0].status().await.context("etcd status")?;
    let mut put_latency = stats
        .put_latency_us
        .lock()
        .map(|l| l.clone())
        .unwrap_or_default();
    put_latency.sort_unstable();
    Ok(render(&Outcome {
        opts,
        connections: clients.len(),
        stats: &stats,
        put_latency: &put_latency,
        delivered: &delivered,
        per_watcher: &per_watcher,
        etcd: &etcd_status,
        etcd_cpu: cpu_before
            .zip(cpu_after)
            .map(|(b, a)| (a.saturating_sub(b), wall)),
    }))
}

/// What a run measured.
struct Outcome<'a> {
    opts: &'a Options,
    connections: usize,
    stats: &'a Stats,
    /// Sorted, in microseconds.
    put_latency: &'a [u64],
    /// Sorted, in microseconds, every watcher's.
    delivered: &'a [u64],
    per_watcher: &'a [usize],
    etcd: &'a etcd_client::StatusResponse,
    /// etcd's CPU time over the wall time of the run.
    etcd_cpu: Option<(Duration, Duration)>,
}

fn render(o: &Outcome<'_>) -> String {
    let opts = o.opts;
    let puts = o.stats.puts.load(Ordering::Relaxed);
    let secs = f64::from(opts.seconds);
    #[expect(clippy::cast_precision_loss, reason = "counts for display")]
    let (asked, achieved) = (
        opts.agents as f64 / opts.interval.as_secs_f64(),
        puts as f64 / secs,
    );
    let expected = puts * u64::try_from(opts.watchers).unwrap_or(0);
    let got = u64::try_from(o.delivered.len()).unwrap_or(u64::MAX);
    let p99 = percentile(o.delivered, 0.99);
    let pass = u128::from(p99) <= BUDGET.as_micros() && got == expected && got > 0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "etcd {} on loopback; {} agents over {} connections, a {SUMMARY_BYTES} B summary each every {:?} with its lease (TTL {LEASE_TTL_S} s, kept alive by its own stream); {} watchers of {PREFIX}, one connection each; {} s",
        o.etcd.version(),
        opts.agents,
        o.connections,
        opts.interval,
        opts.watchers,
        opts.seconds
    );
    let _ = writeln!(
        out,
        "writes:      {achieved:.0} puts/s achieved of {asked:.0} asked ({puts} puts, {} errors, {} keepalive errors); put latency p50 {:.1} ms, p99 {:.1} ms",
        o.stats.put_errors.load(Ordering::Relaxed),
        o.stats.keepalive_errors.load(Ordering::Relaxed),
        ms(percentile(o.put_latency, 0.5)),
        ms(percentile(o.put_latency, 0.99)),
    );
    let _ = writeln!(
        out,
        "deliveries:  {got} of {expected} expected ({:?} per watcher); latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        o.per_watcher,
        ms(percentile(o.delivered, 0.5)),
        ms(p99),
        ms(o.delivered.last().copied().unwrap_or(0)),
    );
    #[expect(clippy::cast_precision_loss, reason = "bytes to MiB for display")]
    let mib = |b: i64| b as f64 / (1024.0 * 1024.0);
    let _ = writeln!(
        out,
        "etcd:        db size {:.1} MiB ({:.1} MiB in use; no compaction during the run), raft index {}; CPU {}",
        mib(o.etcd.db_size()),
        mib(o.etcd.raft_used_db_size()),
        o.etcd.raft_index(),
        o.etcd_cpu.map_or_else(
            || "unknown".into(),
            |(cpu, wall)| format!(
                "{:.0} % of a core",
                cpu.as_secs_f64() * 100.0 / wall.as_secs_f64()
            )
        )
    );
    let _ = writeln!(
        out,
        "{}: watch delivery p99 {:.1} ms against {} ms{}",
        if pass { "PASS" } else { "FAIL" },
        ms(p99),
        BUDGET.as_millis(),
        if got == expected {
            String::new()
        } else {
            format!(", {} deliveries missing", expected.saturating_sub(got))
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_stamped_and_sized() {
        let s = summary(7, 3);
        assert_eq!(s.len(), SUMMARY_BYTES);
        let ts = stamp(&s).expect("a stamp");
        assert!(now_us() >= ts && now_us() - ts < 1_000_000);
        assert!(serde_json::from_slice::<serde_json::Value>(&s).is_ok());
    }

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 51);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&[], 0.99), 0);
    }
}
