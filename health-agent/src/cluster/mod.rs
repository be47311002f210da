//! The cluster as this agent sees it: which nodes exist (discovery) and when
//! changes to that set are applied (the bounded-frequency sync runner).

pub mod assigned;
pub mod claims;
pub mod discovery;
pub mod etcd;
pub mod file_settle;
pub mod file_version;
pub mod kvstore;
pub mod matrix;
mod node;
pub mod nodes_file;
pub mod routes;
pub mod subset;
pub mod summary;
pub mod sync;
pub mod validate;
pub mod view;
pub mod view_cell;

pub use self::node::{DuplicateNode, Node, NodeSet};
