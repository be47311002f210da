//! The agent's pidfile, and the stale files a crashed agent leaves.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use tracing::info;

#[derive(Debug, thiserror::Error)]
pub enum PidfileError {
    #[error("another health-agent (pid {pid}) is running with pidfile {path}")]
    Running { pid: i32, path: PathBuf },
    #[error("the API socket {path} is in use by a running agent")]
    SocketInUse { path: PathBuf },
    #[error("{path} (--socket) exists and is not a socket: refusing to remove it")]
    NotASocket { path: PathBuf },
    #[error("another health-agent holds {path} ({flag}): each agent needs its own")]
    DirInUse { path: PathBuf, flag: &'static str },
    #[error(
        "{path} ({flag}) is not the agent's alone: {why}; the agent adopts and removes what it finds there"
    )]
    NotPrivate {
        path: PathBuf,
        flag: &'static str,
        why: String,
    },
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// Holds the pidfile, locked (`flock`) for the agent's life; removes it
/// when dropped.
pub struct Pidfile {
    path: PathBuf,
    /// The open, locked file: the lock goes with the descriptor.
    _file: fs::File,
}

impl Pidfile {
    /// Locks the pidfile (two agents started together cannot both get it),
    /// removes a stale API socket nobody listens on, then writes our pid. A
    /// pidfile left by a crashed agent is unlocked, so it is simply taken.
    pub fn acquire(path: &Path, socket: &Path) -> Result<Self, PidfileError> {
        use std::{io::Write as _, os::unix::fs::FileTypeExt as _};
        let io = |op, p: &Path| {
            let path = p.to_owned();
            move |source| PidfileError::Io { op, path, source }
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(io("creating", dir))?;
        }
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io("opening", path))?;
        if let Err(e) = file.try_lock() {
            return match e {
                fs::TryLockError::WouldBlock => Err(PidfileError::Running {
                    pid: fs::read_to_string(path)
                        .ok()
                        .and_then(|t| t.trim().parse().ok())
                        .unwrap_or(0),
                    path: path.to_owned(),
                }),
                fs::TryLockError::Error(source) => Err(io("locking", path)(source)),
            };
        }
        if let Ok(meta) = fs::symlink_metadata(socket) {
            if !meta.file_type().is_socket() {
                return Err(PidfileError::NotASocket {
                    path: socket.to_owned(),
                });
            }
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Err(PidfileError::SocketInUse {
                    path: socket.to_owned(),
                });
            }
            info!(path = %socket.display(), "removing a stale API socket left by a previous agent");
            fs::remove_file(socket).map_err(io("removing", socket))?;
        }
        file.set_len(0).map_err(io("truncating", path))?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes())
            .map_err(io("writing", path))?;
        Ok(Self {
            path: path.to_owned(),
            _file: file,
        })
    }
}

/// A directory only this agent may use (its state, its pins), locked
/// (`flock`) for the agent's life: two agents given different pidfiles but
/// one such directory would take each other's endpoint or maps.
pub struct DirLock {
    /// The open, locked directory: the lock goes with the descriptor.
    _dir: fs::File,
}

impl DirLock {
    /// Creates `path` if it is not there and locks it; `flag` names the
    /// setting that gave it, for the error.
    pub fn take(path: &Path, flag: &'static str) -> Result<Self, PidfileError> {
        let io = |op| {
            let path = path.to_owned();
            move |source| PidfileError::Io { op, path, source }
        };
        // An agent that removes the directory it held (the pins) may do so
        // between this open and this lock: the lock must be on the
        // directory the path names once it is taken.
        for _ in 0..3 {
            {
                use std::os::unix::fs::DirBuilderExt as _;
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(path)
                    .map_err(io("creating"))?;
            }
            let dir = fs::File::open(path).map_err(io("opening"))?;
            match dir.try_lock() {
                Ok(()) if same_file(&dir, path) => {
                    let meta = dir.metadata().map_err(io("reading the metadata of"))?;
                    if let Some(why) = crate::sys::private_path::not_private(&meta) {
                        return Err(PidfileError::NotPrivate {
                            path: path.to_owned(),
                            flag,
                            why,
                        });
                    }
                    return Ok(Self { _dir: dir });
                }
                Ok(()) => {}
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(PidfileError::DirInUse {
                        path: path.to_owned(),
                        flag,
                    });
                }
                Err(fs::TryLockError::Error(source)) => return Err(io("locking")(source)),
            }
        }
        Err(io("locking")(io::Error::other(
            "the directory was replaced while it was locked",
        )))
    }
}

/// Whether `file` is what `path` names now.
fn same_file(file: &fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

impl Drop for Pidfile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("health-pid-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("mkdir");
        d
    }

    #[test]
    fn stale_pidfile_and_socket_are_removed() {
        let d = dir("stale");
        let (pid, sock) = (d.join("a.pid"), d.join("a.sock"));
        // A pid that cannot be running, and a socket file nobody listens on.
        fs::write(&pid, "999999999\n").expect("write");
        drop(std::os::unix::net::UnixListener::bind(&sock).expect("bind"));
        assert!(sock.exists());
        let held = Pidfile::acquire(&pid, &sock).expect("acquire");
        assert_eq!(
            fs::read_to_string(&pid).expect("read").trim(),
            std::process::id().to_string()
        );
        assert!(!sock.exists(), "stale socket removed");
        drop(held);
        assert!(!pid.exists(), "pidfile removed on drop");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_is_held_by_one_agent_at_a_time() {
        let d = dir("dirlock").join("state");
        let held = DirLock::take(&d, "--state-dir").expect("made and locked");
        assert!(d.is_dir());
        let err = DirLock::take(&d, "--state-dir").err().expect("refused");
        assert_eq!(
            err.to_string(),
            format!(
                "another health-agent holds {} (--state-dir): each agent needs its own",
                d.display()
            )
        );
        drop(held);
        assert!(DirLock::take(&d, "--state-dir").is_ok(), "free once let go");
        let _ = fs::remove_dir_all(d.parent().expect("parent"));
    }

    /// A directory others may write to is refused, naming it, its flag
    /// and its mode; one the agent makes is its alone.
    #[test]
    fn a_directory_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = dir("private").join("state");
        drop(DirLock::take(&d, "--state-dir").expect("made and locked"));
        let mode = fs::metadata(&d).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o755);
        fs::set_permissions(&d, fs::Permissions::from_mode(0o1777)).expect("chmod");
        let err = DirLock::take(&d, "--state-dir").err().expect("refused");
        assert_eq!(
            err.to_string(),
            format!(
                "{} (--state-dir) is not the agent's alone: it is writable by its group or others (mode 1777; chmod go-w); the agent adopts and removes what it finds there",
                d.display()
            )
        );
        let _ = fs::remove_dir_all(d.parent().expect("parent"));
    }

    #[test]
    fn a_live_socket_is_not_taken_over() {
        let d = dir("live");
        let sock = d.join("b.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        let err = Pidfile::acquire(&d.join("b.pid"), &sock)
            .err()
            .expect("refused");
        assert!(matches!(err, PidfileError::SocketInUse { .. }), "{err}");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn two_agents_started_together_cannot_both_hold_the_pidfile() {
        let d = dir("twice");
        let pid = d.join("d.pid");
        let first = Pidfile::acquire(&pid, &d.join("d1.sock")).expect("first");
        let err = Pidfile::acquire(&pid, &d.join("d2.sock"))
            .err()
            .expect("the second is refused");
        match err {
            PidfileError::Running { pid: held_by, .. } => {
                assert_eq!(u32::try_from(held_by).ok(), Some(std::process::id()));
            }
            other => panic!("{other}"),
        }
        drop(first);
        let _again = Pidfile::acquire(&pid, &d.join("d2.sock")).expect("free again");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_file_at_the_socket_path_that_is_not_a_socket_is_never_removed() {
        let d = dir("notsock");
        let sock = d.join("e.sock");
        fs::write(&sock, "precious").expect("write");
        let err = Pidfile::acquire(&d.join("e.pid"), &sock)
            .err()
            .expect("refused");
        assert!(matches!(err, PidfileError::NotASocket { .. }), "{err}");
        assert!(err.to_string().contains("--socket"), "{err}");
        assert_eq!(fs::read_to_string(&sock).expect("kept"), "precious");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn garbage_pidfile_is_stale() {
        let d = dir("garbage");
        let pid = d.join("c.pid");
        fs::write(&pid, "not a pid").expect("write");
        let _held = Pidfile::acquire(&pid, &d.join("c.sock")).expect("acquire");
        let _ = fs::remove_dir_all(&d);
    }
}
