//! A small client for the API socket.

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt as _, Empty};
use hyper::{Request, StatusCode, body::Bytes};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::net::UnixStream;

use super::types::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot reach the health agent at {path} (is `health-agent daemon` running? the socket is set by --socket or HEALTH_AGENT_SOCK)"
    )]
    Unreachable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("talking to the health agent at {path}")]
    Http { path: PathBuf, source: hyper::Error },
    #[error("the health agent answered {status}: {message}")]
    Api { status: StatusCode, message: String },
    #[error("the health agent's answer to {what} is not what this client expects")]
    Decode {
        what: String,
        source: serde_json::Error,
    },
}

/// `GET path` on the socket, decoded from JSON.
pub async fn get<T: DeserializeOwned>(socket: &Path, path: &str) -> Result<T, ClientError> {
    call(socket, "GET", path).await
}

/// `PUT path` (no body) on the socket, decoded from JSON.
pub async fn put<T: DeserializeOwned>(socket: &Path, path: &str) -> Result<T, ClientError> {
    call(socket, "PUT", path).await
}

async fn call<T: DeserializeOwned>(
    socket: &Path,
    method: &str,
    path: &str,
) -> Result<T, ClientError> {
    let (status, body) = request(socket, method, path).await?;
    if !status.is_success() {
        let message = serde_json::from_slice::<ApiError>(&body).map_or_else(
            |_| String::from_utf8_lossy(&body).into_owned(),
            |e| e.message,
        );
        return Err(ClientError::Api { status, message });
    }
    serde_json::from_slice(&body).map_err(|source| ClientError::Decode {
        what: path.to_owned(),
        source,
    })
}

async fn request(
    socket: &Path,
    method: &str,
    path: &str,
) -> Result<(StatusCode, Bytes), ClientError> {
    let http = |source| ClientError::Http {
        path: socket.to_owned(),
        source,
    };
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| ClientError::Unreachable {
            path: socket.to_owned(),
            source,
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    let conn = tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "health-agent")
        .body(Empty::<Bytes>::new())
        .expect("a static request is valid");
    let resp = sender.send_request(req).await.map_err(http)?;
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(http)?.to_bytes();
    conn.abort();
    Ok((status, body))
}
