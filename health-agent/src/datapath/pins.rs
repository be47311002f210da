//! The bpffs directory holding the pinned maps.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    EbpfError,
    maps::{Array, Map, MapData, MapError},
};
use health_common::maps::{MapId, PIN_LAYOUT_VERSION};
use tracing::{info, warn};

use super::DatapathError;

/// Default bpffs directory for the pinned maps.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/health";

/// `BPF_FS_MAGIC` from `linux/magic.h`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Where bpffs is mounted by convention.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// Creates `dir` (and parents) and checks that it is on a bpf filesystem.
/// A directory under `/sys/fs/bpf` gets a bpffs mounted there first when
/// none is (as on a host where nothing has used BPF pins yet).
pub fn ensure_pin_dir(dir: &Path) -> Result<(), DatapathError> {
    if dir.starts_with(BPFFS_ROOT) {
        mount_bpffs_root()?;
    }
    fs::create_dir_all(dir).map_err(|source| DatapathError::PinDir {
        path: dir.to_owned(),
        source,
    })?;
    if is_bpffs(dir)? {
        Ok(())
    } else {
        Err(DatapathError::NotBpffs {
            path: dir.to_owned(),
        })
    }
}

fn is_bpffs(path: &Path) -> Result<bool, DatapathError> {
    let st = nix::sys::statfs::statfs(path).map_err(|e| DatapathError::PinDir {
        path: path.to_owned(),
        source: io::Error::from(e),
    })?;
    #[allow(
        clippy::cast_lossless,
        reason = "f_type width differs across libc targets"
    )]
    Ok(st.filesystem_type().0 as i64 == BPF_FS_MAGIC)
}

/// Mounts bpffs at [`BPFFS_ROOT`] unless one is there. Agents starting
/// together (a fresh machine, a test cluster) serialise on a lock of the
/// mount point itself: a second mount stacked on the first would hide the
/// pin directories made under it.
fn mount_bpffs_root() -> Result<(), DatapathError> {
    let root = Path::new(BPFFS_ROOT);
    if is_bpffs(root)? {
        return Ok(());
    }
    let io_err = |source| DatapathError::PinDir {
        path: root.to_owned(),
        source,
    };
    let dir = fs::File::open(root).map_err(io_err)?;
    let _lock = nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| io_err(io::Error::from(e)))?;
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
    .map_err(|e| DatapathError::PinDir {
        path: root.to_owned(),
        source: io::Error::from(e),
    })
}

/// The pinned maps of the datapath under `dir`.
#[must_use]
fn pin_paths(dir: &Path) -> Vec<PathBuf> {
    MapId::ALL.iter().map(|m| dir.join(m.name())).collect()
}

/// The layout version recorded with the pins in `dir`: `None` when there
/// are no pins (or they predate the record).
#[must_use]
pub fn recorded_layout(dir: &Path) -> Option<u32> {
    let data = MapData::from_pin(dir.join(MapId::PinLayout.name())).ok()?;
    let map = Map::Array(data);
    Array::<_, u32>::try_from(&map).ok()?.get(&0, 0).ok()
}

/// Sets aside the pins in `dir` that a layout version recorded with them
/// says cannot be reused though their sizes may match
/// ([`health_common::maps::remade_since`]: every pin of a newer agent's
/// layout; those changed at the same size since an older one's), so that
/// no entry of another meaning is read. Returns the names set aside (for
/// [`settle_aside`]: removed once the new maps are pinned, put back if
/// the load fails). Other pins of another version are replaced, and their
/// entries carried, when their sizes differ, as at any load.
pub(super) fn set_aside_other_layout(dir: &Path) -> Vec<String> {
    let Some(from) = recorded_layout(dir).filter(|v| *v != PIN_LAYOUT_VERSION) else {
        return Vec::new();
    };
    let mut aside_now = Vec::new();
    for id in health_common::maps::remade_since(from) {
        let name = id.name();
        match fs::rename(dir.join(name), aside(dir, name)) {
            Ok(()) => aside_now.push(name.to_owned()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // Left in place: the load reuses it if its sizes match, or
            // replaces it.
            Err(e) => warn!(map = %name, "setting a pin of another layout aside: {e}"),
        }
    }
    info!(
        dir = %dir.display(),
        from,
        to = PIN_LAYOUT_VERSION,
        remade = aside_now.len(),
        "pinned maps were made with another layout version: those it changed are made anew"
    );
    aside_now
}

/// Where a replaced pin waits for its replacement: a load that fails
/// after it puts it back, with its map and entries, rather than leave
/// none (no map of the object is pinned under that name; bpffs takes no
/// dot in a name).
fn aside(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("REPLACED_{name}"))
}

/// After a load that replaced the pins `names`: the old maps set aside
/// go once the new ones are pinned (`made`), and come back when the load
/// failed.
pub(super) fn settle_aside(dir: &Path, names: &[String], made: bool) {
    for name in names {
        let old = aside(dir, name);
        let done = if made {
            fs::remove_file(&old)
        } else {
            fs::rename(&old, dir.join(name))
        };
        match done {
            Ok(()) if !made => info!(map = %name, "the load failed: the old map is pinned again"),
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => warn!(path = %old.display(), "settling a replaced pin: {e}"),
        }
    }
}

/// Pins set aside by a load that did not finish (the agent killed in
/// it): pinned again where nothing replaced them, else removed.
pub(super) fn recover_aside(dir: &Path) {
    for id in MapId::ALL {
        let old = aside(dir, id.name());
        if fs::symlink_metadata(&old).is_err() {
            continue;
        }
        let pin = dir.join(id.name());
        let done = if fs::symlink_metadata(&pin).is_ok() {
            fs::remove_file(&old)
        } else {
            fs::rename(&old, &pin)
        };
        if let Err(e) = done {
            warn!(path = %old.display(), "a pin set aside by an unfinished load: {e}");
        }
    }
}

/// When `err` is aya refusing to reuse a pinned map whose layout differs
/// from the object's, sets that pin aside (the map is made anew on the
/// next load; [`settle_aside`] then removes or restores the old one) and
/// returns its name; any other error is handed back.
pub(super) fn replace_incompatible(dir: &Path, err: EbpfError) -> Result<String, EbpfError> {
    let EbpfError::MapError(MapError::IncompatiblePinnedMap {
        name,
        property,
        expected,
        actual,
    }) = err
    else {
        return Err(err);
    };
    warn!(
        map = %name,
        property,
        expected,
        actual,
        "pinned map has another layout or size: replacing it"
    );
    match fs::rename(dir.join(&name), aside(dir, &name)) {
        Ok(()) => Ok(name),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(name),
        Err(e) => {
            warn!(map = %name, "setting the incompatible pin aside: {e}");
            Err(EbpfError::MapError(MapError::IncompatiblePinnedMap {
                name,
                property,
                expected,
                actual,
            }))
        }
    }
}

/// Removes the datapath's pins and then `dir` itself if it is empty.
/// Missing pins are fine; anything else left in `dir` is kept.
pub fn remove_pins(dir: &Path) -> Result<(), DatapathError> {
    let set_aside = MapId::ALL.iter().map(|m| aside(dir, m.name()));
    for path in pin_paths(dir).into_iter().chain(set_aside) {
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(DatapathError::PinDir { path, source }),
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
        Err(source) => Err(DatapathError::PinDir {
            path: dir.to_owned(),
            source,
        }),
    }
}
