//! Small helpers shared by every layer: duration parsing, time formatting,
//! error chains.

pub mod cidr;
pub mod duration;
pub mod errors;
pub mod memory;
pub mod timefmt;
