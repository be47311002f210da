//! Node discovery through etcd's v3 JSON gateway (HTTP/1.1): each agent
//! registers `<prefix><name>` under a lease it keeps alive, lists the prefix
//! and watches it. When etcd is unreachable the last known set stays in use
//! (probing goes on) and the agent reconnects, re-registers and re-syncs.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::{Engine as _, engine::general_purpose::STANDARD as B64};
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, body::Bytes};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tracing::{info, warn};

use super::{Node, NodeSet, discovery::Nodes};

#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// `host:port` of an etcd client URL (plain HTTP).
    pub endpoint: String,
    pub prefix: String,
    pub lease_ttl: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("connecting to etcd at {endpoint}")]
    Connect {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("talking to etcd at {endpoint}")]
    Http {
        endpoint: String,
        source: hyper::Error,
    },
    #[error("etcd at {endpoint} answered {path} with {status}: {body}")]
    Status {
        endpoint: String,
        path: String,
        status: hyper::StatusCode,
        body: String,
    },
    #[error("etcd's answer to {path} is not what this client expects: {detail}")]
    Decode { path: String, detail: String },
    #[error("etcd at {endpoint} did not answer {path} in time")]
    Timeout { endpoint: String, path: String },
    #[error("the lease expired")]
    LeaseExpired,
    #[error("the watch stream ended")]
    WatchEnded,
}

const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// An etcd lease ID (the JSON gateway writes the int64 as a string).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseId(i64);

impl LeaseId {
    fn parse(path: &str, text: &str) -> Result<Self, EtcdError> {
        text.parse().map(Self).map_err(|_| EtcdError::Decode {
            path: path.into(),
            detail: format!("lease ID {text:?} is not an integer"),
        })
    }
}

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The lease this agent is registered under, for revocation at shutdown.
#[derive(Debug, Clone, Default)]
pub struct Registration(Arc<Mutex<Option<LeaseId>>>);

impl Registration {
    fn set(&self, lease: LeaseId) {
        if let Ok(mut r) = self.0.lock() {
            *r = Some(lease);
        }
    }

    fn take(&self) -> Option<LeaseId> {
        self.0.lock().ok().and_then(|mut r| r.take())
    }

    /// The lease registered now, if any.
    #[must_use]
    pub fn current(&self) -> Option<LeaseId> {
        self.0.lock().ok().and_then(|r| *r)
    }
}

struct Client {
    endpoint: String,
}

impl Client {
    async fn send(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<hyper::Response<hyper::body::Incoming>, EtcdError> {
        let stream =
            TcpStream::connect(&self.endpoint)
                .await
                .map_err(|source| EtcdError::Connect {
                    endpoint: self.endpoint.clone(),
                    source,
                })?;
        let http = |source| EtcdError::Http {
            endpoint: self.endpoint.clone(),
            source,
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        tokio::spawn(conn);
        let req = Request::post(path)
            .header("host", &self.endpoint)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| EtcdError::Decode {
                path: path.into(),
                detail: e.to_string(),
            })?;
        let resp = sender.send_request(req).await.map_err(http)?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map(http_body_util::Collected::to_bytes)
                .unwrap_or_default();
            return Err(EtcdError::Status {
                endpoint: self.endpoint.clone(),
                path: path.into(),
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        Ok(resp)
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, EtcdError> {
        let call = async {
            let resp = self.send(path, &body).await?;
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|source| EtcdError::Http {
                    endpoint: self.endpoint.clone(),
                    source,
                })?;
            serde_json::from_slice(&bytes.to_bytes()).map_err(|e| EtcdError::Decode {
                path: path.into(),
                detail: e.to_string(),
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, call)
            .await
            .map_err(|_| EtcdError::Timeout {
                endpoint: self.endpoint.clone(),
                path: path.into(),
            })?
    }
}

/// The end of the key range that has `prefix` as its prefix.
fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last = last.saturating_add(1);
    }
    end
}

fn str_field<'a>(v: &'a Value, path: &str, field: &str) -> Result<&'a str, EtcdError> {
    v[field].as_str().ok_or_else(|| EtcdError::Decode {
        path: path.into(),
        detail: format!("no {field:?} in {v}"),
    })
}

/// Decodes a range response into nodes; entries that do not parse are
/// skipped with a warning naming their key.
fn nodes_from_range(v: &Value) -> NodeSet {
    let mut nodes: Vec<Node> = v["kvs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|kv| {
            let key = kv["key"].as_str().and_then(|k| B64.decode(k).ok()).unwrap_or_default();
            let value = kv["value"].as_str().and_then(|x| B64.decode(x).ok()).unwrap_or_default();
            serde_json::from_slice::<Node>(&value)
                .map_err(|e| warn!(key = %String::from_utf8_lossy(&key), "ignoring a bad node entry in etcd: {e}"))
                .ok()
        })
        .collect();
    nodes.sort();
    nodes.dedup_by(|a, b| a.name == b.name);
    NodeSet::new(nodes).unwrap_or_default()
}

/// Keeps this agent registered and the node set in sync, forever.
pub async fn run(cfg: EtcdConfig, me: Node, nodes: Nodes, registration: Registration) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let err = session(&cfg, &me, &nodes, &registration).await;
        nodes.reject(format!(
            "etcd at {}: {}; probing the last known set",
            cfg.endpoint,
            crate::util::errors::chain(&err)
        ));
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(3));
    }
}

async fn session(
    cfg: &EtcdConfig,
    me: &Node,
    nodes: &Nodes,
    registration: &Registration,
) -> EtcdError {
    match session_inner(cfg, me, nodes, registration).await {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

async fn session_inner(
    cfg: &EtcdConfig,
    me: &Node,
    nodes: &Nodes,
    registration: &Registration,
) -> Result<std::convert::Infallible, EtcdError> {
    let client = Client {
        endpoint: cfg.endpoint.clone(),
    };
    let ttl = cfg.lease_ttl.as_secs().max(2);
    let grant = client
        .post("/v3/lease/grant", json!({ "TTL": ttl }))
        .await?;
    let lease = LeaseId::parse(
        "/v3/lease/grant",
        str_field(&grant, "/v3/lease/grant", "ID")?,
    )?;
    let key = format!("{}{}", cfg.prefix, me.name);
    let value = serde_json::to_vec(me).unwrap_or_default();
    client
        .post(
            "/v3/kv/put",
            json!({ "key": B64.encode(&key), "value": B64.encode(value), "lease": lease.to_string() }),
        )
        .await?;
    registration.set(lease);
    info!(key, %lease, "registered in etcd");
    let range_req =
        json!({ "key": B64.encode(&cfg.prefix), "range_end": B64.encode(range_end(&cfg.prefix)) });
    let list = client.post("/v3/kv/range", range_req.clone()).await?;
    let revision: u64 = str_field(&list["header"], "/v3/kv/range", "revision")?
        .parse()
        .unwrap_or(0);
    nodes.accept(nodes_from_range(&list));

    let watch_req = json!({ "create_request": {
        "key": B64.encode(&cfg.prefix),
        "range_end": B64.encode(range_end(&cfg.prefix)),
        "start_revision": (revision + 1).to_string(),
    }});
    let mut events = client.send("/v3/watch", &watch_req).await?.into_body();
    let mut keepalive = tokio::time::interval(Duration::from_secs(ttl) / 3);
    keepalive.tick().await;
    loop {
        tokio::select! {
            _ = keepalive.tick() => {
                let ka = client.post("/v3/lease/keepalive", json!({ "ID": lease.to_string() })).await?;
                if ka["result"]["TTL"].as_str().is_none_or(|t| t == "0") {
                    return Err(EtcdError::LeaseExpired);
                }
            }
            frame = events.frame() => {
                match frame {
                    Some(Ok(f)) if f.is_data() => {
                        // Any change under the prefix: re-list (simple and
                        // immune to partial event decoding).
                        let list = client.post("/v3/kv/range", range_req.clone()).await?;
                        nodes.accept(nodes_from_range(&list));
                    }
                    Some(Ok(_)) => {}
                    Some(Err(source)) => return Err(EtcdError::Http { endpoint: cfg.endpoint.clone(), source }),
                    None => return Err(EtcdError::WatchEnded),
                }
            }
        }
    }
}

/// Revokes this agent's lease (its key goes with it): a graceful leave.
pub async fn deregister(endpoint: &str, registration: &Registration) {
    let Some(lease) = registration.take() else {
        return;
    };
    let client = Client {
        endpoint: endpoint.to_owned(),
    };
    match client
        .post("/v3/lease/revoke", json!({ "ID": lease.to_string() }))
        .await
    {
        Ok(_) => info!(%lease, "left etcd (lease revoked)"),
        Err(e) => warn!(
            "revoking the etcd lease: {}",
            crate::util::errors::chain(&e)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_range_end() {
        assert_eq!(range_end("/health/nodes/"), b"/health/nodes0".to_vec());
    }

    #[test]
    fn range_responses_decode_and_skip_garbage() {
        let node = json!({"name": "n1", "node_ip": "198.18.0.11", "health_ip": "198.18.64.2"});
        let v = json!({"header": {"revision": "5"}, "kvs": [
            {"key": B64.encode("/h/n1"), "value": B64.encode(node.to_string())},
            {"key": B64.encode("/h/bad"), "value": B64.encode("not json")},
        ]});
        let nodes = nodes_from_range(&v);
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].name, "n1");
        assert_eq!(nodes_from_range(&json!({})), NodeSet::default());
    }
}
