//! Small helpers that every layer may use: durations, times, addresses, error chains.
//! Imported by every layer; imports nothing of the agent.

pub mod admission;
pub mod cidr;
pub mod duration;
pub mod errors;
pub mod gzip;
pub mod json_list;
pub mod memory;
pub mod reclaim;
pub mod section;
pub mod source;
pub mod text;
pub mod timefmt;
