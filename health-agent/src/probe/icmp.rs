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
    pub fn new(netns: Option<&crate::netns::Netns>) -> io::Result<Self> {
        let sock = crate::netns::run_in(netns, || {
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

    /// One echo exchange with `dst`; `Err` carries the reason as text.
    pub async fn echo(&self, dst: Ipv4Addr, timeout: Duration) -> Result<Duration, String> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .map_err(|_| "ICMP state poisoned")?
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
            Err(e) => Err(format!("sending echo request: {e}")),
            Ok(_) => match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(at)) => Ok(at.saturating_duration_since(start)),
                Ok(Err(_)) => Err("ICMP receiver stopped".into()),
                Err(_) => Err(format!("no echo reply within {} ms", timeout.as_millis())),
            },
        };
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&(dst, seq));
        }
        result
    }
}

fn echo_request(identifier: u16, seq: u16) -> [u8; 16] {
    let mut req = [
        8u8, 0, 0, 0, 0, 0, 0, 0, b'h', b'e', b'a', b'l', b't', b'h', b'!', b'!',
    ];
    req[4..6].copy_from_slice(&identifier.to_be_bytes());
    req[6..8].copy_from_slice(&seq.to_be_bytes());
    let mut sum: u32 = req
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    req[2..4].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    req
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

/// `(source, sequence)` of an echo reply carrying our identifier.
fn parse_reply(pkt: &[u8], identifier: u16) -> Option<(Ipv4Addr, u16)> {
    let ihl = usize::from(*pkt.first()? & 0x0f) * 4;
    let icmp = pkt.get(ihl..ihl + 8)?;
    if ihl < 20 || icmp[0] != 0 || icmp[4..6] != identifier.to_be_bytes() {
        return None;
    }
    let src = Ipv4Addr::new(pkt[12], pkt[13], pkt[14], pkt[15]);
    Some((src, u16::from_be_bytes([icmp[6], icmp[7]])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_checksum_and_replies_parse() {
        let req = echo_request(0x1234, 7);
        let mut sum: u32 = req
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff, "a valid checksum sums to all ones");
        let mut reply = vec![
            0x45, 0, 0, 36, 0, 0, 0, 0, 64, 1, 0, 0, 198, 18, 0, 9, 198, 18, 0, 1,
        ];
        reply.extend_from_slice(&req);
        reply[20] = 0;
        assert_eq!(
            parse_reply(&reply, 0x1234),
            Some((Ipv4Addr::new(198, 18, 0, 9), 7))
        );
        assert_eq!(parse_reply(&reply, 0x1235), None, "another prober's reply");
        reply[20] = 8;
        assert_eq!(parse_reply(&reply, 0x1234), None, "a request");
        assert_eq!(parse_reply(&reply[..24], 0x1234), None, "truncated");
    }
}
