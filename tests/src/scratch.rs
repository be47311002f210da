//! A scratch directory of a test, named as its other resources are
//! ([`crate::names::unique`]) and removed when the test ends, also when
//! it panics.

use std::path::{Path, PathBuf};

/// `$TMPDIR/htest-<pid>-<n>-<what>`, removed with everything in it on
/// drop.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Makes a new, empty one for `what`.
    #[must_use]
    pub fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(crate::names::unique(what));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("making {}: {e}", dir.display()));
        Self(dir)
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` inside it.
    #[must_use]
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("removing {}: {e}", self.0.display());
        }
    }
}
