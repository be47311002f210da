//! The API's connections, as hyper reads and writes them: a write of
//! [sealed](crate::sys::sealed) bytes (the published status) goes out
//! with `sendfile(2)` from their file, the rest as written; a client
//! that stops reading its answer for [`WRITE_STALL`] has its connection
//! failed, so that it holds its slot no longer, nor queues more of its
//! send buffer (up to 2 MiB of kernel memory in the bulk lane).
//!
//! hyper writes an answer's head and body as slices, the body's the
//! published bytes themselves; a slice found among the sealed bytes is
//! sent from the file, the kernel attaching its pages to the socket
//! rather than copying them (where it cannot, `sendfile` copies, as a
//! write would). On Linux 6.18, writing 0.6 MB (the whole status at
//! 10,000 peers) into a unix socket costs the writer about 145 µs; sending
//! it from the file, about 40.

use std::{
    io::{self, IoSlice},
    os::fd::AsRawFd as _,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, Interest, ReadBuf},
    net::UnixStream,
    time::Sleep,
};

use crate::sys::{sealed, sockopt};

/// Slices shorter than this are written as they are: a lookup and a
/// system call of their own would cost more than their copy.
const MIN_SENT_FROM_FILE: usize = 64 << 10;

/// How long a write may wait for the client to read before the
/// connection fails (`TimedOut`). The agent's clients read as fast as the
/// answer comes; the whole status at 20,000 peers is about 1.2 MB.
pub(super) const WRITE_STALL: Duration = Duration::from_secs(30);

/// A connection of the API.
#[derive(Debug)]
pub(super) struct Connection {
    stream: UnixStream,
    /// `sendfile` failed as unsupported: the rest is written from memory.
    refused: bool,
    /// Armed when a write finds the socket full, disarmed by the next
    /// write that goes: past it, the write fails unless the client read
    /// something meanwhile.
    stall: Option<Pin<Box<Sleep>>>,
    /// While `stall` is armed, the bytes queued when it was (the timer is
    /// kept for the next stall).
    stalled: Option<usize>,
}

impl Connection {
    pub(super) fn new(stream: UnixStream) -> Self {
        Self {
            stream,
            refused: false,
            stall: None,
            stalled: None,
        }
    }

    /// `write`'s poll, failed with `TimedOut` once it has waited
    /// [`WRITE_STALL`] with the client reading nothing. (The kernel wakes a
    /// writer only once its queue has fallen to a quarter of the buffer:
    /// a client reading slowly is told from one reading nothing by the
    /// bytes still queued.)
    fn poll_unstalled(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(&mut Self, &mut Context<'_>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if let Poll::Ready(done) = write(self, cx) {
            self.stalled = None;
            return Poll::Ready(done);
        }
        let Self {
            stream,
            stall,
            stalled,
            ..
        } = self;
        let queued = || sockopt::queued(&*stream).unwrap_or(usize::MAX);
        let stall = stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL)));
        if stalled.is_none() {
            stall
                .as_mut()
                .reset(tokio::time::Instant::now() + WRITE_STALL);
            *stalled = Some(queued());
        }
        while stall.as_mut().poll(cx).is_ready() {
            let now = queued();
            if !stalled.is_some_and(|was| now < was) {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client read nothing for {WRITE_STALL:?}"),
                )));
            }
            // It read some: another stall's time for the rest.
            stall
                .as_mut()
                .reset(tokio::time::Instant::now() + WRITE_STALL);
            *stalled = Some(now);
        }
        Poll::Pending
    }

    /// Sends `len` bytes of `file` from `offset`, as much as the socket
    /// takes now.
    fn poll_send_file(
        &self,
        cx: &mut Context<'_>,
        file: &sealed::Sealed,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_io(Interest::WRITABLE, || {
                send_file(&self.stream, file, offset, len)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done),
            }
        }
    }

    /// Writes the slices before the first sealed one as they are; a
    /// sealed slice with nothing before it, from its file.
    fn poll_write_now(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let sealed = bufs.iter().enumerate().find_map(|(i, b)| {
            (!self.refused && b.len() >= MIN_SENT_FROM_FILE)
                .then(|| sealed::find(b))
                .flatten()
                .map(|found| (i, found, b.len()))
        });
        match sealed {
            // First, or after empty slices only: from its file.
            Some((i, (file, offset), len)) if bufs[..i].iter().all(|b| b.is_empty()) => {
                match ready!(self.poll_send_file(cx, &file, offset, len)) {
                    // A kernel or a socket that cannot: written from memory,
                    // now and from now on.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                        self.refused = true;
                        Pin::new(&mut self.stream).poll_write_vectored(cx, &bufs[i..=i])
                    }
                    done => Poll::Ready(done),
                }
            }
            Some((before, ..)) => {
                Pin::new(&mut self.stream).poll_write_vectored(cx, &bufs[..before])
            }
            None => Pin::new(&mut self.stream).poll_write_vectored(cx, bufs),
        }
    }
}

/// `sendfile(2)` of `len` bytes of `file` from `offset` to `to`.
fn send_file(to: &UnixStream, file: &sealed::Sealed, offset: u64, len: usize) -> io::Result<usize> {
    let mut off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: both descriptors are open for the call; `off` is a valid
    // `off_t` the kernel advances.
    let sent = unsafe { libc::sendfile(to.as_raw_fd(), file.fd().as_raw_fd(), &raw mut off, len) };
    let sent = usize::try_from(sent).map_err(|_| io::Error::last_os_error())?;
    #[cfg(test)]
    file.note_sent(sent);
    Ok(sent)
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_unstalled(cx, |conn, cx| conn.poll_write_now(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    fn sample(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 13 % 241) as u8).collect()
    }

    /// Writes `head` and `body` through a connection as hyper does (one
    /// vectored write, then the rest), reading the other end meanwhile.
    async fn through(head: &[u8], body: &[u8]) -> Vec<u8> {
        let (ours, theirs) = UnixStream::pair().expect("socket pair");
        let want = head.len() + body.len();
        let reader = tokio::spawn(async move {
            let mut theirs = theirs;
            let mut got = Vec::with_capacity(want);
            while got.len() < want {
                let mut chunk = vec![0u8; 64 << 10];
                let n = theirs.read(&mut chunk).await.expect("read");
                assert!(n > 0, "the writer ended early");
                got.extend_from_slice(&chunk[..n]);
            }
            got
        });
        let mut conn = Connection::new(ours);
        let (mut h, mut b) = (head, body);
        while !h.is_empty() || !b.is_empty() {
            let mut n = conn
                .write_vectored(&[IoSlice::new(h), IoSlice::new(b)])
                .await
                .expect("write");
            assert!(n > 0);
            let from_head = n.min(h.len());
            h = &h[from_head..];
            n -= from_head;
            b = &b[n..];
        }
        conn.flush().await.expect("flush");
        reader.await.expect("reader")
    }

    #[tokio::test]
    async fn sealed_bytes_go_out_from_their_file_whole_and_in_order() {
        let data = sample(2 << 20);
        let body = sealed::bytes(data.clone(), c"health-test");
        let head = b"HTTP/1.1 200 OK\r\ncontent-length: 2097152\r\n\r\n";
        let (file, _) = sealed::find(&body).expect("sealed");
        // 2 MiB through the default socket buffers: many partial sends,
        // the writer waiting for the reader between them.
        let got = through(head, &body).await;
        assert_eq!(&got[..head.len()], head);
        assert!(got[head.len()..] == data[..], "the body arrives as it was");
        assert!(
            file.sent() == data.len() as u64,
            "the body went out from its file"
        );
    }

    #[tokio::test]
    async fn a_reader_gone_mid_body_fails_that_send_and_nothing_else() {
        let data = sample(2 << 20);
        let body = sealed::bytes(data.clone(), c"health-test");
        let (ours, theirs) = UnixStream::pair().expect("socket pair");
        let mut conn = Connection::new(ours);
        // As much as the socket's buffer takes, from the file.
        let n = conn.write(&body).await.expect("the first part goes");
        assert!(n > 0 && n < body.len(), "{n}");
        let (file, _) = sealed::find(&body).expect("sealed");
        assert_eq!(file.sent(), n as u64, "sent from the file");
        drop(theirs);
        // The rest, to a reader that went: an error for this connection
        // (no signal ends the process, no wait for a reader).
        let err = conn
            .write(&body[n..])
            .await
            .expect_err("the reader is gone");
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "{err}"
        );
        // The bytes are whole for every other reader.
        assert!(body[..] == data[..], "the bytes changed");
        assert!(
            through(b"", &body).await == data,
            "the next connection gets it all"
        );
    }

    #[tokio::test]
    async fn bytes_in_memory_are_written_as_they_are() {
        let data = sample(300_000);
        let head = b"HTTP/1.1 200 OK\r\n\r\n";
        let got = through(head, &data).await;
        assert_eq!(&got[..head.len()], head);
        assert!(got[head.len()..] == data[..], "the body arrives as it was");
    }

    /// Writes `data` through `conn` until it is all written or a write
    /// fails.
    async fn write_all(conn: &mut Connection, data: &[u8]) -> io::Result<()> {
        let mut rest = data;
        while !rest.is_empty() {
            let n = conn.write(rest).await?;
            rest = &rest[n..];
        }
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_fails_the_write_after_the_stall() {
        let (ours, theirs) = UnixStream::pair().expect("socket pair");
        let mut conn = Connection::new(ours);
        let started = tokio::time::Instant::now();
        // Far more than the socket's buffers hold, to a reader that reads
        // nothing.
        let err = write_all(&mut conn, &sample(8 << 20))
            .await
            .expect_err("the write waits for a reader that never reads");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert_eq!(
            started.elapsed(),
            WRITE_STALL,
            "failed at the stall, not before"
        );
        drop(theirs);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_not_cut_off() {
        let (ours, mut theirs) = UnixStream::pair().expect("socket pair");
        // The bulk lane's buffer: the writer is woken only once the reader
        // has taken three quarters of it, many reads and stalls away.
        sockopt::size_buffer(&ours, sockopt::Buffer::Send, 1 << 20).expect("SO_SNDBUF");
        let data = sample(8 << 20);
        let want = data.len();
        // 64 KiB every two thirds of the stall: the writer waits many
        // stalls' time between its writes, the reader reading throughout.
        let reader = tokio::spawn(async move {
            let mut got = Vec::with_capacity(want);
            let mut chunk = vec![0u8; 64 << 10];
            while got.len() < want {
                tokio::time::sleep(WRITE_STALL * 2 / 3).await;
                let n = theirs.read(&mut chunk).await.expect("read");
                assert!(n > 0, "the writer ended early");
                got.extend_from_slice(&chunk[..n]);
            }
            got
        });
        let mut conn = Connection::new(ours);
        let started = tokio::time::Instant::now();
        write_all(&mut conn, &data).await.expect("every write goes");
        assert!(
            started.elapsed() > WRITE_STALL * 2,
            "the reader took {:?}: not slow enough to test",
            started.elapsed()
        );
        assert!(
            reader.await.expect("reader") == data,
            "the data arrives whole"
        );
    }
}
