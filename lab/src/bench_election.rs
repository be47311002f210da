//! The election phase of `bench-etcd-load`: N simulated agents, each with
//! the agent's own etcd client ([`KvStore`]: its own connection and
//! session), campaign for the cluster view's assembler
//! ([`KvStore::campaign`], on the agent's election lease of
//! [`ELECTION_TTL`]); the leader publishes a view every round
//! ([`KvStore::put_if_leader`]) and an observer watches the views' prefix.
//! Mid-run the leader's session ends without a word (its task aborted: no
//! resignation, no revocation, as a SIGKILL): reported, the time until
//! another agent's view arrives, against the bound of the lease's TTL and
//! two rounds; and that one agent alone was leader at any time.

use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, ensure};
use health_agent::{
    cluster::{
        published_view::{PublishedView, election_name, view_prefix},
        view::{ClusterView, VerdictCounts},
    },
    daemon::cluster_view::ELECTION_TTL,
    membership::kvstore::{EtcdConfig, KvStore, Role, WatchEvent},
    util::timefmt::now_ms,
};
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

/// The agents' round in this phase (the shortest probe interval).
const ROUND: Duration = Duration::from_secs(1);
/// The node prefix of the agent's default.
const NODE_PREFIX: &str = "/health/nodes/";

/// One simulated agent: campaigns and, while leading, publishes its view
/// every round.
async fn candidate(store: KvStore, name: String, stop: CancellationToken) {
    let (role_tx, mut role) = watch::channel(Role::Candidate);
    let deposed = Notify::new();
    let election = election_name(NODE_PREFIX);
    let campaign = store.campaign(
        election.as_bytes(),
        name.as_bytes(),
        ELECTION_TTL,
        &role_tx,
        &deposed,
        &stop,
    );
    tokio::pin!(campaign);
    let key = format!("{}{name}", view_prefix(NODE_PREFIX));
    let mut tick = tokio::time::interval(ROUND);
    let mut round = 0;
    loop {
        tokio::select! {
            () = &mut campaign => return,
            _ = role.changed() => {}
            _ = tick.tick() => {
                let Role::Leader(leadership) = role.borrow().clone() else { continue };
                round += 1;
                let view = ClusterView {
                    reports: 0,
                    ignored: 0,
                    counts: VerdictCounts::default(),
                    nodes: Vec::new(),
                    plaintext_nodes: Vec::new(),
                };
                let v = PublishedView::of(&name, round, now_ms(), 1_000, &view);
                if store.put_if_leader(&leadership, key.clone(), v.encode()).await.is_err() {
                    deposed.notify_one();
                }
            }
        }
    }
}

/// Runs the phase against etcd at `endpoint` with `agents` candidates.
pub(crate) async fn election(endpoint: &str, agents: usize) -> anyhow::Result<String> {
    let cfg = EtcdConfig {
        endpoints: vec![endpoint.to_owned()],
        prefix: NODE_PREFIX.to_owned(),
        lease_ttl: Duration::from_mins(15),
        tls: None,
        credentials: None,
        lease_file: None,
        allocations: None,
    };
    let stop = CancellationToken::new();
    let mut tasks = Vec::with_capacity(agents);
    let began = Instant::now();
    for i in 0..agents {
        let name = format!("agent-{i:05}");
        tasks.push((
            name.clone(),
            tokio::spawn(candidate(KvStore::new(&cfg), name, stop.clone())),
        ));
    }
    let observer = KvStore::new(&cfg);
    let mut views = observer.watch_prefix(view_prefix(NODE_PREFIX).into_bytes());
    let prefix = view_prefix(NODE_PREFIX);
    // The first view, and who published it.
    let first = next_view(&mut views, &prefix, None, Duration::from_secs(60)).await?;
    let elected_in = began.elapsed();
    let leader = Arc::new(first);
    // Let it publish a few rounds; check one leader meanwhile.
    let steady = Instant::now() + 3 * ROUND;
    while Instant::now() < steady {
        let by = next_view(&mut views, &prefix, None, 2 * ROUND).await?;
        ensure!(by == *leader, "two agents published: {leader} and {by}");
    }
    let (_, task) = tasks
        .iter()
        .find(|(n, _)| *n == *leader)
        .context("the leader is a candidate")?;
    task.abort();
    let killed = Instant::now();
    let next = next_view(&mut views, &prefix, Some(&leader), Duration::from_secs(30)).await?;
    let took = killed.elapsed();
    stop.cancel();
    for (_, t) in tasks {
        let _ = t.await;
    }
    let bound = ELECTION_TTL + 2 * ROUND;
    Ok(format!(
        "election ({agents} agents campaigning, each with its own etcd client; {} s election lease, {} s rounds):\n  \
         first view by {leader} {:.2} s after the campaigns started\n  \
         the leader's session ended (no resignation): a view by {next} {:.2} s later \
         (bound: the lease's TTL + 2 rounds = {:.0} s) {}\n",
        ELECTION_TTL.as_secs(),
        ROUND.as_secs(),
        elapsed_s(elected_in),
        elapsed_s(took),
        bound.as_secs_f64(),
        if took <= bound { "PASS" } else { "FAIL" }
    ))
}

fn elapsed_s(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The assembler of the next view put under `prefix` (not `other_than`'s).
async fn next_view(
    views: &mut tokio::sync::mpsc::Receiver<WatchEvent>,
    prefix: &str,
    other_than: Option<&str>,
    within: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + within;
    loop {
        let event = tokio::time::timeout_at(deadline, views.recv())
            .await
            .context("no view in time")?
            .context("the watch ended")?;
        let entries = match event {
            WatchEvent::Put(e) => vec![e],
            WatchEvent::Snapshot { entries, .. } => entries,
            WatchEvent::Delete { .. } | WatchEvent::Lost { .. } => continue,
        };
        for e in entries {
            let v = PublishedView::decode(&e.value).context("a published view")?;
            ensure!(
                e.key_str() == format!("{prefix}{}", v.assembler),
                "a view at {:?} by {}",
                e.key_str(),
                v.assembler
            );
            if other_than != Some(v.assembler.as_str()) {
                return Ok(v.assembler);
            }
        }
    }
}
