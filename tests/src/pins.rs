//! A bpffs pin directory per test, removed on drop.

use std::path::{Path, PathBuf};

use health_agent::datapath::remove_pins;

use crate::names;

use health_agent::datapath::BPFFS_ROOT as BPFFS;

pub struct PinDir {
    path: PathBuf,
}

impl PinDir {
    #[must_use]
    pub fn new() -> Self {
        sweep_stale();
        Self {
            path: Path::new(BPFFS).join(names::unique("pins")),
        }
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Default for PinDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Err(e) = remove_pins(&self.path) {
            eprintln!("warning: could not remove {}: {e}", self.path.display());
        }
    }
}

fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(BPFFS) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(names::is_stale) {
            let _ = remove_pins(&entry.path());
        }
    }
}
