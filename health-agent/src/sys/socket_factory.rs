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

/// Up to `count` sockets from `new_socket`, until it first fails: those made,
/// or its error when it made none. A table of descriptors that fills part
/// way through a batch gives what it had room for, not nothing.
///
/// # Errors
/// `new_socket`'s first error, when no socket was made.
pub fn batch(
    count: usize,
    mut new_socket: impl FnMut() -> io::Result<Socket>,
) -> io::Result<Vec<Socket>> {
    let mut sockets = Vec::with_capacity(count);
    for _ in 0..count {
        match new_socket() {
            Ok(s) => sockets.push(s),
            Err(e) if sockets.is_empty() => return Err(e),
            Err(_) => break,
        }
    }
    Ok(sockets)
}

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
                    // Non-blocking from the start (SOCK_NONBLOCK): no
                    // fcntl round trips.
                    let made = batch(count, || Socket::new(domain, ty.nonblocking(), proto));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch that fails part way keeps the sockets made; one that makes
    /// none is its error.
    #[test]
    fn a_batch_keeps_what_it_made_before_a_failure() {
        let mut left = 3;
        let made = batch(5, || {
            if left == 0 {
                return Err(io::Error::from_raw_os_error(libc::EMFILE));
            }
            left -= 1;
            Socket::new(Domain::IPV4, Type::STREAM, None)
        })
        .expect("three made");
        assert_eq!(made.len(), 3);
        let none = batch(5, || Err(io::Error::from_raw_os_error(libc::EMFILE)));
        assert_eq!(
            none.expect_err("none made").raw_os_error(),
            Some(libc::EMFILE)
        );
        assert_eq!(
            batch(2, || Socket::new(Domain::IPV4, Type::STREAM, None))
                .map(|v| v.len())
                .ok(),
            Some(2)
        );
    }
}
