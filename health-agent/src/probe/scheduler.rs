//! The probe loop: a round every probe interval (after the initial delay),
//! liveness echoes between them ([`super::liveness`]), until shutdown. A
//! round in flight at shutdown is abandoned: its probes are dropped with
//! their sockets, and nothing half-done is published.
//!
//! A node that joins the set is not left unknown until the next tick: the
//! nodes never probed get a round of their own ([`Prober::probe_joined`])
//! [`JOINED_GAP`] after the last round began, or at once when that is
//! past (an agent that found its peers in etcd after its first round, a
//! node that joins a full mesh too large for liveness echoes). However
//! many nodes join, and however often, that is at most one such round a
//! gap, each over the nodes not probed yet (and those such rounds left
//! undecided, a few times), and quiet: no round number, history slot or
//! summary of its own (see `RoundKind::Joined`).
//!
//! A round that takes the whole interval or longer leaves the next round's
//! tick due as soon as it ends, and a round of the nodes that joined in a
//! tick's way delays that round alone: the ticks keep their times.
//! Liveness echoes whose tick came due meanwhile go first then, so a slow
//! round never starves them.

use std::{future::Future, pin::pin, sync::Arc, task::Poll, time::Duration};

use tokio::{
    sync::watch,
    time::{Instant, Interval, MissedTickBehavior},
};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Prober;

/// The least time from a round's start to the round of the nodes that
/// joined: a node set that changes at every sync (once a second at
/// most, by default) sets off no more of them.
pub const JOINED_GAP: Duration = Duration::from_secs(1);

/// When the first round goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum First {
    /// At start-up, after this delay (`--probe-initial-delay`): nothing
    /// goes before it.
    After(Duration),
    /// After a reload, this long on (the rounds' cadence goes on), with
    /// liveness echoes and the rounds of the nodes that joined meanwhile.
    Resumed(Duration),
}

/// Runs rounds until `shutdown`.
pub async fn run(prober: Arc<Prober>, first: First, shutdown: CancellationToken) {
    let cadence = Cadence {
        first,
        interval: prober.config().interval,
        liveness: prober.config().liveness,
    };
    let joins = prober.joins();
    let round = || {
        let prober = Arc::clone(&prober);
        async move {
            let summary = prober.run_round().await;
            if let Some(r) = &summary.round {
                debug!(
                    seq = r.seq,
                    probes = r.probes,
                    duration_ms = r.duration_ms,
                    reachable = summary.reachable,
                    "probe round"
                );
            }
        }
    };
    let joined = || {
        let prober = Arc::clone(&prober);
        async move {
            let nodes = prober.probe_joined().await;
            if nodes > 0 {
                debug!(nodes, "nodes that joined (or were left undecided) probed");
            }
        }
    };
    let live = || {
        let prober = Arc::clone(&prober);
        async move {
            let l = prober.liveness().await;
            if l.unanswered > 0 {
                debug!(
                    echoes = l.echoes,
                    unanswered = l.unanswered,
                    escalated = l.escalated,
                    "liveness echoes"
                );
            }
        }
    };
    shutdown
        .run_until_cancelled(cadence.drive(
            Runs {
                round,
                live,
                joined,
            },
            joins,
        ))
        .await;
}

/// When rounds and liveness echoes run.
#[derive(Debug, Clone, Copy)]
struct Cadence {
    first: First,
    interval: Duration,
    /// Liveness echoes' interval, `None` when they are off.
    liveness: Option<Duration>,
}

/// What the cadence runs: the rounds, the liveness echoes and the rounds
/// of the nodes that joined.
struct Runs<R, L, J> {
    round: R,
    live: L,
    joined: J,
}

/// When the round of the nodes that joined is due.
#[derive(Debug, Default)]
struct Joined {
    /// When the last round (of either kind) began.
    last_start: Option<Instant>,
    /// When the round of the nodes that joined is due, if any joined.
    due: Option<Instant>,
}

impl Joined {
    /// A round of either kind begins: it probes the nodes joined so far.
    fn begin(&mut self, joins: &mut watch::Receiver<u64>) {
        joins.borrow_and_update();
        self.due = None;
        self.last_start = Some(Instant::now());
    }

    /// Nodes joined at `now`: their round is due a gap after the last
    /// round began, or at once when that is past.
    fn joined(&mut self, now: Instant) -> Instant {
        let due = self.last_start.map_or(now, |t| (t + JOINED_GAP).max(now));
        *self.due.insert(self.due.map_or(due, |d| d.min(due)))
    }
}

impl Cadence {
    /// Runs the rounds every interval, the rounds of the nodes that
    /// joined when they do, and liveness echoes between rounds, one at a
    /// time, for ever.
    async fn drive<R, RF, L, LF, J, JF>(
        self,
        mut runs: Runs<R, L, J>,
        mut joins: watch::Receiver<u64>,
    ) where
        R: FnMut() -> RF,
        RF: Future<Output = ()>,
        L: FnMut() -> LF,
        LF: Future<Output = ()>,
        J: FnMut() -> JF,
        JF: Future<Output = ()>,
    {
        let mut joined = Joined::default();
        let (first, resumed) = match self.first {
            First::After(delay) => {
                tokio::time::sleep(delay).await;
                (Instant::now(), false)
            }
            First::Resumed(delay) => {
                // Nodes may have joined the prober this one took over from
                // without a round: looked for a gap on (a lookup when none
                // did).
                let now = Instant::now();
                joined.last_start = Some(now);
                joined.due = Some(now + JOINED_GAP);
                (now + delay, true)
            }
        };
        let mut tick = tokio::time::interval_at(first, self.interval);
        // A tick missed (a round of the nodes that joined, or a round
        // longer than the interval, in its way) goes as soon as it can,
        // and the ticks after it keep their times.
        tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        // The first echoes go an interval after the first round, or after
        // the reload.
        let every = self.liveness.unwrap_or(ONE_DAY).min(ONE_DAY);
        let echo_from = if resumed { Instant::now() } else { first };
        let mut echo = tokio::time::interval_at(echo_from + every, every);
        echo.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let live_on = self.liveness.is_some();
        let mut joins_open = true;
        let mut due = pin!(tokio::time::sleep_until(
            joined.due.unwrap_or_else(|| Instant::now() + ONE_DAY)
        ));
        loop {
            tokio::select! {
                biased;
                _ = tick.tick() => {
                    joined.begin(&mut joins);
                    (runs.round)().await;
                    if live_on && is_due(&mut echo).await {
                        (runs.live)().await;
                    }
                }
                () = &mut due, if joined.due.is_some() => {
                    joined.begin(&mut joins);
                    (runs.joined)().await;
                    if live_on && is_due(&mut echo).await {
                        (runs.live)().await;
                    }
                }
                changed = joins.changed(), if joins_open => match changed {
                    Ok(()) => {
                        let at = joined.joined(Instant::now());
                        due.as_mut().reset(at);
                    }
                    Err(_) => joins_open = false,
                },
                _ = echo.tick(), if live_on => (runs.live)().await,
            }
        }
    }
}

/// Whether `interval`'s tick is due now; a due tick is taken.
async fn is_due(interval: &mut Interval) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(interval.poll_tick(cx).is_ready())).await
}

/// A timer that never fires in practice (liveness echoes off).
const ONE_DAY: Duration = Duration::from_hours(24);

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, rc::Rc};

    use super::*;

    /// What ran, in order: `R` a round, `L` liveness echoes.
    type Log = Rc<RefCell<Vec<(char, Duration)>>>;

    async fn run_for(
        cadence: Cadence,
        round_takes: Duration,
        echoes_take: Duration,
        for_: Duration,
    ) -> Vec<(char, Duration)> {
        let script = Script {
            round_takes,
            echoes_take,
            ..Script::default()
        };
        run_script(cadence, &script, for_).await
    }

    /// What the rounds and echoes do, and when nodes join.
    #[derive(Default)]
    struct Script {
        round_takes: Duration,
        echoes_take: Duration,
        /// A round of the nodes that joined: a tenth of a round when zero.
        joined_takes: Duration,
        joins_at: Vec<Duration>,
    }

    /// What ran, in order: `R` a round, `L` liveness echoes, `J` a round
    /// of the nodes that joined.
    async fn run_script(
        cadence: Cadence,
        script: &Script,
        for_: Duration,
    ) -> Vec<(char, Duration)> {
        let log: Log = Rc::default();
        let start = Instant::now();
        let run = |what: char, takes: Duration| {
            let log = Rc::clone(&log);
            async move {
                log.borrow_mut().push((what, start.elapsed()));
                tokio::time::sleep(takes).await;
            }
        };
        let runs = Runs {
            round: || run('R', script.round_takes),
            live: || run('L', script.echoes_take),
            joined: || {
                let takes = if script.joined_takes.is_zero() {
                    script.round_takes / 10
                } else {
                    script.joined_takes
                };
                run('J', takes)
            },
        };
        let (joined, joins) = watch::channel(0u64);
        let join = async {
            for at in &script.joins_at {
                tokio::time::sleep_until(start + *at).await;
                joined.send_modify(|n| *n += 1);
            }
            std::future::pending::<()>().await;
        };
        let _ = tokio::time::timeout(for_, async {
            tokio::select! {
                () = cadence.drive(runs, joins) => {}
                () = join => {}
            }
        })
        .await;
        log.take()
    }

    fn starts(log: &[(char, Duration)]) -> Vec<(char, Duration)> {
        log.iter().filter(|(c, _)| *c != 'L').copied().collect()
    }

    fn at(what: char, s: f64) -> (char, Duration) {
        (what, Duration::from_secs_f64(s))
    }

    #[tokio::test(start_paused = true)]
    async fn nodes_that_join_are_probed_within_a_gap_and_the_rounds_keep_their_cadence() {
        let cadence = Cadence {
            first: First::After(Duration::ZERO),
            interval: Duration::from_secs(60),
            liveness: None,
        };
        let script = Script {
            round_takes: Duration::from_millis(1_500),
            // During the first round, past its gap when it ends; during
            // that and a round of joined nodes; a burst; one long after;
            // one during a round, again past the gap when it ends.
            joins_at: [0.2, 1.3, 1.4, 1.6, 30.0, 60.1]
                .map(Duration::from_secs_f64)
                .to_vec(),
            ..Script::default()
        };
        let log = run_script(cadence, &script, Duration::from_secs(62)).await;
        assert_eq!(
            starts(&log),
            [
                at('R', 0.0),
                at('J', 1.5),
                at('J', 2.5),
                at('J', 30.0),
                at('R', 60.0),
                at('J', 61.5)
            ],
            "{log:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_of_nodes_that_joined_over_a_tick_delays_that_round_alone() {
        let cadence = Cadence {
            first: First::After(Duration::ZERO),
            interval: Duration::from_secs(60),
            liveness: None,
        };
        let script = Script {
            round_takes: Duration::from_millis(500),
            joined_takes: Duration::from_secs(2),
            joins_at: vec![Duration::from_secs(59)],
            ..Script::default()
        };
        let log = run_script(cadence, &script, Duration::from_secs(182)).await;
        assert_eq!(
            starts(&log),
            [
                at('R', 0.0),
                at('J', 59.0),
                at('R', 61.0),
                at('R', 120.0),
                at('R', 180.0)
            ],
            "{log:?}"
        );
    }

    fn count(log: &[(char, Duration)], what: char) -> usize {
        log.iter().filter(|(c, _)| *c == what).count()
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_longer_than_the_interval_leave_room_for_liveness() {
        let cadence = Cadence {
            first: First::After(Duration::ZERO),
            interval: Duration::from_secs(2),
            liveness: Some(Duration::from_secs(3)),
        };
        let log = run_for(
            cadence,
            Duration::from_millis(2_500),
            Duration::from_millis(100),
            Duration::from_secs(60),
        )
        .await;
        assert!(count(&log, 'R') >= 20, "rounds kept going: {log:?}");
        // Echoes go at most a round later than their interval says.
        let echoes: Vec<Duration> = log
            .iter()
            .filter(|(c, _)| *c == 'L')
            .map(|(_, at)| *at)
            .collect();
        assert!(echoes.len() >= 10, "echoes ran between the rounds: {log:?}");
        assert!(echoes[0] <= Duration::from_millis(5_500), "{log:?}");
        assert!(
            echoes
                .windows(2)
                .all(|w| w[1].saturating_sub(w[0]) <= Duration::from_millis(3_000 + 2_500 + 100)),
            "{log:?}"
        );
        // Never two echoes in a row while rounds are due.
        assert!(
            log.windows(2).all(|w| !(w[0].0 == 'L' && w[1].0 == 'L')),
            "{log:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn quick_rounds_keep_their_cadence_and_echoes_theirs() {
        let cadence = Cadence {
            first: First::After(Duration::from_secs(1)),
            interval: Duration::from_secs(10),
            liveness: Some(Duration::from_secs(3)),
        };
        let log = run_for(
            cadence,
            Duration::from_millis(500),
            Duration::from_millis(10),
            Duration::from_secs(61),
        )
        .await;
        let starts: Vec<Duration> = log
            .iter()
            .filter(|(c, _)| *c == 'R')
            .map(|(_, at)| *at)
            .collect();
        assert_eq!(
            starts,
            (0..7)
                .map(|i| Duration::from_secs(1 + 10 * i))
                .collect::<Vec<_>>(),
            "a round every interval after the delay"
        );
        // Echoes every 3 s from 4 s: 4, 7, ..., 58 s.
        assert_eq!(count(&log, 'L'), 19, "{log:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn no_echoes_when_liveness_is_off() {
        let cadence = Cadence {
            first: First::After(Duration::ZERO),
            interval: Duration::from_secs(1),
            liveness: None,
        };
        let log = run_for(
            cadence,
            Duration::from_millis(1_500),
            Duration::ZERO,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(count(&log, 'L'), 0);
        assert!(count(&log, 'R') >= 19, "{log:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn joins_one_after_another_leave_room_for_liveness() {
        let cadence = Cadence {
            first: First::After(Duration::ZERO),
            interval: Duration::from_secs(60),
            liveness: Some(Duration::from_secs(3)),
        };
        // Nodes that do not answer yet: each round of them takes a
        // timeout, and another node joins during each.
        let script = Script {
            round_takes: Duration::from_millis(500),
            joined_takes: Duration::from_secs(1),
            joins_at: (1..60).map(|i| Duration::from_millis(500 * i)).collect(),
            ..Script::default()
        };
        let log = run_script(cadence, &script, Duration::from_secs(30)).await;
        let echoes: Vec<Duration> = log
            .iter()
            .filter(|(c, _)| *c == 'L')
            .map(|(_, at)| *at)
            .collect();
        assert!(echoes.len() >= 9, "{log:?}");
        assert!(
            echoes
                .windows(2)
                .all(|w| w[1].saturating_sub(w[0]) <= Duration::from_secs(3 + 1)),
            "an echo at most a round of joined nodes late: {log:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_reload_echoes_and_the_rounds_of_nodes_that_joined_go_on() {
        let cadence = Cadence {
            first: First::Resumed(Duration::from_secs(60)),
            interval: Duration::from_secs(60),
            liveness: Some(Duration::from_secs(3)),
        };
        let script = Script {
            round_takes: Duration::from_millis(500),
            joins_at: vec![Duration::from_secs(5)],
            ..Script::default()
        };
        let log = run_script(cadence, &script, Duration::from_secs(61)).await;
        // A look for nodes that joined before the reload, one for the
        // join, and the rounds' cadence from an interval on.
        assert_eq!(
            starts(&log),
            [at('J', 1.0), at('J', 5.0), at('R', 60.0)],
            "{log:?}"
        );
        assert_eq!(
            log.iter().find(|(c, _)| *c == 'L'),
            Some(&at('L', 3.0)),
            "{log:?}"
        );
    }
}
