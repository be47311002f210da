//! One connection of the metrics listener: HTTP/1.1 by hyper, with a
//! header-read timeout, an idle timeout, an age past which it is asked to
//! end, and the slots of the listener's caps.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::Router;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use crate::util::{admission::Admitted, source::Source};

/// How long a client may take to send a whole request head. Prometheus
/// and browsers send theirs in one segment, so 5 s is ample on a slow
/// link; a client trickling one (slowloris) holds its slot no longer.
/// hyper runs this timer whenever a connection waits for a request, so it
/// is also the keep-alive idle timeout: a kept-alive connection with no
/// next request within it is closed.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection moving no byte either way for this long is closed,
/// whatever it is doing (a client that stops reading its response, say):
/// longer than [`HEADER_TIMEOUT`], which covers waiting for requests.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once. A connection past them takes the place of
/// an idle one, or of one of the client holding the most (see
/// [`crate::util::admission`]), or is closed as soon as it is accepted.
/// Prometheus holds one, a browser up to six per page.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections served at once from one source (an IPv4 address or an IPv6
/// /64): one client cannot take every slot and leave Prometheus out; a
/// source at its share turns over its own idle connections.
pub const PER_SOURCE: usize = 16;
/// A connection this old is asked to end: the answer in flight finishes,
/// no further request is read (its client opens a new connection). A
/// client reading its answer a byte at a time, which the idle timeout
/// alone would let hold its slot for ever, holds it no longer.
pub const MAX_AGE: Duration = Duration::from_secs(60);
/// Once asked to end (its age, or the agent stopping), a connection has
/// this long to finish its answer in flight, then is closed.
pub const GRACE: Duration = Duration::from_secs(5);
/// The largest request head read (hyper's minimum is 8 KiB); the listener's
/// requests are short GETs, a browser's cookies for `localhost` included.
const MAX_BUF: usize = 64 * 1024;

/// The listener's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub per_source: usize,
    pub max_age: Duration,
    pub grace: Duration,
}

impl Limits {
    /// [`HEADER_TIMEOUT`], [`IDLE_TIMEOUT`], [`MAX_CONNECTIONS`],
    /// [`PER_SOURCE`], [`MAX_AGE`], [`GRACE`].
    pub const LISTENER: Self = Self {
        header_timeout: HEADER_TIMEOUT,
        idle_timeout: IDLE_TIMEOUT,
        max_connections: MAX_CONNECTIONS,
        per_source: PER_SOURCE,
        max_age: MAX_AGE,
        grace: GRACE,
    };
}

/// When a connection last moved a byte, in nanoseconds since it started.
struct Activity {
    start: Instant,
    last: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.store(ns, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }
}

/// A stream that notes when it last moved a byte.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The busy mark of a connection whose whole first request head is here
/// when it is accepted (read without taking it off the socket, and
/// parsed as hyper will: empty lines before a request are no request): a
/// client sends its request as it connects, and such a connection must
/// not be closed as idle for a newer one of its source while its task
/// waits to run behind a burst of accepts. Held until hyper takes that
/// request. A head longer than [`PEEKED`] is not looked for.
pub(super) fn arrived(stream: &TcpStream, slot: &Arc<Admitted<Source>>) -> Option<Busy> {
    use nix::sys::socket::{MsgFlags, recv};
    let mut buf = [0u8; PEEKED];
    // Straight from the socket: no waker, and none of the accept loop's
    // cooperative budget, which would leave it unread in a burst.
    let fd = std::os::fd::AsRawFd::as_raw_fd(stream);
    let n = recv(fd, &mut buf, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT).ok()?;
    // hyper's own bound on a request's headers.
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let parsed = httparse::Request::new(&mut headers).parse(&buf[..n]);
    matches!(parsed, Ok(httparse::Status::Complete(_))).then(|| Busy::new(slot))
}

/// The most of a first request looked at when it is accepted.
const PEEKED: usize = 4096;

/// Serves `stream` until it ends, is idle past `limits.idle_timeout`, is
/// closed to make room for another ([`Admitted::evicted`]), or is asked
/// to end (past `limits.max_age`, or at `shutdown`: the request in flight
/// has `limits.grace` to finish). `slot` is its place in the listener's
/// caps, marked busy while a request is answered (and from the accept
/// while the first request, `arrived` then, waits for hyper) and given
/// back on return.
pub(super) async fn serve(
    stream: TcpStream,
    router: Router,
    limits: Limits,
    shutdown: CancellationToken,
    slot: Arc<Admitted<Source>>,
    arrived: Option<Busy>,
) {
    let evicted = slot.evicted().clone();
    let _ = stream.set_nodelay(true);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_BUF);
    let service = Marked {
        inner: TowerToHyperService::new(router),
        slot,
        arrived: std::sync::Mutex::new(arrived),
    };
    let conn = builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let aged = Instant::now() + limits.max_age;
    // Once asked to end: when it is closed whatever it is doing.
    let mut closing: Option<Instant> = None;
    loop {
        let idle_until = activity.last() + limits.idle_timeout;
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "metrics listener: connection ended");
                }
                return;
            }
            () = tokio::time::sleep_until(idle_until) => {
                if activity.last() + limits.idle_timeout <= Instant::now() {
                    tracing::debug!(idle = ?limits.idle_timeout,
                        "metrics listener: idle connection closed");
                    return;
                }
            }
            () = tokio::time::sleep_until(aged), if closing.is_none() => {
                closing = Some(Instant::now() + limits.grace);
                conn.as_mut().graceful_shutdown();
            }
            () = shutdown.cancelled(), if closing.is_none() => {
                closing = Some(Instant::now() + limits.grace);
                conn.as_mut().graceful_shutdown();
            }
            () = evicted.cancelled() => {
                tracing::debug!("metrics listener: connection reset to make room for another");
                reset(fd);
                return;
            }
            () = tokio::time::sleep_until(closing.unwrap_or(aged)), if closing.is_some() => {
                tracing::debug!(grace = ?limits.grace,
                    "metrics listener: connection reset with its answer unfinished");
                reset(fd);
                return;
            }
        }
    }
}

/// Makes the close of `fd` a reset, not a FIN: a close would leave the
/// kernel sending the rest of an answer to a client that reads as slowly
/// as it likes. `fd` must be the connection's, still open.
fn reset(fd: std::os::fd::RawFd) {
    // SAFETY: the caller's connection owns the stream and is alive until
    // it returns, so `fd` is open.
    let open = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let _ = socket2::SockRef::from(&open).set_linger(Some(Duration::ZERO));
}

/// The router as hyper's service, marking the connection busy from a
/// request's head to its answer's last byte.
struct Marked {
    inner: TowerToHyperService<Router>,
    slot: Arc<Admitted<Source>>,
    /// The first request's mark from the accept ([`arrived`]), handed
    /// over to that request's own.
    arrived: std::sync::Mutex<Option<Busy>>,
}

/// The connection's busy mark, taken off when dropped: with the answer's
/// body once hyper has written it, or with the request if it is dropped
/// unanswered.
pub(super) struct Busy(Arc<Admitted<Source>>);

impl Busy {
    fn new(slot: &Arc<Admitted<Source>>) -> Self {
        slot.busy();
        Self(slot.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.idle();
    }
}

type Answer = hyper::Response<Guarded>;

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Marked {
    type Response = Answer;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Self::Error>> + Send>>;

    fn call(&self, req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let busy = Busy::new(&self.slot);
        drop(
            self.arrived
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        let answer = self.inner.call(req);
        Box::pin(async move {
            let answer = answer.await?;
            Ok(answer.map(|body| Guarded { body, _busy: busy }))
        })
    }
}

/// An answer's body, holding the connection's busy mark until dropped.
struct Guarded {
    body: axum::body::Body,
    _busy: Busy,
}

impl hyper::body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
