//! Sockets made in another network namespace without a thread per socket:
//! one long-lived thread enters the namespace once and makes sockets on
//! request (a socket keeps the namespace it was made in for life).

use std::{
    io,
    sync::{Mutex, mpsc},
    thread,
};

use nix::sched::{CloneFlags, setns};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::oneshot;

use super::netns::{Netns, NetnsError};

/// `count` sockets of one kind, made in one go.
type Request = (
    Domain,
    Type,
    Option<Protocol>,
    usize,
    oneshot::Sender<io::Result<Vec<Socket>>>,
);

/// Makes sockets inside one namespace, from a thread that lives there.
#[derive(Debug)]
pub struct SocketFactory {
    requests: Mutex<mpsc::Sender<Request>>,
}

impl SocketFactory {
    /// Starts the factory's thread in `netns`. The thread ends when the
    /// factory is dropped.
    pub fn new(netns: &Netns) -> Result<Self, NetnsError> {
        let file = netns.open()?;
        let (tx, rx) = mpsc::channel::<Request>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let path = netns.path().to_owned();
        thread::Builder::new()
            .name("netns-sockets".into())
            .spawn(move || {
                let entered = setns(&file, CloneFlags::CLONE_NEWNET);
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if !ok {
                    return;
                }
                drop(file);
                while let Ok((domain, ty, proto, count, reply)) = rx.recv() {
                    let made = (0..count)
                        // Non-blocking from the start (SOCK_NONBLOCK):
                        // no fcntl round trips.
                        .map(|_| Socket::new(domain, ty.nonblocking(), proto))
                        .collect();
                    let _ = reply.send(made);
                }
            })
            .map_err(|source| NetnsError::Io {
                op: "starting a thread for",
                path: path.clone(),
                source,
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                requests: Mutex::new(tx),
            }),
            Ok(Err(source)) => Err(NetnsError::Syscall {
                call: "setns",
                path,
                source,
            }),
            Err(_) => Err(NetnsError::ThreadPanicked { path }),
        }
    }

    /// `count` non-blocking sockets made in the factory's namespace, in one
    /// request (one wake-up of its thread).
    pub async fn sockets(
        &self,
        domain: Domain,
        ty: Type,
        proto: Option<Protocol>,
        count: usize,
    ) -> io::Result<Vec<Socket>> {
        let (reply, made) = oneshot::channel();
        self.requests
            .lock()
            .map_err(|_| io::Error::other("socket factory poisoned"))?
            .send((domain, ty, proto, count, reply))
            .map_err(|_| io::Error::other("the namespace's socket thread is gone"))?;
        made.await
            .map_err(|_| io::Error::other("the namespace's socket thread is gone"))?
    }
}
