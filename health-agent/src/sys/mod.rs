//! Adapters to the operating system: network namespaces, netlink (links,
//! addresses, routes), the pidfile lock, signals and raw ICMP sockets.
//! Nothing here knows about endpoints, probes or the cluster.

pub mod icmp;
pub mod netlink;
pub mod netns;
pub mod pidfile;
pub mod signals;
pub mod socket_factory;
pub mod sysctl;
