//! The HTTP hello server on port 4240: `GET /hello` answers 200, anything else
//! a 4xx. Small and bounded: at most `MAX_CONNECTIONS` at once (more are
//! closed at once), 4 KiB of request head, 2 s to send it.

use std::{sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

pub const MAX_CONNECTIONS: usize = 256;
const MAX_HEAD: usize = 4096;
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Serves until `shutdown` (connections being answered finish on their own,
/// bounded by the head timeout).
pub async fn serve(listener: TcpListener, shutdown: tokio_util::sync::CancellationToken) {
    shutdown.run_until_cancelled(accept_loop(listener)).await;
}

async fn accept_loop(listener: TcpListener) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        tokio::spawn(async move {
            let _ = tokio::time::timeout(HEAD_TIMEOUT * 2, handle(stream)).await;
            drop(permit);
        });
    }
}

async fn handle(mut stream: TcpStream) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    let complete = tokio::time::timeout(HEAD_TIMEOUT, async {
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buf[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(true);
            }
            if head.len() > MAX_HEAD {
                return Ok(false);
            }
        }
    })
    .await;
    let response = match complete {
        Ok(Ok(true)) => respond(&head),
        Ok(Ok(false)) => reply(400, "bad request\n"),
        Ok(Err(e)) => return Err(e),
        Err(_) => reply(408, "request timeout\n"),
    };
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The response to a complete request head.
fn respond(head: &[u8]) -> String {
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(b"GET"), Some(b"/hello"), Some(v)) if v.starts_with(b"HTTP/1.") => reply(200, "ok\n"),
        (Some(b"GET"), Some(_), Some(v)) if v.starts_with(b"HTTP/1.") => {
            reply(404, "only /hello is served\n")
        }
        (Some(_), Some(_), Some(v)) if v.starts_with(b"HTTP/1.") => {
            reply(405, "only GET is served\n")
        }
        _ => reply(400, "bad request\n"),
    }
}

fn reply(code: u16, body: &str) -> String {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        _ => "Bad Request",
    };
    let allow = if code == 405 { "Allow: GET\r\n" } else { "" };
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_hello_is_served() {
        assert!(respond(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 200 OK"));
        assert!(respond(b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(respond(b"POST /hello HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(respond(b"\x16\x03\x01 garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(respond(b"GET /hello\r\n\r\n").starts_with("HTTP/1.1 400"));
    }

    #[tokio::test]
    async fn serves_over_tcp_and_rejects_oversized_heads() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(serve(listener, tokio_util::sync::CancellationToken::new()));
        let exchange = |req: Vec<u8>| async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(&req).await.expect("send");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        };
        let ok = exchange(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n".to_vec()).await;
        assert!(
            ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("ok\n"),
            "{ok}"
        );
        let mut huge = b"GET /hello HTTP/1.1\r\n".to_vec();
        huge.extend(std::iter::repeat_n(b'a', 8000));
        let big = exchange(huge).await;
        assert!(big.starts_with("HTTP/1.1 400"), "{big}");
        server.abort();
    }
}
