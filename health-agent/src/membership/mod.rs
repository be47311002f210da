//! Who is in the cluster: node records and their validation, the nodes file, etcd, routes, sync.
//! Imported by the prober and everything above it; imports only `sys` and `util`.

pub mod allocations;
pub mod claims;
pub mod discovery;
pub mod etcd;
pub mod file_settle;
pub mod file_version;
pub mod held;
pub mod kvstore;
mod node;
pub mod nodes_file;
pub mod published;
pub mod record;
pub mod routes;
pub mod settings;
pub mod sync;
pub mod validate;

pub use self::node::{DuplicateNode, Node, NodeSet};
