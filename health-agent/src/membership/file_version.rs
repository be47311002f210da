//! A version of a watched file, known without keeping its content: what
//! `stat` says of it (`Stamp`) and a hash of its text. The nodes-file
//! watcher polls twice a second; at 10,000 nodes the file is a megabyte,
//! which it then neither reads nor holds while nothing changes.

use std::{
    hash::{Hash as _, Hasher as _},
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// A file as it was read: its stamp (taken before the read, so that a
/// change during the read leaves a newer one) and a hash of its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileVersion {
    stamp: Option<Stamp>,
    hash: u64,
    /// Whether the stamp was the same after the read as before: a file
    /// being written while it was read is not.
    consistent: bool,
}

/// The largest nodes file read, in bytes: 50,000 records written one
/// field a line take about 10 MiB. A larger file is refused whole, and
/// never read past this.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

impl FileVersion {
    /// Reads `path`: its bytes, and the version it is. Only a regular file
    /// of at most [`MAX_FILE_BYTES`] is read, opened without blocking.
    ///
    /// # Errors
    /// The file cannot be opened or read, is no regular file, or is
    /// larger.
    pub fn read(path: &Path) -> std::io::Result<(Vec<u8>, Self)> {
        Self::read_or_refused(path).map_err(|(e, _)| e)
    }

    /// [`Self::read`], and on an error, the version of a file refused for
    /// what it is (no regular file, too large) as `stat` said before the
    /// read: it is not read again until it changes (a file changed since
    /// then is read at the next look). Any other error (gone, too many
    /// open files) gives none, and the file is read at every look.
    ///
    /// # Errors
    /// As [`Self::read`].
    pub fn read_or_refused(path: &Path) -> Result<(Vec<u8>, Self), (std::io::Error, Option<Self>)> {
        let stamp = Stamp::of(path);
        let bytes = read_regular(path, MAX_FILE_BYTES).map_err(|e| {
            let refused = matches!(
                e.kind(),
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData
            );
            let version = stamp.filter(|_| refused).map(|stamp| Self {
                stamp: Some(stamp),
                hash: 0,
                consistent: false,
            });
            (e, version)
        })?;
        let mut h = std::hash::DefaultHasher::new();
        bytes.hash(&mut h);
        let consistent = stamp.is_some() && Stamp::of(path) == stamp;
        Ok((
            bytes,
            Self {
                stamp,
                hash: h.finish(),
                consistent,
            },
        ))
    }

    /// Whether nothing changed the file while it was read.
    #[must_use]
    pub fn consistent(&self) -> bool {
        self.consistent
    }

    /// This version as if the file had changed while it was read.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn torn(mut self) -> Self {
        self.consistent = false;
        self
    }

    /// Whether the file's last change (content or metadata) was long
    /// enough before `now` (two seconds) for nobody to be writing it.
    #[must_use]
    pub fn settled(&self, now: SystemTime) -> bool {
        self.stamp.is_some_and(|s| s.settled(now))
    }

    /// Whether `path` may differ from this version, by `stat` alone: a
    /// new stamp, no stamp, or a last change too recent to vouch for.
    #[must_use]
    pub fn may_have_changed(&self, path: &Path, now: SystemTime) -> bool {
        let stamp = Stamp::of(path);
        !(stamp == self.stamp && stamp.is_some_and(|s| s.settled(now)))
    }

    /// Whether `other` has the same text.
    #[must_use]
    pub fn same_content(&self, other: &Self) -> bool {
        self.hash == other.hash
    }
}

/// Reads the regular file at `path` (a symbolic link to one is
/// followed), of at most `max` bytes. It is opened without blocking, so
/// that a FIFO put in its place never holds the reader; a device, a
/// directory or a socket is refused before anything is read, and a file
/// larger than `max` after `max + 1` bytes.
fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::{
        io::{Error, ErrorKind, Read as _},
        os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{what}, not a regular file"),
        ));
    }
    let expected = usize::try_from(meta.len().min(max)).unwrap_or(0);
    let mut bytes = Vec::with_capacity(expected);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("larger than {max} bytes: not read"),
        ));
    }
    Ok(bytes)
}

/// What `stat` says of a file: its identity, size and times. An unchanged
/// stamp means unchanged content only once the file's last change is
/// [`Stamp::SETTLE`] old: a write in the same clock tick as the previous
/// one (a timestamp's granularity is the kernel's tick) leaves the times
/// as they were, so a recently changed file is read anyway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    const SETTLE: Duration = Duration::from_secs(2);

    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// Whether the file's last change (content or metadata) is at least
    /// [`Stamp::SETTLE`] before `now`. By its change time alone: every
    /// write sets it to the kernel's clock, and no one can set it, while
    /// the modification time can be set to any date (`touch -d 2030`),
    /// which would make the file never settle and be read at every poll.
    fn settled(&self, now: SystemTime) -> bool {
        let latest = self.ctime;
        let secs = u64::try_from(latest.0).unwrap_or(0);
        let nanos = u32::try_from(latest.1).unwrap_or(0);
        let changed = UNIX_EPOCH + Duration::new(secs, nanos);
        now.duration_since(changed)
            .is_ok_and(|age| age >= Self::SETTLE)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A directory of its own for a test, holding `nodes.yaml` as
    /// written; removed when dropped, a failed test's too.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str) -> (Self, PathBuf) {
            let dir = std::env::temp_dir().join(format!("{test}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("dir");
            let path = dir.join("nodes.yaml");
            std::fs::write(&path, "nodes: []\n").expect("write");
            (Self(dir), path)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_file_is_read_again_until_its_last_change_settles() {
        let (scratch, path) = Scratch::new("stamp");
        let dir = &scratch.0;
        let fresh = Stamp::of(&path).expect("stamp");
        assert!(
            !fresh.settled(SystemTime::now()),
            "just written: its stamp cannot vouch for its content yet"
        );
        assert!(fresh.settled(SystemTime::now() + Stamp::SETTLE));
        // Same size, new content: a new stamp (or, in the same tick, an
        // unsettled one, which is read anyway).
        std::fs::write(&path, "nodes: {}\n").expect("rewrite");
        let again = Stamp::of(&path).expect("stamp");
        assert!(again != fresh || !again.settled(SystemTime::now()));
        // An old file, untouched: settled, and its stamp stays.
        let old = SystemTime::now() - Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .expect("open")
            .set_modified(old)
            .expect("mtime");
        let stamp = Stamp::of(&path).expect("stamp");
        // Setting the time is a change of metadata (ctime) just now.
        assert!(!stamp.settled(SystemTime::now()));
        assert!(stamp.settled(SystemTime::now() + Stamp::SETTLE));
        assert_eq!(Stamp::of(&path), Some(stamp));
        // A modification time set a year ahead: settled all the same once
        // the change itself is old, not left to be read at every poll.
        std::fs::File::options()
            .write(true)
            .open(&path)
            .expect("open")
            .set_modified(SystemTime::now() + Duration::from_hours(365 * 24))
            .expect("mtime");
        let ahead = Stamp::of(&path).expect("stamp");
        assert!(!ahead.settled(SystemTime::now()));
        assert!(ahead.settled(SystemTime::now() + Stamp::SETTLE));
        // Replaced by another file (as editors and config maps do): a new
        // identity.
        let other = dir.join("next.yaml");
        std::fs::write(&other, "nodes: {}\n").expect("write");
        std::fs::rename(&other, &path).expect("replace");
        assert_ne!(Stamp::of(&path), Some(stamp));
        assert_eq!(Stamp::of(&dir.join("absent")), None);
    }

    #[test]
    fn a_version_says_when_the_file_may_differ_and_whether_it_does() {
        let (_scratch, path) = Scratch::new("version");
        let (text, v) = FileVersion::read(&path).expect("read");
        assert_eq!(text, b"nodes: []\n");
        let later = SystemTime::now() + Stamp::SETTLE;
        assert!(v.may_have_changed(&path, SystemTime::now()), "too recent");
        assert!(!v.may_have_changed(&path, later), "settled and untouched");
        // Rewritten with the same text: read again, found the same.
        std::fs::write(&path, "nodes: []\n").expect("rewrite");
        let (_, again) = FileVersion::read(&path).expect("read");
        assert!(again.same_content(&v));
        // Other text of the same size: read again, found different.
        std::fs::write(&path, "nodes: {}\n").expect("edit");
        assert!(v.may_have_changed(&path, SystemTime::now()), "just edited");
        let (_, edited) = FileVersion::read(&path).expect("read");
        assert!(!edited.same_content(&v));
        // Gone: it may have changed, and reading it fails.
        std::fs::remove_file(&path).expect("remove");
        assert!(v.may_have_changed(&path, later));
        assert!(FileVersion::read(&path).is_err());
    }

    /// Only a regular file is read, and only up to the limit: a FIFO put
    /// in its place is refused at once (never waited on), a device behind
    /// a symbolic link, a directory, and a file past the limit are each
    /// refused naming what they are; a symbolic link to a regular file is
    /// followed.
    #[test]
    fn only_a_regular_file_within_the_limit_is_read() {
        let (scratch, path) = Scratch::new("regular");
        let refused = |p: &Path, max| read_regular(p, max).expect_err("refused").to_string();
        let fifo = scratch.0.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid C string; mkfifo touches nothing else.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        assert_eq!(refused(&fifo, 1 << 20), "a FIFO, not a regular file");
        let device = scratch.0.join("zero.yaml");
        std::os::unix::fs::symlink("/dev/zero", &device).expect("symlink");
        assert_eq!(refused(&device, 1 << 20), "a device, not a regular file");
        assert_eq!(
            refused(&scratch.0, 1 << 20),
            "a directory, not a regular file"
        );
        assert_eq!(refused(&path, 4), "larger than 4 bytes: not read");
        assert_eq!(
            read_regular(&path, 10).expect("at the limit"),
            b"nodes: []\n"
        );
        let link = scratch.0.join("link.yaml");
        std::os::unix::fs::symlink(&path, &link).expect("symlink");
        let (bytes, _) = FileVersion::read(&link).expect("a link to a file");
        assert_eq!(bytes, b"nodes: []\n");
        // Refused for what it is, a file still has a version, so that it is
        // not read again until it changes; a gone one has none.
        let (_, v) = FileVersion::read_or_refused(&device).expect_err("a device");
        let v = v.expect("a version");
        assert!(!v.may_have_changed(&device, SystemTime::now() + Duration::from_secs(3600)));
        let (_, gone) = FileVersion::read_or_refused(&scratch.0.join("absent")).expect_err("gone");
        assert!(gone.is_none());
    }
}
