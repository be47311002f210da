//! Bytes written once and then only sent: kept in a sealed memfd, mapped
//! read-only, so that a socket can be handed their pages (`sendfile(2)`)
//! instead of a copy of them.
//!
//! The published status (0.6 MB gzipped at 10,000 peers) goes out whole
//! to every client that asks; written from memory, each answer copies it
//! into the socket's buffers. From a sealed file, the kernel attaches the
//! file's pages to the socket's buffers and the client's read is the only
//! copy. The seals (no write, no resize, no more seals) make the pages
//! immutable while a socket holds them, even after the agent has dropped
//! the bytes.
//!
//! [`bytes()`] makes such bytes; [`find`] tells whether a slice lies in
//! bytes it made, and where in their file: a writer that is handed a slice
//! (hyper hands its writes as slices) learns it may send it from the file.
//! The mapping is never written and, unless something reads the bytes
//! themselves, never touched: the pages are the file's, counted as shared
//! memory in the cgroup, not in the agent's heap.

use std::{
    ffi::CStr,
    fs::File,
    io::{self, Write as _},
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    ptr::NonNull,
    sync::{Arc, Mutex, Weak},
};

use bytes::Bytes;

/// A sealed memfd and its read-only mapping.
#[derive(Debug)]
pub struct Sealed {
    file: OwnedFd,
    at: NonNull<u8>,
    len: usize,
    /// Bytes sent from the file, for the tests to see the way taken.
    #[cfg(test)]
    sent: std::sync::atomic::AtomicU64,
}

// SAFETY: the mapping is read-only and the file sealed against writes: the
// bytes never change while mapped, so any thread may read them.
unsafe impl Send for Sealed {}
// SAFETY: as for `Send`: shared reads of immutable memory.
unsafe impl Sync for Sealed {}

impl Sealed {
    /// The sealed file.
    #[must_use]
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `at` maps `len` readable bytes until `self` drops.
        unsafe { std::slice::from_raw_parts(self.at.as_ptr(), self.len) }
    }

    /// Counts `n` bytes sent from the file.
    #[cfg(test)]
    pub fn note_sent(&self, n: usize) {
        self.sent
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Bytes sent from the file so far.
    #[cfg(test)]
    pub fn sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Sealed {
    fn drop(&mut self) {
        let start = self.at.as_ptr() as usize;
        // Out of the registry before the address can be mapped again.
        REGISTRY
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|e| e.start != start);
        // SAFETY: the mapping made in `seal`, of `len` bytes, unmapped once.
        unsafe { libc::munmap(self.at.as_ptr().cast(), self.len) };
    }
}

/// A live mapping of sealed bytes: where it is, and the bytes.
struct Entry {
    start: usize,
    len: usize,
    held: Weak<Sealed>,
}

impl Entry {
    /// Where the `len` bytes at address `at` start in the file, when all of
    /// them lie in the mapping.
    fn offset_of(&self, at: usize, len: usize) -> Option<u64> {
        let off = at.checked_sub(self.start)?;
        (off.checked_add(len)? <= self.len).then_some(off as u64)
    }
}

/// The live sealed bytes. A handful at most (the status a round, the
/// cluster view), each for a round or two. Only addresses are compared
/// under the lock: bytes are never upgraded, nor dropped, while it is held
/// (their drop takes it).
static REGISTRY: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Why bytes could not be sealed (they are kept in memory instead).
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct SealError {
    step: &'static str,
    source: io::Error,
}

fn fail(step: &'static str) -> impl FnOnce(io::Error) -> SealError {
    move |source| SealError { step, source }
}

/// Writes `data` to a new memfd named `name`, seals it and maps it
/// read-only.
fn seal(data: &[u8], name: &CStr) -> Result<Sealed, SealError> {
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: `name` is a C string; the descriptor returned is owned here.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(fail("memfd_create")(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new descriptor no one else owns.
    let mut written = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    written.write_all(data).map_err(fail("write"))?;
    let file = OwnedFd::from(written);
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor owned here.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(fail("F_ADD_SEALS")(io::Error::last_os_error()));
    }
    // SAFETY: a new read-only shared mapping of the whole sealed file.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            data.len(),
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(fail("mmap")(io::Error::last_os_error()));
    }
    let at =
        NonNull::new(at.cast::<u8>()).ok_or_else(|| fail("mmap")(io::ErrorKind::Other.into()))?;
    Ok(Sealed {
        file,
        at,
        len: data.len(),
        #[cfg(test)]
        sent: std::sync::atomic::AtomicU64::new(0),
    })
}

/// What [`Bytes`] holds of sealed bytes.
struct Owner(Arc<Sealed>);

impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// `data` as bytes in a sealed memfd (`name` shows in `/proc/PID/fd`), or
/// in memory as they are when they are empty or the system refuses (the
/// reason logged): sending them then copies them, as any bytes.
#[must_use]
pub fn bytes(data: Vec<u8>, name: &CStr) -> Bytes {
    if data.is_empty() {
        return Bytes::new();
    }
    match seal(&data, name) {
        Ok(sealed) => {
            let sealed = Arc::new(sealed);
            REGISTRY
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(Entry {
                    start: sealed.at.as_ptr() as usize,
                    len: sealed.len,
                    held: Arc::downgrade(&sealed),
                });
            Bytes::from_owner(Owner(sealed))
        }
        Err(e) => {
            tracing::debug!(error = %e, "keeping {} bytes in memory", data.len());
            Bytes::from(data)
        }
    }
}

/// The sealed bytes `slice` lies in, and its offset in their file; `None`
/// for any other slice.
#[must_use]
pub fn find(slice: &[u8]) -> Option<(Arc<Sealed>, u64)> {
    locate(slice.as_ptr() as usize, slice.len())
}

/// [`find`] for the `len` bytes at address `at`.
fn locate(at: usize, len: usize) -> Option<(Arc<Sealed>, u64)> {
    let (held, off) = REGISTRY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .find_map(|e| Some((e.held.clone(), e.offset_of(at, len)?)))?;
    // Upgraded with the lock released: the last strong reference, dropped
    // here, takes the lock to leave the registry.
    Some((held.upgrade()?, off))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn sealed_bytes_read_back_and_are_found_with_their_offset() {
        let data = sample(300_000);
        let b = bytes(data.clone(), c"health-test");
        assert_eq!(&b[..], &data[..]);
        let (file, off) = find(&b[1000..5000]).expect("a slice of sealed bytes is found");
        assert_eq!(off, 1000);
        // The file holds the same bytes at that offset.
        let mut read = vec![0u8; 4000];
        // SAFETY: pread into a buffer of the length given.
        let n = unsafe {
            libc::pread(
                file.fd().as_raw_fd(),
                read.as_mut_ptr().cast(),
                read.len(),
                1000,
            )
        };
        assert_eq!(n, 4000);
        assert_eq!(read, &data[1000..5000]);
        // A slice in memory, and one running past the end, are not.
        assert!(find(&data[..]).is_none());
        let past = b.slice(299_000..);
        assert!(find(&past).is_some());
        // One byte more runs past the mapping's end.
        assert!(locate(past.as_ptr() as usize, past.len() + 1).is_none());
    }

    #[test]
    fn the_file_refuses_writes_and_dropped_bytes_are_forgotten() {
        let b = bytes(sample(10_000), c"health-test");
        let (file, _) = find(&b).expect("found");
        let fd = file.fd().as_raw_fd();
        // SAFETY: a one-byte write from a valid buffer.
        let wrote = unsafe { libc::pwrite(fd, [1u8].as_ptr().cast(), 1, 0) };
        assert_eq!(wrote, -1, "a sealed file takes no write");
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EPERM));
        let weak = Arc::downgrade(&file);
        drop((file, b));
        assert!(
            weak.upgrade().is_none(),
            "the last bytes dropped close the file"
        );
        assert!(
            REGISTRY
                .lock()
                .expect("registry")
                .iter()
                .all(|e| !e.held.ptr_eq(&weak)),
            "dropped bytes leave the registry"
        );
    }

    #[test]
    fn empty_bytes_stay_in_memory() {
        let b = bytes(Vec::new(), c"health-test");
        assert!(b.is_empty());
        assert!(find(&b).is_none());
    }
}
