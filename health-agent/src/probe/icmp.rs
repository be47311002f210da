//! ICMP echo for many probes at once: one raw socket, requests told apart by
//! sequence number, replies handed to the waiting probe by a receive task.

use std::{
    collections::HashMap,
    io,
    mem::MaybeUninit,
    net::{Ipv4Addr, SocketAddrV4},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU16, Ordering},
    },
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::error::{ProbeError, Proto};
use crate::sys::icmp::{echo_request, parse_reply};
use tokio::{io::unix::AsyncFd, sync::oneshot};

type Pending = Arc<Mutex<HashMap<(Ipv4Addr, u16), oneshot::Sender<Instant>>>>;

pub struct IcmpProber {
    sock: Arc<AsyncFd<Socket>>,
    identifier: u16,
    next_seq: AtomicU16,
    pending: Pending,
    receiver: tokio::task::JoinHandle<()>,
}

impl Drop for IcmpProber {
    fn drop(&mut self) {
        self.receiver.abort();
    }
}

impl IcmpProber {
    /// Opens the socket in `netns` (the caller's when `None`); needs a
    /// tokio runtime.
    pub fn new(netns: Option<&crate::sys::netns::Netns>) -> io::Result<Self> {
        let sock = crate::sys::netns::run_in(netns, || {
            Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))
        })
        .map_err(io::Error::other)??;
        sock.set_nonblocking(true)?;
        let _ = sock.set_recv_buffer_size(4 << 20);
        // SAFETY: the AsyncFd owns the socket and keeps its fd open.
        let sock = Arc::new(unsafe { AsyncFd::register(sock)? });
        #[allow(
            clippy::cast_possible_truncation,
            reason = "any 16 bits of the pid will do"
        )]
        let identifier = (std::process::id() as u16) ^ 0x4e00;
        let pending: Pending = Arc::default();
        let receiver = tokio::spawn(receive(sock.clone(), identifier, pending.clone()));
        Ok(Self {
            sock,
            identifier,
            next_seq: AtomicU16::new(1),
            pending,
            receiver,
        })
    }

    /// One echo exchange with `dst`.
    pub async fn echo(&self, dst: Ipv4Addr, timeout: Duration) -> Result<Duration, ProbeError> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .map_err(|_| ProbeError::ReceiverStopped)?
            .insert((dst, seq), tx);
        let request = echo_request(self.identifier, seq);
        let start = Instant::now();
        let sent = loop {
            let mut guard = match self.sock.writable().await {
                Ok(g) => g,
                Err(e) => break Err(e),
            };
            match guard.try_io(|s| {
                s.get_ref()
                    .send_to(&request, &SockAddr::from(SocketAddrV4::new(dst, 0)))
            }) {
                Ok(r) => break r,
                Err(_would_block) => {}
            }
        };
        let result = match sent {
            Err(e) => Err(ProbeError::io("sending echo request", &e)),
            Ok(_) => match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(at)) => Ok(at.saturating_duration_since(start)),
                Ok(Err(_)) => Err(ProbeError::ReceiverStopped),
                Err(_) => Err(ProbeError::Timeout {
                    proto: Proto::Icmp,
                    after: timeout,
                }),
            },
        };
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&(dst, seq));
        }
        result
    }
}

async fn receive(sock: Arc<AsyncFd<Socket>>, identifier: u16, pending: Pending) {
    let mut buf = [MaybeUninit::<u8>::uninit(); 1500];
    loop {
        let Ok(mut guard) = sock.readable().await else {
            return;
        };
        loop {
            match guard.try_io(|s| s.get_ref().recv(&mut buf)) {
                Ok(Ok(n)) => {
                    let at = Instant::now();
                    // SAFETY: recv initialised the first n bytes.
                    let pkt: Vec<u8> = buf[..n]
                        .iter()
                        .map(|b| unsafe { b.assume_init() })
                        .collect();
                    if let Some(key) = parse_reply(&pkt, identifier)
                        && let Some(tx) = pending.lock().ok().and_then(|mut p| p.remove(&key))
                    {
                        let _ = tx.send(at);
                    }
                }
                Ok(Err(_)) => break,
                Err(_would_block) => break,
            }
        }
    }
}
