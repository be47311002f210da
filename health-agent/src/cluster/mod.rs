//! What the cluster sees: the subset plan, probe summaries, the cluster view and its matrix.
//! Imported only by `api`, `daemon` and the CLI; imports `probe` and `membership`.

pub mod assigned;
pub mod cadence;
pub mod contradiction;
pub mod matrix;
pub mod published_view;
pub mod subset;
pub mod summary;
pub mod summary_writes;
#[cfg(test)]
mod test_nodes;
pub mod view;
pub mod view_cell;
pub mod view_inbox;
pub mod view_reader;
