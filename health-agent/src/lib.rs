//! The health agent as a library: the binary (`main.rs`) and the integration
//! tests both drive it through these modules.

pub mod cli;
pub mod logging;
pub mod netlink;
pub mod netns;
pub mod object;
pub mod responder;
pub mod signals;
