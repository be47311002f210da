//! Pacing a round's starts over the spread in slices: the engines wake at
//! most once per [`SLICE`] and start every probe due by then, not once per
//! probe. At 500 peers (2,000 probes over a 100 ms spread), waking for
//! each tick cost the agent more per peer than the CPU-bound rounds of
//! 5,000 peers did.

use std::time::Duration;

use tokio::time::Instant;

/// The pacing slice: starts are spread over the spread in steps of this.
pub(super) const SLICE: Duration = Duration::from_millis(5);

/// When to wake for a start due at `due`, paced from `t0`: the end of the
/// slice `due` falls in (so every start of a slice goes out at one wake).
#[must_use]
pub(super) fn wake_for(t0: Instant, due: Instant) -> Instant {
    let since = due.saturating_duration_since(t0);
    let slice = SLICE.as_nanos();
    let slices = since.as_nanos().div_ceil(slice);
    t0 + Duration::from_nanos(u64::try_from(slices * slice).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_wake_at_the_end_of_their_slice() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(wake_for(t0, t0), t0);
        assert_eq!(wake_for(t0, t0 + Duration::from_micros(1)), t0 + SLICE);
        assert_eq!(wake_for(t0, t0 + ms(3)), t0 + ms(5));
        assert_eq!(wake_for(t0, t0 + ms(5)), t0 + ms(5));
        assert_eq!(wake_for(t0, t0 + ms(97)), t0 + ms(100));
        // Due before the round began: now.
        assert_eq!(wake_for(t0 + ms(10), t0), t0 + ms(10));
    }
}
