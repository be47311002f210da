//! The probe loop: a round every probe interval (after the initial delay),
//! liveness echoes between them ([`super::liveness`]), until shutdown. A
//! round in flight at shutdown is abandoned: its probes are dropped with
//! their sockets, and nothing half-done is published.
//!
//! A round that takes the whole interval or longer leaves the next round's
//! tick due as soon as it ends; liveness echoes whose tick came due meanwhile
//! go first then, so a slow round never starves them.

use std::{future::Future, sync::Arc, task::Poll, time::Duration};

use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Prober;

/// Runs rounds until `shutdown`.
pub async fn run(prober: Arc<Prober>, initial_delay: Duration, shutdown: CancellationToken) {
    let cadence = Cadence {
        initial_delay,
        interval: prober.config().interval,
        liveness: prober.config().liveness,
    };
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
        .run_until_cancelled(cadence.drive(round, live))
        .await;
}

/// When rounds and liveness echoes run.
#[derive(Debug, Clone, Copy)]
struct Cadence {
    initial_delay: Duration,
    interval: Duration,
    /// Liveness echoes' interval, `None` when they are off.
    liveness: Option<Duration>,
}

impl Cadence {
    /// Runs `round` every interval and `live` between rounds, one at a time,
    /// for ever.
    async fn drive<R, RF, L, LF>(self, mut round: R, mut live: L)
    where
        R: FnMut() -> RF,
        RF: Future<Output = ()>,
        L: FnMut() -> LF,
        LF: Future<Output = ()>,
    {
        tokio::time::sleep(self.initial_delay).await;
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first echoes go an interval after the first round.
        let every = self.liveness.unwrap_or(ONE_DAY).min(ONE_DAY);
        let mut echo = tokio::time::interval_at(Instant::now() + every, every);
        echo.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let live_on = self.liveness.is_some();
        loop {
            tokio::select! {
                biased;
                _ = tick.tick() => {
                    round().await;
                    if live_on && is_due(&mut echo).await {
                        live().await;
                    }
                }
                _ = echo.tick(), if live_on => live().await,
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
        let log: Log = Rc::default();
        let start = Instant::now();
        let round = || {
            let log = Rc::clone(&log);
            async move {
                log.borrow_mut().push(('R', start.elapsed()));
                tokio::time::sleep(round_takes).await;
            }
        };
        let live = || {
            let log = Rc::clone(&log);
            async move {
                log.borrow_mut().push(('L', start.elapsed()));
                tokio::time::sleep(echoes_take).await;
            }
        };
        let _ = tokio::time::timeout(for_, cadence.drive(round, live)).await;
        log.take()
    }

    fn count(log: &[(char, Duration)], what: char) -> usize {
        log.iter().filter(|(c, _)| *c == what).count()
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_longer_than_the_interval_leave_room_for_liveness() {
        let cadence = Cadence {
            initial_delay: Duration::ZERO,
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
            initial_delay: Duration::from_secs(1),
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
            initial_delay: Duration::ZERO,
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
}
