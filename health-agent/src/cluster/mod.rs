//! The cluster as this agent sees it: which nodes exist (discovery) and when
//! changes to that set are applied (the bounded-frequency sync runner).

pub mod discovery;
pub mod etcd;
mod node;
pub mod nodes_file;
pub mod routes;
pub mod sync;
pub mod validate;

pub use self::node::{DuplicateNode, Node, NodeSet};
