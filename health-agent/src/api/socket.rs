//! The API's unix socket: made with its mode (0660 at most, whatever the
//! umask) under a name of its own, given its group, and only then moved
//! to its path, so that nobody can connect while it has another mode or
//! group.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
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
    let io = |op, path: &Path, source| ServerError::Io {
        op,
        path: path.to_owned(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", path, e))?;
    let gid = group.map(group_id).transpose()?;
    remove_leftovers(dir);
    let (staged, listener) = bind_staged(dir)?;
    let staged_guard = SocketGuard {
        path: staged.clone(),
    };
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| io("setting mode 0660 on", &staged, e))?;
    if let (Some(gid), Some(name)) = (gid, group) {
        std::os::unix::fs::lchown(&staged, None, Some(gid)).map_err(|e| {
            // Without CAP_CHOWN (as under the packaged unit), only a group
            // the agent is in.
            let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                ": the agent must be in the group (the unit's SupplementaryGroups=) or hold CAP_CHOWN"
            } else {
                ""
            };
            ServerError::Group {
                group: name.to_owned(),
                reason: format!("giving {} to it: {e}{hint}", staged.display()),
            }
        })?;
    }
    move_into_place(&staged, path).map_err(|e| io("binding", path, e))?;
    std::mem::forget(staged_guard);
    Ok((
        SocketGuard {
            path: path.to_owned(),
        },
        listener,
    ))
}

/// A socket bound in `dir` under a name of this call's own: short (a dot,
/// the process ID and a count, in base 36: [`staged_name`]), so that a
/// directory whose path fits the socket address's 108 bytes with the
/// API's name fits with it; a name in the way (a leftover of a process
/// killed while binding, whose ID came back) is passed over for the next.
fn bind_staged(dir: &Path) -> Result<(PathBuf, UnixListener), ServerError> {
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let mut last = None;
    for _ in 0..8 {
        let n = CALLS.fetch_add(1, Ordering::Relaxed);
        let staged = dir.join(staged_name(std::process::id(), n));
        match listen_at(&staged) {
            Ok(listener) => return Ok((staged, listener)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some((staged, e)),
            Err(e) => {
                return Err(ServerError::Io {
                    op: "binding",
                    path: staged,
                    source: e,
                });
            }
        }
    }
    let (path, source) = last.expect("eight tries");
    Err(ServerError::Io {
        op: "binding",
        path,
        source,
    })
}

/// A listening socket bound at `path` whose file is made with mode 0660
/// at most: the kernel makes it with the socket's own mode less the
/// umask, and that mode is set first, so no umask, however permissive,
/// lets anyone connect to it before it is moved into place.
fn listen_at(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::fd::AsFd as _;
    let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    nix::sys::stat::fchmod(
        socket.as_fd(),
        nix::sys::stat::Mode::from_bits_truncate(0o660),
    )?;
    socket.bind(&socket2::SockAddr::unix(path)?)?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    UnixListener::from_std(std::os::unix::net::UnixListener::from(
        std::os::fd::OwnedFd::from(socket),
    ))
}

/// Moves the socket at `staged` to `path`, never over a file there: a
/// rename that refuses to replace, or where the file system has none, a
/// hard link and the staged name's removal.
fn move_into_place(staged: &Path, path: &Path) -> std::io::Result<()> {
    let renamed = renameat2(
        nix::fcntl::AT_FDCWD,
        staged,
        nix::fcntl::AT_FDCWD,
        path,
        RenameFlags::RENAME_NOREPLACE,
    );
    match renamed {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EEXIST) => Err(std::io::ErrorKind::AddrInUse.into()),
        Err(nix::errno::Errno::EINVAL) => {
            std::fs::hard_link(staged, path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    std::io::ErrorKind::AddrInUse.into()
                } else {
                    e
                }
            })?;
            // Served at `path` from here: a staged name left behind is a
            // second name of the same socket, not a failure.
            if let Err(e) = std::fs::remove_file(staged) {
                tracing::warn!(staged = %staged.display(), "removing the staged name of the API socket: {e}");
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The staged name of a process's `n`th bind: `.<pid>-<n>`, both in base
/// 36.
fn staged_name(pid: u32, n: u32) -> String {
    format!(".{}-{}", base36(pid), base36(n))
}

/// The process ID in a staged name, when `name` is one.
fn staged_pid(name: &str) -> Option<u32> {
    let (pid, n) = name.strip_prefix('.')?.split_once('-')?;
    let digits = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    };
    if !digits(pid) || !digits(n) {
        return None;
    }
    u32::from_str_radix(pid, 36).ok()
}

/// Removes the staged sockets in `dir` that a process killed between
/// binding one and moving it into place left: a socket under a staged
/// name, owned by this user, of a process that is gone, that nobody
/// listens on. Anything else (another file, another owner's, a live
/// process's, one that answers) is left.
fn remove_leftovers(dir: &Path) {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let uid = nix::unistd::geteuid().as_raw();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(staged_pid) else {
            continue;
        };
        let ours = entry
            .metadata()
            .is_ok_and(|m| m.file_type().is_socket() && m.uid() == uid);
        if !ours || pid == std::process::id() || !process_gone(pid) {
            continue;
        }
        let path = entry.path();
        // A process of that ID in another PID namespace may still serve
        // it: only a socket nobody listens on is left over.
        if answers(&path) {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::info!(
                path = %path.display(),
                pid,
                "removed a staged API socket left by a process that is gone"
            ),
            Err(e) => {
                tracing::warn!(path = %path.display(), "removing a staged API socket left behind: {e}");
            }
        }
    }
}

/// Whether something listens on the socket at `path`: a connection is
/// refused only when nothing does (not waited for: a listener whose
/// backlog is full answers so too). In doubt, yes.
fn answers(path: &Path) -> bool {
    let Ok(socket) = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)
    else {
        return true;
    };
    let Ok(addr) = socket2::SockAddr::unix(path) else {
        return true;
    };
    if socket.set_nonblocking(true).is_err() {
        return true;
    }
    match socket.connect(&addr) {
        Ok(()) => true,
        Err(e) => e.raw_os_error() != Some(nix::errno::Errno::ECONNREFUSED as i32),
    }
}

/// Whether no process has the ID `pid` (one that cannot be signalled by
/// this one is there).
fn process_gone(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) == Err(nix::errno::Errno::ESRCH)
}

/// `n` in base 36, lowercase.
fn base36(mut n: u32) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(char::from_digit(n % 36, 36).unwrap_or('0'));
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.iter().rev().collect()
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
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// The staged socket's file is made with no access for others and no
    /// execute bit, whatever the umask (the process's here: 022 or less
    /// strict would leave others read and execute).
    #[test]
    fn the_staged_socket_is_made_with_its_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(".staged");
        let _listener = runtime()
            .block_on(async { listen_at(&path) })
            .expect("listen");
        let mode = std::fs::symlink_metadata(&path).expect("socket").mode() & 0o777;
        assert_eq!(mode & !0o660, 0, "{mode:o}");
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

    /// Binds made at once in one process, as the API's tests do, each
    /// stage under a name of their own, and each socket lands at its
    /// path.
    #[test]
    fn binds_at_once_stage_under_names_of_their_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = runtime();
        let paths: Vec<PathBuf> = (0..8)
            .map(|i| dir.path().join(format!("s{i}.sock")))
            .collect();
        let bound: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = paths
                .iter()
                .map(|p| s.spawn(|| rt.block_on(async { bind(p, None) }).expect("bind")))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        });
        for p in &paths {
            assert!(
                std::fs::symlink_metadata(p)
                    .expect("socket")
                    .file_type()
                    .is_socket()
            );
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            paths.len()
        );
        drop(bound);
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
    }

    /// A staged socket left by a process that is gone is removed at the
    /// next bind; a live process's, one that answers, a file that is not
    /// a socket and names of another form are left.
    #[test]
    fn staged_sockets_of_processes_gone_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let gone = child.id();
        child.wait().expect("wait");
        let rt = runtime();
        let socket_at = |name: &str| {
            rt.block_on(async { listen_at(&dir.path().join(name)) })
                .expect("listen")
        };
        let left = staged_name(gone, 3);
        let live = staged_name(1, 0);
        // Left by a process killed after its bind: closed with it.
        drop(socket_at(&left));
        let _listeners = [socket_at(&live), socket_at(".other")];
        // A socket named for the gone process that answers (its ID reused
        // in another PID namespace, say): served, so left.
        let served = staged_name(gone, 5);
        let _serving = socket_at(&served);
        let not_socket = staged_name(gone, 4);
        std::fs::write(dir.path().join(&not_socket), b"data").expect("write");
        let (guard, _listener) = rt
            .block_on(async { bind(&dir.path().join("health.sock"), None) })
            .expect("bind");
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut want = vec![
            live,
            served,
            ".other".to_owned(),
            not_socket,
            "health.sock".to_owned(),
        ];
        want.sort();
        assert_eq!(names, want, "{left} removed");
        drop(guard);
    }

    #[test]
    fn staged_names_give_their_process_back() {
        assert_eq!(staged_name(4_194_304, 35), ".2hwcg-z");
        assert_eq!(staged_pid(".2hwcg-z"), Some(4_194_304));
        for name in [
            ".2hwcg",
            "2hwcg-z",
            ".-z",
            ".2h-",
            ".2H-z",
            ".2h-z.sock",
            ".zzzzzzzzz-0",
        ] {
            assert_eq!(staged_pid(name), None, "{name}");
        }
    }

    #[test]
    fn base36_is_short() {
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
        assert_eq!(base36(4_194_304), "2hwcg");
    }
}
