//! The bpffs directory holding the pinned maps.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use health_common::maps::ALL_MAPS;

use super::ResponderError;

/// Default bpffs directory for the pinned maps.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/health";

/// `BPF_FS_MAGIC` from `linux/magic.h`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Where bpffs is mounted by convention.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// Creates `dir` (and parents) and checks that it is on a bpf filesystem.
/// A directory under `/sys/fs/bpf` gets a bpffs mounted there first when
/// none is (as on a host where nothing has used BPF pins yet).
pub fn ensure_pin_dir(dir: &Path) -> Result<(), ResponderError> {
    if dir.starts_with(BPFFS_ROOT) {
        mount_bpffs_root()?;
    }
    fs::create_dir_all(dir).map_err(|source| ResponderError::PinDir {
        path: dir.to_owned(),
        source,
    })?;
    if is_bpffs(dir)? {
        Ok(())
    } else {
        Err(ResponderError::NotBpffs {
            path: dir.to_owned(),
        })
    }
}

fn is_bpffs(path: &Path) -> Result<bool, ResponderError> {
    let st = nix::sys::statfs::statfs(path).map_err(|e| ResponderError::PinDir {
        path: path.to_owned(),
        source: io::Error::from(e),
    })?;
    #[allow(
        clippy::cast_lossless,
        reason = "f_type width differs across libc targets"
    )]
    Ok(st.filesystem_type().0 as i64 == BPF_FS_MAGIC)
}

fn mount_bpffs_root() -> Result<(), ResponderError> {
    let root = Path::new(BPFFS_ROOT);
    if is_bpffs(root)? {
        return Ok(());
    }
    tracing::info!(path = BPFFS_ROOT, "mounting a bpf filesystem");
    nix::mount::mount(
        Some("bpf"),
        root,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        Some("mode=0700"),
    )
    .map_err(|e| ResponderError::PinDir {
        path: root.to_owned(),
        source: io::Error::from(e),
    })
}

/// The pinned maps of the responder under `dir`.
#[must_use]
pub fn pin_paths(dir: &Path) -> Vec<PathBuf> {
    ALL_MAPS.iter().map(|m| dir.join(m)).collect()
}

/// Removes the responder's pins and then `dir` itself if it is empty.
/// Missing pins are fine; anything else left in `dir` is kept.
pub fn remove_pins(dir: &Path) -> Result<(), ResponderError> {
    for path in pin_paths(dir) {
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(ResponderError::PinDir { path, source }),
        }
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::DirectoryNotEmpty
            ) =>
        {
            Ok(())
        }
        Err(source) => Err(ResponderError::PinDir {
            path: dir.to_owned(),
            source,
        }),
    }
}
