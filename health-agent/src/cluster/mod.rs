//! What the cluster sees: the subset plan, probe summaries, the cluster view and its matrix.
//! Imported only by the service layer (`api`, `metrics`, `daemon`); imports `probe`, `membership`.

pub mod assigned;
pub mod matrix;
pub mod subset;
pub mod summary;
pub mod view;
pub mod view_cell;
