//! When a changed nodes file is taken: only once its content is stable, so
//! that a file read while it is being written is never applied (half a
//! file may well parse, as a shorter list of nodes).
//!
//! A version is taken when it was read whole (its `stat` the same after
//! the read as before) and
//! - it was renamed into place since the last look (an atomic replace, as
//!   `mv`, editors and configuration tools do): at once; or
//! - its last write seen was followed by its writer closing it, or no
//!   write was seen (no watch, a file reached through a link into another
//!   directory, a change made before the watch), and its last change is
//!   two seconds old or its content was read the same for [`QUIET`]; or
//! - it was written and not closed since, and its content was read the
//!   same for [`OPEN_QUIET`]: a writer that keeps it open, or pauses part
//!   way (a slow copy), is followed that long, so that its first part is
//!   not taken for the file.
//!
//! Renames, writes and closes are seen with inotify on the file's
//! directory, drained at each poll, in order: a write after a close (`>`
//! then `>>`) is a writer at work again.

use std::{
    ffi::OsString,
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tracing::{debug, warn};

use super::file_version::FileVersion;

/// How long an in-place change must stay the same before it is taken.
pub const QUIET: Duration = Duration::from_secs(1);

/// How long an in-place change whose writer has not closed the file must
/// stay the same before it is taken.
pub const OPEN_QUIET: Duration = Duration::from_secs(10);

/// What the directory's events said since the last look.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Look {
    /// The file was renamed into place.
    pub renamed: bool,
    /// The last write of the file seen: `Some(true)` when its writer
    /// closed it after, `Some(false)` when it is written and not closed
    /// since, `None` when nothing was seen (no watch, a file reached
    /// through a link elsewhere, or no write since the last look).
    pub closed: Option<bool>,
}

impl Look {
    /// Nothing seen: stability alone.
    pub const UNWATCHED: Self = Self {
        renamed: false,
        closed: None,
    };
}

/// The version waiting to be taken, since when its content was read the
/// same, and what its writer was last seen doing (see [`Look::closed`]).
#[derive(Debug, Default)]
pub struct Settling {
    pending: Option<(FileVersion, Instant, Option<bool>)>,
}

impl Settling {
    /// Whether the version just read may be taken, given what the
    /// directory's events said since the last look (`look`); `now` and
    /// `wall` are the monotonic and wall clocks' readings.
    pub fn offer(
        &mut self,
        version: FileVersion,
        look: Look,
        now: Instant,
        wall: SystemTime,
    ) -> bool {
        if !version.consistent() {
            // Being written while it was read.
            self.pending = None;
            return false;
        }
        if look.renamed {
            self.pending = None;
            return true;
        }
        // The same content (its metadata may change: a `chmod` after the
        // copy) keeps its quiet time and what its writer did, updated by
        // what was seen since; new content starts over with what came
        // with it.
        let (since, closed) = match self.pending {
            Some((seen, since, closed)) if seen.same_content(&version) => {
                (since, look.closed.or(closed))
            }
            _ => (now, look.closed),
        };
        let quiet = now.saturating_duration_since(since);
        let take = if closed == Some(false) {
            // Written and not closed since: a writer may be paused part
            // way, whatever the file's times say.
            quiet >= OPEN_QUIET
        } else {
            version.settled(wall) || quiet >= QUIET
        };
        self.pending = (!take).then_some((version, since, closed));
        take
    }

    /// The version waiting to be taken, if any.
    #[must_use]
    pub fn pending(&self) -> Option<FileVersion> {
        self.pending.map(|(v, ..)| v)
    }

    /// Forgets the waiting version (the file is as it was, or gone).
    pub fn clear(&mut self) {
        self.pending = None;
    }
}

/// The events watched in the file's directory.
const WATCHED: AddWatchFlags = AddWatchFlags::IN_MOVED_TO
    .union(AddWatchFlags::IN_CLOSE_WRITE)
    .union(AddWatchFlags::IN_MODIFY);

/// Kubernetes' projected volumes (the files of a config map) swap their content
/// by renaming this link in the directory; the files are links through it.
const ATOMIC_WRITER_LINK: &str = "..data";

/// Renames into a file's place, seen with inotify on its directory. A
/// directory removed (and made again) is watched again at the next look.
#[derive(Debug)]
pub struct Renames {
    inotify: Inotify,
    dir: std::path::PathBuf,
    name: OsString,
    /// Whether the watch went with its directory (`IN_IGNORED`).
    lost: std::cell::Cell<bool>,
}

impl Renames {
    /// Watches the directory of `path`; `None` (with a warning) where no
    /// watch can be set.
    #[must_use]
    pub fn watch(path: &Path) -> Option<Self> {
        let name = path.file_name()?.to_owned();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let watched = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).and_then(|i| {
            i.add_watch(dir, WATCHED)?;
            Ok(i)
        });
        match watched {
            Ok(inotify) => Some(Self {
                inotify,
                dir: dir.to_owned(),
                name,
                lost: std::cell::Cell::new(false),
            }),
            Err(e) => {
                warn!(
                    dir = %dir.display(),
                    "cannot watch the nodes file's directory for renames ({e}): a change is taken once it stopped changing"
                );
                None
            }
        }
    }

    /// Whether the file was renamed into place since the last call (see
    /// [`Self::look`], whose other news it drops).
    pub fn renamed_in(&self) -> bool {
        self.look().renamed
    }

    /// What happened to the file since the last call (the events are
    /// drained): renamed into place (its own name, or the link a
    /// Kubernetes projected volume swaps), and its last write, closed or
    /// not (see [`Look::closed`]). A watch lost with its directory is set
    /// again; until it can be, nothing is seen.
    pub fn look(&self) -> Look {
        if self.lost.get() {
            if self.inotify.add_watch(&self.dir, WATCHED).is_err() {
                return Look::UNWATCHED;
            }
            debug!(dir = %self.dir.display(), "the nodes file's directory is watched again");
            self.lost.set(false);
        }
        let (mut renamed, mut closed) = (false, None);
        loop {
            match self.inotify.read_events() {
                Ok(events) if !events.is_empty() => {
                    for e in &events {
                        let name = e.name.as_deref();
                        renamed |= e.mask.contains(AddWatchFlags::IN_MOVED_TO)
                            && name.is_some_and(|n| {
                                n == self.name.as_os_str() || n == ATOMIC_WRITER_LINK
                            });
                        // In order: a write after a close is a writer
                        // at work again (`>` then `>>`).
                        if name == Some(self.name.as_os_str()) {
                            if e.mask.contains(AddWatchFlags::IN_MODIFY) {
                                closed = Some(false);
                            }
                            if e.mask.contains(AddWatchFlags::IN_CLOSE_WRITE) {
                                closed = Some(true);
                            }
                        }
                        if e.mask.contains(AddWatchFlags::IN_IGNORED) {
                            warn!(
                                dir = %self.dir.display(),
                                "the nodes file's directory went: renames into it are watched again once it is back"
                            );
                            self.lost.set(true);
                        }
                    }
                }
                Ok(_) | Err(nix::errno::Errno::EAGAIN) => break,
                Err(e) => {
                    debug!("reading the nodes file's directory events: {e}");
                    break;
                }
            }
        }
        Look {
            renamed,
            closed: closed.filter(|_| !self.lost.get()),
        }
    }
}

/// Reads `path` once its content is stable (the rules above, renames
/// aside), polling every `poll`, for at most `limit`: the nodes file at
/// start. An error names the file when it cannot be read or kept
/// changing.
pub fn read_settled(
    path: &Path,
    poll: Duration,
    limit: Duration,
) -> std::io::Result<(Vec<u8>, FileVersion)> {
    let started = Instant::now();
    let mut settling = Settling::default();
    loop {
        let (text, version) = FileVersion::read(path)?;
        if settling.offer(version, Look::UNWATCHED, Instant::now(), SystemTime::now()) {
            return Ok((text, version));
        }
        if started.elapsed() >= limit {
            return Err(std::io::Error::other(format!(
                "still being written after {limit:?}: not taken"
            )));
        }
        debug!(path = %path.display(), "the nodes file is changing: waiting for it to settle");
        std::thread::sleep(poll);
    }
}

#[cfg(test)]
mod tests;
