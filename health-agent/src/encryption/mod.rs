//! The encryption check (`--encryption wireguard`): whether each peer's
//! node and health addresses are reached through WireGuard, per path.
//! Imported by `probe` and above; imports `membership`, `datapath`, `sys`,
//! `util`.
//!
//! - [`settings`]: the flags.
//! - [`state`]: what the status, the API, the metrics and the page show
//!   per path: encrypted, plaintext, not covered, stale.
//! - [`verdict`]: the decision, from the WireGuard device as the kernel
//!   reports it and the probe packets the egress programs counted.
//! - [`monitor`]: after each round, the counters read, the device read,
//!   every probed path judged; the counters attached where needed.

pub mod monitor;
pub mod settings;
pub mod state;
pub mod verdict;

pub use monitor::EncryptionMonitor;
pub use settings::{Encryption, EncryptionSettings};
pub use state::{EncState, EncryptionView, PathEncryption};
