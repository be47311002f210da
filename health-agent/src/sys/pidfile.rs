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
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// Holds the pidfile; removes it when dropped.
pub struct Pidfile {
    path: PathBuf,
}

impl Pidfile {
    /// Removes a pidfile whose process is gone (a crashed agent) and a stale
    /// socket nobody listens on, then writes our pid.
    pub fn acquire(path: &Path, socket: &Path) -> Result<Self, PidfileError> {
        let io = |op, p: &Path| {
            let path = p.to_owned();
            move |source| PidfileError::Io { op, path, source }
        };
        if let Ok(text) = fs::read_to_string(path) {
            match text.trim().parse::<i32>() {
                Ok(pid) if pid != 0 && is_agent(pid) => {
                    return Err(PidfileError::Running {
                        pid,
                        path: path.to_owned(),
                    });
                }
                _ => {
                    info!(path = %path.display(), "removing a stale pidfile left by a previous agent");
                    fs::remove_file(path).map_err(io("removing", path))?;
                }
            }
        }
        if socket.exists() {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Err(PidfileError::SocketInUse {
                    path: socket.to_owned(),
                });
            }
            info!(path = %socket.display(), "removing a stale API socket left by a previous agent");
            fs::remove_file(socket).map_err(io("removing", socket))?;
        }
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(io("creating", dir))?;
        }
        fs::write(path, format!("{}\n", std::process::id())).map_err(io("writing", path))?;
        Ok(Self {
            path: path.to_owned(),
        })
    }
}

impl Drop for Pidfile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Whether `pid` is a live process running a health-agent binary.
fn is_agent(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|c| c.trim().starts_with("health-agent"))
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
    fn garbage_pidfile_is_stale() {
        let d = dir("garbage");
        let pid = d.join("c.pid");
        fs::write(&pid, "not a pid").expect("write");
        let _held = Pidfile::acquire(&pid, &d.join("c.sock")).expect("acquire");
        let _ = fs::remove_dir_all(&d);
    }
}
