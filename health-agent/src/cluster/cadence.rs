//! The cadence agreed between the agents that write summaries and the
//! assemblers that read them: how often an unchanged summary is written
//! again, and when one that was not is left out of the view.

/// An unchanged summary is written again after this many ticks.
pub const HEARTBEAT_ROUNDS: u64 = 5;

/// Summaries older than this many ticks are left out of the view: two
/// rounds past a heartbeat, so an observer whose observations did not
/// change is never taken for one that stopped.
pub const STALE_ROUNDS: u32 = HEARTBEAT_ROUNDS as u32 + 2;
