//! The API's unix socket: made under a name of its own, given its mode
//! and group, and only then moved to its path, so that nobody can
//! connect while it still has the umask's mode.

use std::{
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use nix::fcntl::{RenameFlags, renameat2};
use tokio::net::UnixListener;

use super::server::ServerError;

/// Removes the socket file when dropped.
pub struct SocketGuard {
    pub(super) path: PathBuf,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `path` (mode 0660, owned by `group` when given: a group name or
/// number, whose members may then use the API); the socket file goes when
/// the guard drops. A file already at `path` is left, and refused.
pub fn bind(path: &Path, group: Option<&str>) -> Result<(SocketGuard, UnixListener), ServerError> {
    let io = |op, source| ServerError::Io {
        op,
        path: path.to_owned(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", e))?;
    // Short, so that a path that fits the socket address's 108 bytes
    // fits with it; the process's own, so that only a leftover of an
    // earlier process of the same ID is in the way.
    let staged = dir.join(format!(".bind{}", std::process::id()));
    if std::fs::symlink_metadata(&staged).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(&staged);
    }
    let listener = UnixListener::bind(&staged).map_err(|e| io("binding", e))?;
    let staged_guard = SocketGuard {
        path: staged.clone(),
    };
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| io("setting mode 0660 on", e))?;
    if let Some(group) = group {
        let gid = group_id(group)?;
        std::os::unix::fs::chown(&staged, None, Some(gid))
            .map_err(|e| io("changing the group of", e))?;
    }
    renameat2(
        nix::fcntl::AT_FDCWD,
        &staged,
        nix::fcntl::AT_FDCWD,
        path,
        RenameFlags::RENAME_NOREPLACE,
    )
    .map_err(|e| {
        let e = if e == nix::errno::Errno::EEXIST {
            std::io::Error::from(std::io::ErrorKind::AddrInUse)
        } else {
            std::io::Error::from(e)
        };
        io("binding", e)
    })?;
    std::mem::forget(staged_guard);
    Ok((
        SocketGuard {
            path: path.to_owned(),
        },
        listener,
    ))
}

/// The ID of `group`, a name or a number.
fn group_id(group: &str) -> Result<u32, ServerError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(ServerError::Group {
            group: group.to_owned(),
            reason: "no such group".into(),
        }),
        Err(e) => Err(ServerError::Group {
            group: group.to_owned(),
            reason: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// The socket appears at its path by a rename, with its mode and group
    /// already set: never created there with the umask's mode.
    #[test]
    fn the_socket_appears_at_its_path_with_its_mode_set() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("health.sock");
        let watch = Inotify::init(InitFlags::IN_NONBLOCK).expect("inotify");
        watch
            .add_watch(
                dir.path(),
                AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO,
            )
            .expect("watch");
        let gid = nix::unistd::getegid().as_raw();
        let (guard, _listener) = runtime()
            .block_on(async { bind(&path, Some(&gid.to_string())) })
            .expect("bind");
        let events = watch.read_events().expect("events");
        let at_path: Vec<AddWatchFlags> = events
            .iter()
            .filter(|e| e.name.as_deref() == Some(std::ffi::OsStr::new("health.sock")))
            .map(|e| e.mask)
            .collect();
        assert_eq!(at_path, [AddWatchFlags::IN_MOVED_TO], "{events:?}");
        let meta = std::fs::symlink_metadata(&path).expect("socket");
        assert!(meta.file_type().is_socket());
        assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, gid));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["health.sock"], "nothing staged is left");
        drop(guard);
        assert!(!path.exists(), "the guard removes the socket");
    }

    /// A file at the path is neither replaced nor removed, and the staged
    /// socket goes.
    #[test]
    fn a_file_at_the_path_is_refused_and_left() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("health.sock");
        std::fs::write(&path, b"someone else's").expect("write");
        let Err(e) = runtime().block_on(async { bind(&path, None) }) else {
            panic!("bound over a file");
        };
        let text = crate::util::errors::chain(&e);
        assert!(
            text.contains("binding") && text.contains("health.sock"),
            "{text}"
        );
        assert_eq!(std::fs::read(&path).expect("read"), b"someone else's");
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
    }
}
