//! The health agent as a library: the binary (`main.rs`) and the integration
//! tests both drive it through these modules.

pub mod api;
pub mod cli;
pub mod cluster;
pub mod daemon;
pub mod datapath;
pub mod duration;
pub mod endpoint;
pub mod errors;
pub mod hello;
pub mod icmp;
pub mod ipam;
pub mod logging;
pub mod masquerade;
pub mod netlink;
pub mod netns;
pub mod object;
pub mod pidfile;
pub mod probe;
pub mod responder;
pub mod signals;
pub mod timefmt;
