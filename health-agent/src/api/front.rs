//! The API's accept loop, in two lanes. The small answers (the health
//! check, the status summary, one node's status, the endpoints) cost tens
//! of microseconds and are served where connections are accepted. Every
//! other request goes to the bulk lane: the whole status at 10,000 peers
//! is 0.6 MB a request, and a probe round asked for through the API runs
//! there. With clients pulling the whole status as fast as they can, a
//! small question then no longer waits in line behind their answers, on
//! threads the kernel gives the CPU to last (the bulk lane runs at a lower
//! priority, so that probing comes first).
//!
//! The lane is chosen by the request line, peeked at without reading it:
//! hyper reads the request as usual in whichever lane serves it. A
//! connection answered in front is closed after its answer, so that a
//! heavy request cannot follow a small one there on the same connection
//! (the agent's clients make a connection a request); the bulk lane keeps
//! connections alive. A client that sends nothing within [`FIRST_BYTES`],
//! or before the agent stops, is closed unanswered; one that takes longer
//! than [`HEADER_TIMEOUT`] over a request's head, or to send its next
//! request, is closed too, as is one that stops reading its answer for
//! [`WRITE_STALL`](super::splice::WRITE_STALL). At most [`MAX_CONNECTIONS`] are served at
//! once, at most [`PER_USER`](super::users::PER_USER) of one user other
//! than root (the client's `SO_PEERCRED`), with
//! [`ROOT_RESERVED`](super::users::ROOT_RESERVED) of them kept for root: a
//! connection past them is answered 503, saying which cap it met, and
//! closed.

use std::{io, mem::MaybeUninit, sync::Arc, time::Duration};

use axum::Router;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    io::Interest,
    net::{UnixListener, UnixStream},
    runtime::Handle,
    sync::Semaphore,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::users::{UserSlot, Users};
use crate::sys::sockopt;

/// The requests the front lane answers itself: GETs of these targets
/// (paths, or paths with the start of their query). Everything else, the
/// whole status included, goes to the bulk lane.
const SMALL: [&[u8]; 4] = [
    b"/v1/healthz",
    b"/v1/status?summary=true",
    b"/v1/status?node=",
    b"/v1/endpoints",
];
/// The start of a request read to choose its lane: the method, the
/// longest target of [`SMALL`] and more.
const HEAD: usize = 64;
/// How long the rest of a request line that came in parts is waited for
/// before its lane is chosen by what came, looked at every
/// [`LINE_PART_WAIT`].
const LINE_IN_PARTS: Duration = Duration::from_millis(50);
const LINE_PART_WAIT: Duration = Duration::from_millis(2);
/// A client that sends nothing for this long after connecting is closed.
const FIRST_BYTES: Duration = Duration::from_secs(30);
/// How long a client may take over a request's head once it began, and
/// to begin its next request on a kept-alive connection.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once. The agent's own clients hold one each, a
/// `status --watch` one for as long as it runs; each bulk connection may
/// hold [`BULK_SEND_BUFFER`] of kernel memory.
pub(crate) const MAX_CONNECTIONS: usize = 256;
/// After a failed accept (out of descriptors), the loop waits this long.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// The send buffer of a bulk connection, 1 MiB asked, which the kernel
/// doubles for its own accounting: the whole status, gzipped (0.6 MB at
/// 10,000 peers, about 1.2 MB at 20,000), is written in one call and the
/// lane's thread is done with it, instead of waking for each 200 KiB the
/// client reads (the system's default size). The cost: a member of the
/// socket's group that asks and never reads holds up to 2 MiB of kernel
/// memory a connection (about 200 KiB before), until the connection
/// fails at [`WRITE_STALL`](super::splice::WRITE_STALL).
const BULK_SEND_BUFFER: libc::c_int = 1 << 20;

/// Serves `app` on `listener` until `shutdown`, then lets the requests in
/// flight finish. Small requests are served on the calling task's runtime,
/// the others on `bulk`'s (on the same runtime without one).
pub(super) async fn serve(
    listener: UnixListener,
    app: Router,
    shutdown: CancellationToken,
    bulk: Option<Handle>,
) {
    let tracker = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let users = Users::new(MAX_CONNECTIONS);
    let refusing = Arc::new(Semaphore::new(REFUSALS));
    let mut refused: u64 = 0;
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "API: accept failed");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let uid = stream.peer_cred().ok().map(|c| c.uid());
        let admitted = users
            .take(uid)
            .map_err(|full| full.reason(MAX_CONNECTIONS))
            .and_then(|user| {
                let slot = Arc::clone(&slots).try_acquire_owned().map_err(|_| {
                    format!(
                        "the agent's API serves {MAX_CONNECTIONS} connections at once, all \
                         open: try again"
                    )
                })?;
                Ok((slot, user))
            });
        let slot = match admitted {
            Ok(slot) => slot,
            Err(reason) => {
                refused += 1;
                if refused.is_power_of_two() {
                    tracing::warn!(refused, uid, "API: a connection refused: {reason}");
                }
                refuse(stream, reason, &refusing, &tracker);
                continue;
            }
        };
        let (app, shutdown, bulk, lanes) =
            (app.clone(), shutdown.clone(), bulk.clone(), tracker.clone());
        tracker.spawn(async move {
            let lane = tokio::select! {
                () = shutdown.cancelled() => return,
                lane = lane(&stream) => lane,
            };
            match (lane, bulk) {
                (Lane::Silent, _) => {}
                (Lane::Bulk, Some(bulk)) => to_bulk(stream, &bulk, app, shutdown, &lanes, slot),
                // In front beside a bulk lane: one request.
                (_, Some(_)) => connection(stream, app, shutdown, false).await,
                (_, None) => connection(stream, app, shutdown, true).await,
            }
        });
    }
    // Connections made from now on are refused, not left in the backlog.
    drop(listener);
    tracker.close();
    tracker.wait().await;
}

/// Where a connection is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Front,
    Bulk,
    /// Nothing came within [`FIRST_BYTES`]: closed.
    Silent,
}

/// Moves `stream` to the bulk lane's runtime and serves it there.
fn to_bulk(
    stream: UnixStream,
    bulk: &Handle,
    app: Router,
    shutdown: CancellationToken,
    tracker: &TaskTracker,
    slot: Slot,
) {
    let std = match stream.into_std() {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "API: moving a connection to the bulk lane");
            return;
        }
    };
    widen_send_buffer(&std);
    tracker.spawn_on(
        async move {
            let _slot = slot;
            match UnixStream::from_std(std) {
                Ok(stream) => connection(stream, app, shutdown, true).await,
                Err(e) => tracing::debug!(error = %e, "API: a connection in the bulk lane"),
            }
        },
        bulk,
    );
}

/// A connection's places in the API's caps: one of [`MAX_CONNECTIONS`],
/// and its user's share (root's: none).
type Slot = (tokio::sync::OwnedSemaphorePermit, Option<UserSlot>);

/// Refusals answered at once; a connection refused past them is closed
/// unanswered.
const REFUSALS: usize = 16;
/// How long a refused client has to send its request before it is
/// answered, and to take the answer.
const REFUSAL_WAIT: Duration = Duration::from_millis(500);

/// Answers a connection the caps refuse `503`, with `reason` (what
/// [`Client`](super::client::Client) shows), once its request is read:
/// closed before the request is written, the client would see its write
/// fail, not the answer.
fn refuse(stream: UnixStream, reason: String, refusing: &Arc<Semaphore>, tracker: &TaskTracker) {
    let Ok(permit) = Arc::clone(refusing).try_acquire_owned() else {
        return;
    };
    tracker.spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let _permit = permit;
        let mut stream = stream;
        let mut head = [0u8; 4096];
        let mut len = 0;
        let _ = tokio::time::timeout(REFUSAL_WAIT, async {
            while len < head.len() && !head[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut head[len..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => len += n,
                }
            }
        })
        .await;
        let body = serde_json::to_string(&super::types::ApiError {
            code: 503,
            message: reason,
        })
        .unwrap_or_default();
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = tokio::time::timeout(REFUSAL_WAIT, stream.write_all(answer.as_bytes())).await;
    });
}

/// Gives a bulk connection [`BULK_SEND_BUFFER`]: past the system's cap
/// where the agent may (`CAP_NET_ADMIN`), up to it otherwise. A failure
/// only costs the answer more wake-ups, and is logged.
fn widen_send_buffer(stream: &std::os::unix::net::UnixStream) {
    if let Err(e) = sockopt::size_buffer(stream, sockopt::Buffer::Send, BULK_SEND_BUFFER) {
        tracing::debug!(error = %e, "API: sizing a bulk connection's send buffer");
    }
}

/// The most a request's head may take (hyper's default is about 400
/// KiB): the API's requests are a line and a few headers, and a client
/// sending more is answered 431 before it holds more of the agent's
/// memory.
const MAX_HEAD: usize = 64 << 10;

/// One connection, HTTP/1.1, until the client closes it (or, without
/// `keep_alive`, its first request is answered) or, at shutdown, once its
/// request in flight is answered.
async fn connection(
    stream: UnixStream,
    app: Router,
    shutdown: CancellationToken,
    keep_alive: bool,
) {
    // Kept past hyper's end, so that the connection's slot is held until
    // the client has taken what was queued for it.
    let kept = std::os::fd::AsFd::as_fd(&stream).try_clone_to_owned().ok();
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .keep_alive(keep_alive)
        .serve_connection(
            TokioIo::new(super::splice::Connection::new(stream)),
            TowerToHyperService::new(app),
        );
    let mut conn = std::pin::pin!(conn);
    let served = tokio::select! {
        served = conn.as_mut() => served,
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = served {
        tracing::debug!(error = %e, "API: connection ended");
    }
    if let Some(fd) = kept {
        taken(fd, &shutdown).await;
    }
}

/// How often a finished connection's queue is looked at: soon at first
/// (a client reads its answer within milliseconds), then less often, up to
/// once a second.
const TAKEN_FIRST: Duration = Duration::from_millis(5);
const TAKEN_EVERY: Duration = Duration::from_secs(1);

/// Waits until the client has read every byte queued on `fd` for it, or
/// closed its end, or the agent stops; the agent's end is shut for
/// writing first, so the client reads the end once it has read the
/// answer. What a client that asks and never reads makes the kernel hold
/// (its answers' bytes, queued to it) is so held within the caps on its
/// connections, not past them: a slot given back while its bytes were
/// still queued would let the client ask again, and again.
async fn taken(fd: std::os::fd::OwnedFd, shutdown: &CancellationToken) {
    let _ = socket2::SockRef::from(&fd).shutdown(std::net::Shutdown::Write);
    let mut wait = TAKEN_FIRST;
    while sockopt::queued(&fd).is_ok_and(|n| n > 0) {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(TAKEN_EVERY);
    }
}

/// The lane of the request waiting on `stream`: the bulk lane for any but
/// a GET of a [`SMALL`] target. A client that closed, or a socket that
/// fails, is served in front, where hyper finds out.
async fn lane(stream: &UnixStream) -> Lane {
    let mut head = [MaybeUninit::<u8>::uninit(); HEAD];
    let first = tokio::time::timeout(FIRST_BYTES, peek(stream, &mut head)).await;
    // A request line that came in parts (a client writing it in pieces):
    // its rest is waited for a moment, so that its lane is chosen by all
    // of it.
    let mut seen = first;
    let mut waited = Duration::ZERO;
    while let Ok(Ok(n)) = seen
        && n > 0
        && n < HEAD
        && waited < LINE_IN_PARTS
        // SAFETY: `peek` initialised the first `n` bytes.
        && !unsafe { std::slice::from_raw_parts(head.as_ptr().cast::<u8>(), n) }.contains(&b'\n')
    {
        tokio::time::sleep(LINE_PART_WAIT).await;
        waited += LINE_PART_WAIT;
        seen = Ok(peek(stream, &mut head).await);
    }
    match seen {
        Err(_elapsed) => Lane::Silent,
        Ok(Ok(n)) if n > 0 => {
            // SAFETY: `peek` initialised the first `n` bytes.
            let seen = unsafe { std::slice::from_raw_parts(head.as_ptr().cast::<u8>(), n) };
            if bulk_request(seen) {
                Lane::Bulk
            } else {
                Lane::Front
            }
        }
        Ok(_) => Lane::Front,
    }
}

/// The first bytes the client sent, left in the socket for hyper.
async fn peek(stream: &UnixStream, buf: &mut [MaybeUninit<u8>]) -> io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || {
            socket2::SockRef::from(stream).peek(buf)
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            done => return done,
        }
    }
}

/// Whether a request starting with `head` is not one of the small ones.
fn bulk_request(head: &[u8]) -> bool {
    let Some(target) = head.strip_prefix(b"GET ") else {
        return true;
    };
    // A small target ends there, or its query goes on.
    !SMALL.iter().any(|small| {
        target.strip_prefix(*small).is_some_and(|rest| {
            matches!(rest.first(), None | Some(b' ' | b'&' | b'/')) || small.ends_with(b"=")
        })
    })
}

#[cfg(test)]
mod tests {
    use axum::routing::{get, put};

    use super::*;
    use crate::api::client::Client;

    /// The name of the thread that answered.
    async fn thread_name() -> String {
        std::thread::current().name().unwrap_or("?").to_owned()
    }

    /// The two lanes' runtimes as the agent has them (the bulk lane's
    /// threads named `lane-bulk`), and a socket listening for them: its
    /// path, the guard that removes it, the listener.
    fn lanes() -> (
        tokio::runtime::Runtime,
        tokio::runtime::Runtime,
        std::path::PathBuf,
        crate::api::server::SocketGuard,
        UnixListener,
    ) {
        let bulk = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lane-bulk")
            .enable_all()
            .build()
            .expect("bulk runtime");
        let front = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("front runtime");
        let path = std::env::temp_dir().join(format!(
            "health-agent-lanes-{}-{}.sock",
            std::process::id(),
            fastrand::u64(..)
        ));
        let (guard, listener) = front
            .block_on(async { crate::api::server::bind(&path, None) })
            .expect("bind");
        (bulk, front, path, guard, listener)
    }

    #[test]
    fn small_questions_are_answered_in_front_and_the_rest_in_the_bulk_lane() {
        let (bulk, front, path, _guard, listener) = lanes();
        let app = Router::new()
            .route("/v1/status", get(thread_name))
            .route("/v1/status/probe", put(thread_name))
            .route("/v1/healthz", get(thread_name));
        let answered_by = std::thread::Builder::new()
            .name("lane-front".into())
            .spawn(move || {
                let lane = bulk.handle().clone();
                let names = front.block_on(async move {
                    let stop = CancellationToken::new();
                    let served = tokio::spawn(serve(listener, app, stop.clone(), Some(lane)));
                    let client = Client::new(&path);
                    let mut names = Vec::new();
                    for (method, target) in [
                        ("GET", "/v1/status?summary=true"),
                        ("GET", "/v1/status?node=peer-1"),
                        ("GET", "/v1/healthz"),
                        ("GET", "/v1/status"),
                        ("PUT", "/v1/status/probe"),
                    ] {
                        let (status, body, _) =
                            client.raw_as_sent(method, target).await.expect(target);
                        assert!(status.is_success(), "{target}: {status}");
                        names.push(String::from_utf8(body.to_vec()).expect("utf-8"));
                    }
                    // A request line written in two parts, 20 ms apart,
                    // is answered in its lane.
                    let mut parts = UnixStream::connect(&path).await.expect("connect");
                    let answer = {
                        use tokio::io::AsyncWriteExt as _;
                        parts.write_all(b"GET /v1/hea").await.expect("write");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        exchange(&mut parts, b"lthz HTTP/1.1\r\nhost: a\r\n\r\n").await
                    };
                    names.push(answer.rsplit("\r\n").next().unwrap_or_default().to_owned());
                    // A client that connects and says nothing holds up
                    // no stop.
                    let _silent = UnixStream::connect(&path).await.expect("connect");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    stop.cancel();
                    tokio::time::timeout(Duration::from_secs(2), served)
                        .await
                        .expect("stopped with a silent client connected")
                        .expect("served to the end");
                    names
                });
                drop(bulk);
                names
            })
            .expect("front thread")
            .join()
            .expect("the front thread");
        assert_eq!(
            answered_by,
            [
                "lane-front",
                "lane-front",
                "lane-front",
                "lane-bulk",
                "lane-bulk",
                "lane-front"
            ]
        );
    }

    /// Writes `request` on `stream` and reads until the agent closes it:
    /// what came back (nothing from a connection closed unanswered, whose
    /// write or read may also fail).
    async fn exchange(stream: &mut UnixStream, request: &[u8]) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        if stream.write_all(request).await.is_err() {
            return String::new();
        }
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
            .await
            .expect("closed by the agent within 5 s");
        if read.is_err() {
            assert!(answer.is_empty(), "a read failed part way");
        }
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// A connection answered in front carries one request: a second one on
    /// it (the whole status, say) is not served there. Past
    /// [`MAX_CONNECTIONS`], a connection is answered 503, saying why, and
    /// served again once one ends.
    #[test]
    fn front_connections_carry_one_request_and_past_the_cap_are_closed() {
        let (bulk, front, path, _guard, listener) = lanes();
        let app = Router::new()
            .route("/v1/status", get(thread_name))
            .route("/v1/healthz", get(thread_name));
        let lane = bulk.handle().clone();
        front.block_on(async move {
            let stop = CancellationToken::new();
            let served = tokio::spawn(serve(listener, app, stop.clone(), Some(lane)));
            let mut one = UnixStream::connect(&path).await.expect("connect");
            let answer = exchange(
                &mut one,
                b"GET /v1/healthz HTTP/1.1\r\nhost: a\r\n\r\nGET /v1/status HTTP/1.1\r\nhost: a\r\n\r\n",
            )
            .await;
            assert_eq!(answer.matches("HTTP/1.1 200").count(), 1, "{answer}");
            assert!(answer.contains("connection: close"), "{answer}");

            // Connections that say nothing hold every slot.
            let mut held = Vec::new();
            for _ in 0..MAX_CONNECTIONS {
                held.push(UnixStream::connect(&path).await.expect("connect"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut past = UnixStream::connect(&path).await.expect("connect");
            let answer = exchange(&mut past, b"GET /v1/healthz HTTP/1.1\r\nhost: a\r\n\r\n").await;
            assert!(answer.starts_with("HTTP/1.1 503"), "past the cap: {answer}");
            assert!(
                answer.contains(&format!("serves {MAX_CONNECTIONS} connections at once")),
                "{answer}"
            );
            // One ends: the next is served.
            drop(held.pop());
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut next = UnixStream::connect(&path).await.expect("connect");
            let answer = exchange(&mut next, b"GET /v1/healthz HTTP/1.1\r\nhost: a\r\n\r\n").await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            stop.cancel();
            drop(held);
            tokio::time::timeout(Duration::from_secs(2), served)
                .await
                .expect("stopped")
                .expect("served to the end");
        });
        drop(bulk);
    }

    /// A finished connection whose client has not read what was queued
    /// for it is held (its slot with it) until the client reads it all,
    /// then sees the end; or until the agent stops.
    #[tokio::test(start_paused = true)]
    async fn a_connection_is_held_until_its_client_took_what_was_queued() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (mut agent, mut client) = UnixStream::pair().expect("pair");
        agent.write_all(&vec![7; 64 << 10]).await.expect("queued");
        let fd = std::os::fd::AsFd::as_fd(&agent)
            .try_clone_to_owned()
            .expect("dup");
        drop(agent);
        let stop = CancellationToken::new();
        let held = tokio::spawn({
            let stop = stop.clone();
            async move { taken(fd, &stop).await }
        });
        tokio::time::sleep(super::super::splice::WRITE_STALL * 4).await;
        assert!(!held.is_finished(), "given back with its bytes queued");
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.expect("read");
        assert_eq!(got.len(), 64 << 10, "the answer, then its end");
        tokio::time::timeout(TAKEN_EVERY * 2, held)
            .await
            .expect("given back once taken")
            .expect("task");

        // The agent stopping ends the wait.
        let (agent, _client) = UnixStream::pair().expect("pair");
        let mut agent = agent;
        agent.write_all(b"never read").await.expect("queued");
        let fd = std::os::fd::AsFd::as_fd(&agent)
            .try_clone_to_owned()
            .expect("dup");
        let held = tokio::spawn({
            let stop = stop.clone();
            async move { taken(fd, &stop).await }
        });
        tokio::time::sleep(TAKEN_EVERY * 3).await;
        assert!(!held.is_finished());
        stop.cancel();
        tokio::time::timeout(TAKEN_EVERY, held)
            .await
            .expect("ended at the stop")
            .expect("task");
    }

    /// Bytes waiting in `stream`'s receive queue (`FIONREAD`).
    fn queued(stream: &UnixStream) -> usize {
        use std::os::fd::AsRawFd as _;
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int through the pointer given.
        let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::FIONREAD, &raw mut n) };
        assert_eq!(rc, 0, "FIONREAD: {}", io::Error::last_os_error());
        usize::try_from(n).unwrap_or(0)
    }

    /// The whole status at 10,000 peers, gzipped.
    const BODY: usize = 600 * 1024;

    /// A body of [`BODY`] bytes whose order shows.
    fn patterned() -> Vec<u8> {
        (0..BODY).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn a_bulk_answer_is_written_whole_before_the_client_reads() {
        bulk_answer_whole(bytes::Bytes::from(patterned()));
    }

    #[test]
    fn a_sealed_answer_goes_out_from_its_file_whole() {
        let body = crate::sys::sealed::bytes(patterned(), c"health-test");
        let (file, _) = crate::sys::sealed::find(&body).expect("sealed");
        bulk_answer_whole(body);
        assert_eq!(file.sent(), BODY as u64, "bytes sent from the file");
    }

    /// Serves `body` as the whole status in the bulk lane and reads it:
    /// in the client's queue whole before it reads (with
    /// `CAP_NET_ADMIN`), and as it was.
    fn bulk_answer_whole(body: bytes::Bytes) {
        let (bulk, front, path, _guard, listener) = lanes();
        let served_body = body.clone();
        let app = Router::new().route(
            "/v1/status",
            get(move || {
                let b = served_body.clone();
                async move { b }
            }),
        );
        // Whether this process may pass the system's cap (CAP_NET_ADMIN):
        // below it, the answer waits for the client as before.
        let privileged = {
            let (probe, _peer) = std::os::unix::net::UnixStream::pair().expect("socket pair");
            sockopt::force_buffer(&probe, libc::SO_SNDBUFFORCE, BULK_SEND_BUFFER).is_ok()
        };
        let lane = bulk.handle().clone();
        front.block_on(async move {
            let stop = CancellationToken::new();
            let served = tokio::spawn(serve(listener, app, stop.clone(), Some(lane)));
            let mut client = UnixStream::connect(&path).await.expect("connect");
            tokio::io::AsyncWriteExt::write_all(
                &mut client,
                b"GET /v1/status HTTP/1.1\r\nhost: agent\r\n\r\n",
            )
            .await
            .expect("request");
            // Nothing read yet: the answer is in the client's queue whole,
            // written in one go (with the system's default buffer, about
            // 200 KiB of it waits for the client to read).
            if privileged {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                while queued(&client) < BODY && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                assert!(queued(&client) > BODY, "{} bytes queued", queued(&client));
            }
            // Without CAP_NET_ADMIN, the answer is only checked whole.
            // Read whole either way.
            let body_at = |a: &[u8]| a.windows(4).position(|w| w == b"\r\n\r\n").map(|h| h + 4);
            let mut answer = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            while body_at(&answer).is_none_or(|h| answer.len() - h < BODY) {
                let n = tokio::io::AsyncReadExt::read(&mut client, &mut buf)
                    .await
                    .expect("read");
                assert_ne!(n, 0, "closed after {} bytes", answer.len());
                answer.extend_from_slice(&buf[..n]);
            }
            let head = body_at(&answer).expect("a head");
            assert!(answer.starts_with(b"HTTP/1.1 200"), "{:?}", &answer[..head]);
            assert_eq!(answer.len() - head, BODY);
            assert!(answer[head..] == body[..], "the body arrives as it was");
            drop(client);
            stop.cancel();
            tokio::time::timeout(Duration::from_secs(2), served)
                .await
                .expect("stopped")
                .expect("served to the end");
        });
        drop(bulk);
    }

    #[test]
    fn small_gets_stay_in_front_and_everything_else_goes_to_bulk() {
        for front in [
            &b"GET /v1/healthz HTTP/1.1\r\nhost: x\r\n"[..],
            b"GET /v1/status?summary=true HTTP/1.1\r\n",
            b"GET /v1/status?summary=true&x=1 HTTP/1.1\r\n",
            b"GET /v1/status?node=peer-00042 HTTP/1.1\r\n",
            b"GET /v1/endpoints/1 HTTP/1.1\r\n",
        ] {
            assert!(!bulk_request(front), "{}", String::from_utf8_lossy(front));
        }
        for bulk in [
            &b"GET /v1/status HTTP/1.1\r\n"[..],
            b"GET /v1/status?format=x HTTP/1.1\r\n",
            b"GET /v1/status?summary=false HTTP/1.1\r\n",
            b"GET /v1/status?summary=truex HTTP/1.1\r\n",
            b"GET /v1/healthzz HTTP/1.1\r\n",
            b"GET /v1/status/history HTTP/1.1\r\n",
            b"GET /v1/nodes HTTP/1.1\r\n",
            b"PUT /v1/status/probe HTTP/1.1\r\n",
            b"POST /v1/healthz HTTP/1.1\r\n",
            b"",
            b"GE",
        ] {
            assert!(bulk_request(bulk), "{}", String::from_utf8_lossy(bulk));
        }
    }

    /// A finished connection's slot is held while its client has answers'
    /// bytes left to read: `taken` returns only once they are read (or
    /// the client closed its end, or the agent stops), and shuts the
    /// agent's end for writing first, so the client reads the end.
    #[tokio::test]
    async fn a_finished_connection_is_held_until_its_client_read_its_answers() {
        use std::io::{Read as _, Write as _};
        let (agent, mut client) = std::os::unix::net::UnixStream::pair().expect("pair");
        (&agent).write_all(&[7; 4000]).expect("an answer queued");
        let shutdown = CancellationToken::new();
        let fd = std::os::fd::OwnedFd::from(agent);
        let held = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { taken(fd, &shutdown).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!held.is_finished(), "held while the answer is unread");
        let mut read = Vec::new();
        client
            .read_to_end(&mut read)
            .expect("the answer, then the end");
        assert_eq!(
            read.len(),
            4000,
            "shut for writing: the client reads the end"
        );
        tokio::time::timeout(Duration::from_secs(3), held)
            .await
            .expect("given back once read")
            .expect("task");
        // A client that never reads: held until the agent stops.
        let (agent, _client) = std::os::unix::net::UnixStream::pair().expect("pair");
        (&agent).write_all(&[7; 4000]).expect("queued");
        let fd = std::os::fd::OwnedFd::from(agent);
        let held = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { taken(fd, &shutdown).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!held.is_finished());
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(3), held)
            .await
            .expect("given back when the agent stops")
            .expect("task");
    }
}
