//! When a lease's keep-alives go out, and when one left unanswered means
//! that the member carrying the stream no longer serves.
//!
//! A keep-alive goes out every third of the lease's TTL. etcd answers one
//! in milliseconds, through any member with a leader. A member cut off
//! from the others (a partition, its peer traffic dropped) leaves it
//! unanswered: etcd itself only ends such a stream once the member has
//! gone without a leader for about three election timeouts, and with a
//! short TTL that is the lease's whole life. Once a keep-alive has gone
//! unanswered for [`answer_wait`], a new stream is opened (through
//! whichever member the client picks) and the old one dropped when the new
//! one's first keep-alive is answered; the session goes on, the link up.
//! With a TTL of 4 s the silence is seen 1.8 s after the last renewal at
//! the latest, which leaves time for four tries of 0.5 s each before the
//! lease ends. A leader election is ridden out the same way: new streams
//! are tried for 3 s at least (members without a leader refuse them at
//! once), and the old stream is still heard, its keep-alive answered once
//! a leader is elected.

use std::time::Duration;

use etcd_client::{LeaseClient, LeaseKeepAliveResponse, LeaseKeepAliveStream, LeaseKeeper};
use tokio::time::{Instant, Interval, MissedTickBehavior, error::Elapsed};
use tracing::{debug, info};

use super::{KvError, REQUEST_TIMEOUT, call_error};

/// How long a keep-alive may go unanswered before its member is taken as
/// not serving: an eighth of the TTL, at most [`REQUEST_TIMEOUT`] (the
/// wait of any other request).
#[must_use]
pub(super) fn answer_wait(ttl: Duration) -> Duration {
    (ttl / 8).min(REQUEST_TIMEOUT)
}

/// The keep-alives of one lease session: whether one is unanswered, and
/// since when.
#[derive(Debug)]
pub(super) struct Beat {
    wait: Duration,
    unanswered_since: Option<Instant>,
}

impl Beat {
    /// A session whose keep-alives may go unanswered for `wait`.
    #[must_use]
    pub(super) fn new(wait: Duration) -> Self {
        Self {
            wait,
            unanswered_since: None,
        }
    }

    /// How long a keep-alive may go unanswered.
    #[must_use]
    pub(super) fn wait(&self) -> Duration {
        self.wait
    }

    /// A keep-alive went out at `now`. One already unanswered keeps its
    /// time: a member that answers none is not given a new wait per tick.
    pub(super) fn sent(&mut self, now: Instant) {
        self.unanswered_since.get_or_insert(now);
    }

    /// etcd answered: nothing is unanswered any more.
    pub(super) fn answered(&mut self) {
        self.unanswered_since = None;
    }

    /// When the keep-alive left unanswered counts as silence; `None` when
    /// none is.
    #[must_use]
    pub(super) fn silent_at(&self) -> Option<Instant> {
        self.unanswered_since.map(|since| since + self.wait)
    }

    /// Resolves when the keep-alive left unanswered counts as silence;
    /// never while none is.
    pub(super) async fn silence(&self) {
        match self.silent_at() {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

/// New keep-alive streams are tried for at least this long after a
/// silence (and at least three waits; never past the lease's end): a leader
/// election, while which every member refuses new streams with "no
/// leader", takes one to three election timeouts.
const ELECTION_ALLOWANCE: Duration = Duration::from_secs(3);

/// What was heard while a new stream was tried.
enum Heard {
    /// The old stream, answering after all (or failing).
    Old(Result<Option<LeaseKeepAliveResponse>, etcd_client::Error>),
    /// The new stream's first keep-alive, or the try's end.
    New(Result<Result<(LeaseKeeper, LeaseKeepAliveStream), etcd_client::Error>, Elapsed>),
}

/// One lease kept alive: its keep-alive stream and rhythm.
pub(super) struct Keeping {
    leases: LeaseClient,
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
    beat: Beat,
    tick: Interval,
    ttl: Duration,
    /// When etcd last answered a keep-alive: the lease lives until about
    /// a TTL after.
    renewed: Instant,
}

impl Keeping {
    /// The lease `keeper` keeps alive, a keep-alive having just been
    /// answered on `stream`; the next goes out a third of `ttl` from now.
    /// New streams are made through `leases`.
    pub(super) fn new(
        leases: LeaseClient,
        (keeper, stream): (LeaseKeeper, LeaseKeepAliveStream),
        beat: Beat,
        ttl: Duration,
    ) -> Self {
        let every = ttl / 3;
        let mut tick = tokio::time::interval_at(Instant::now() + every, every);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            leases,
            keeper,
            stream,
            beat,
            tick,
            ttl,
            renewed: Instant::now(),
        }
    }

    /// Keeps the lease alive until that fails: the error says how (the
    /// lease expired, the stream ended or broke, keep-alives went
    /// unanswered on new streams too). A stream gone silent is replaced
    /// by a new one, through whichever member the client picks, without
    /// ending the session: a member cut off from the others (or a leader
    /// election) costs no outage. Cancel-safe: dropped between two
    /// keep-alives, it resumes where it was when called again.
    pub(super) async fn until_broken(&mut self) -> KvError {
        loop {
            let silence = match self.until_silent().await {
                Ok(silence) => silence,
                Err(e) => return e,
            };
            if let Err(e) = self.new_stream(silence).await {
                return e;
            }
        }
    }

    /// Keeps the lease alive on the stream in use until a keep-alive goes
    /// unanswered for the wait (`Ok`, the silence), or the stream fails.
    async fn until_silent(&mut self) -> Result<KvError, KvError> {
        let lease = self.keeper.id();
        loop {
            tokio::select! {
                // An answer first: one come with the silence's deadline
                // does not move a stream that serves.
                biased;
                msg = self.stream.message() => match msg {
                    Ok(Some(r)) if r.ttl() <= 0 => return Err(KvError::LeaseExpired { lease }),
                    Ok(Some(_)) => {
                        self.beat.answered();
                        self.renewed = Instant::now();
                    }
                    Ok(None) => return Err(KvError::StreamEnded { what: "lease keepalive" }),
                    Err(e) => return Err(failed(e)),
                },
                _ = self.tick.tick() => {
                    self.keeper.keep_alive().await.map_err(failed)?;
                    self.beat.sent(Instant::now());
                }
                () = self.beat.silence() => {
                    return Ok(KvError::KeepaliveSilent { lease, waited: self.beat.wait() });
                }
            }
        }
    }

    /// Replaces the silent stream with a new one whose first keep-alive
    /// is answered, trying one after another (each waiting the wait, a
    /// refusal followed by a pause of a quarter of it) for three waits or
    /// [`ELECTION_ALLOWANCE`], whichever is longer, and never past the
    /// lease's end as last renewed. The old stream is still heard
    /// meanwhile: its keep-alive answered late (a leader elected) ends the
    /// tries, the old stream kept. The error, when all of that fails, is
    /// `silence`.
    async fn new_stream(&mut self, silence: KvError) -> Result<(), KvError> {
        let lease = self.keeper.id();
        let wait = self.beat.wait();
        let until =
            (self.renewed + self.ttl).min(Instant::now() + (wait * 3).max(ELECTION_ALLOWANCE));
        let (mut tries, mut old_open, mut refused) = (0u32, true, None);
        while Instant::now() < until {
            tries += 1;
            let deadline = (Instant::now() + wait).min(until);
            let heard = tokio::select! {
                biased;
                msg = self.stream.message(), if old_open => Heard::Old(msg),
                r = tokio::time::timeout_at(deadline, self.leases.keep_alive(lease)) => Heard::New(r),
            };
            match heard {
                Heard::Old(Ok(Some(r))) if r.ttl() <= 0 => {
                    return Err(KvError::LeaseExpired { lease });
                }
                Heard::Old(Ok(Some(_))) => {
                    self.beat.answered();
                    self.renewed = Instant::now();
                    return Ok(());
                }
                Heard::Old(_) => old_open = false,
                Heard::New(Ok(Ok((keeper, stream)))) => {
                    info!(
                        lease = %format!("{lease:x}"), tries,
                        "etcd lease keep-alives moved to a new stream: {}",
                        crate::util::errors::chain(&silence)
                    );
                    (self.keeper, self.stream) = (keeper, stream);
                    self.beat.answered();
                    self.renewed = Instant::now();
                    self.tick.reset();
                    return Ok(());
                }
                // The crate's word for an answer with no TTL left.
                Heard::New(Ok(Err(etcd_client::Error::LeaseKeepAliveError(_)))) => {
                    return Err(KvError::LeaseExpired { lease });
                }
                Heard::New(Ok(Err(e))) => {
                    refused = Some(failed(e));
                    // Refused at once (no leader, the member gone): the
                    // next try after a pause, not in a spin.
                    tokio::time::sleep(wait / 4).await;
                }
                Heard::New(Err(_)) => {}
            }
        }
        if let Some(e) = refused {
            debug!(lease = %format!("{lease:x}"), tries, "no new etcd lease keep-alive stream; the last refusal: {}", crate::util::errors::chain(&e));
        }
        Err(silence)
    }
}

/// An error of the keep-alive stream.
fn failed(e: etcd_client::Error) -> KvError {
    call_error("keeping the lease alive")(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_an_eighth_of_the_ttl_and_no_longer_than_a_request() {
        assert_eq!(
            answer_wait(Duration::from_secs(4)),
            Duration::from_millis(500)
        );
        assert_eq!(
            answer_wait(Duration::from_secs(10)),
            Duration::from_millis(1250)
        );
        assert_eq!(answer_wait(Duration::from_mins(15)), REQUEST_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_keepalive_unanswered_for_the_wait_is_silence_and_an_answer_ends_it() {
        let wait = Duration::from_millis(500);
        let mut beat = Beat::new(wait);
        assert_eq!(beat.silent_at(), None, "nothing sent yet");
        let first = Instant::now();
        beat.sent(first);
        // A second keep-alive, sent while the first is unanswered, does
        // not put the silence off.
        tokio::time::advance(Duration::from_millis(300)).await;
        beat.sent(Instant::now());
        assert_eq!(beat.silent_at(), Some(first + wait));
        tokio::time::timeout(Duration::from_millis(199), beat.silence())
            .await
            .expect_err("silence only after the whole wait");
        tokio::time::timeout(Duration::from_millis(2), beat.silence())
            .await
            .expect("silence at the end of the wait");

        beat.answered();
        assert_eq!(beat.silent_at(), None, "an answer ends it");
        tokio::time::timeout(Duration::from_secs(3600), beat.silence())
            .await
            .expect_err("no silence with nothing unanswered");
        let later = Instant::now();
        beat.sent(later);
        assert_eq!(beat.silent_at(), Some(later + wait), "a new wait");
    }
}
