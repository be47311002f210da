//! A TCP forwarder from the host's loopback into a namespace: how `cargo
//! xtask run` makes node 1's connectivity page and metrics reachable from
//! the host's browser. Each accepted connection gets a socket made inside
//! the namespace (a socket keeps the namespace it was made in) and two
//! copying threads; the forwarder lives as long as the process.

use std::{
    io,
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    thread,
};

use health_agent::sys::netns::Netns;

/// Listens on `local`, or on any free port of its address when that one
/// is taken.
pub(crate) fn bind(local: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(local).or_else(|_| TcpListener::bind(SocketAddr::new(local.ip(), 0)))
}

/// Forwards every connection `listener` accepts to `target` inside `ns`;
/// returns the address listened on.
pub(crate) fn start(
    listener: TcpListener,
    ns: &Netns,
    target: SocketAddr,
) -> io::Result<SocketAddr> {
    let bound = listener.local_addr()?;
    let ns = Netns::at(ns.path());
    thread::Builder::new()
        .name("forward".into())
        .spawn(move || {
            for client in listener.incoming().flatten() {
                let upstream = ns
                    .run(move || TcpStream::connect(target))
                    .map_err(io::Error::other)
                    .and_then(|r| r);
                match upstream {
                    Ok(upstream) => splice(client, upstream),
                    Err(e) => eprintln!("forwarding to {target}: {e}"),
                }
            }
        })?;
    Ok(bound)
}

/// Copies both ways until either side closes.
fn splice(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let pump = |mut from: TcpStream, mut to: TcpStream| {
        move || {
            let _ = io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        }
    };
    let _ = thread::Builder::new().spawn(pump(a, b2));
    let _ = thread::Builder::new().spawn(pump(b, a2));
}
