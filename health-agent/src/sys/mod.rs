//! Adapters to the operating system: the boot (its ID and start),
//! network namespaces, netlink (links, addresses, routes), the pidfile
//! lock, signals, raw ICMP sockets, socket options, the batched BPF map
//! operations aya does not wrap, the size of the descriptor table,
//! bytes kept in sealed files to be sent without a copy, and whether a
//! path the agent trusts is its alone.
//!
//! Imported by every layer above `util`; imports nothing of the agent.
//! Nothing here knows about endpoints, probes or the cluster.

pub mod boot;
pub mod bpf_batch;
pub mod fd_table;
pub mod icmp;
pub mod icmp_trace;
pub mod netlink;
pub mod netns;
pub mod pidfile;
pub mod private_path;
pub mod sealed;
pub mod signals;
pub mod socket_factory;
pub mod sockopt;
pub mod sysctl;
pub mod wireguard;
