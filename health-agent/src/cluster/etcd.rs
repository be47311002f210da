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

use super::{
    Node,
    discovery::Nodes,
    validate::{self, Candidate, LocalNode, Origin, Record, Validated},
};

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

/// Decodes a range response into node records, in key order, and
/// validates them: a record that does not decode or breaks a rule is
/// rejected naming its key; the others make the set.
fn nodes_from_range(v: &Value, prefix: &str, local: &LocalNode) -> Validated {
    let mut candidates: Vec<Candidate> = v["kvs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|kv| {
            let key = kv["key"]
                .as_str()
                .and_then(|k| B64.decode(k).ok())
                .map_or_else(
                    || "<a key that is not base64>".to_owned(),
                    |k| String::from_utf8_lossy(&k).into_owned(),
                );
            let node = kv["value"]
                .as_str()
                .and_then(|x| B64.decode(x).ok())
                .ok_or_else(|| "the value is not base64".to_owned())
                .and_then(|value| {
                    serde_json::from_slice::<Node>(&value)
                        .map_err(|e| format!("the value is not a node record: {e}"))
                });
            Candidate {
                record: Record {
                    name: node.as_ref().ok().map(|n| n.name.clone()),
                    origin: Origin::Etcd {
                        prefix_len: if key.starts_with(prefix) {
                            prefix.len()
                        } else {
                            0
                        },
                        key,
                    },
                },
                node,
            }
        })
        .collect();
    // etcd lists keys in order; the first of two conflicting records wins.
    candidates.sort_by(|a, b| key_of(a).cmp(key_of(b)));
    validate::validate(candidates, local)
}

fn key_of(c: &Candidate) -> &str {
    match &c.record.origin {
        Origin::Etcd { key, .. } => key,
        Origin::File { .. } => "",
    }
}

/// Keeps this agent registered and the node set in sync, forever.
pub async fn run(
    cfg: EtcdConfig,
    me: Node,
    local: LocalNode,
    nodes: Nodes,
    registration: Registration,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let err = session(&cfg, &me, &local, &nodes, &registration).await;
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
    local: &LocalNode,
    nodes: &Nodes,
    registration: &Registration,
) -> EtcdError {
    match session_inner(cfg, me, local, nodes, registration).await {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

async fn session_inner(
    cfg: &EtcdConfig,
    me: &Node,
    local: &LocalNode,
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
    nodes.accept(nodes_from_range(&list, &cfg.prefix, local));

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
                        nodes.accept(nodes_from_range(&list, &cfg.prefix, local));
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

    fn local() -> LocalNode {
        LocalNode {
            name: Some("n1".into()),
            health_cidr: Some("198.18.64.0/24".parse().expect("cidr")),
        }
    }

    fn kv(key: &str, value: &Value) -> Value {
        json!({"key": B64.encode(key), "value": B64.encode(value.to_string())})
    }

    fn record(name: &str, node_ip: &str, health_ip: &str) -> Value {
        json!({"name": name, "node_ip": node_ip, "health_ip": health_ip})
    }

    fn outcome(v: &Validated) -> (Vec<&str>, Vec<String>) {
        (
            v.nodes.iter().map(|n| n.name.as_str()).collect(),
            v.rejected.iter().map(ToString::to_string).collect(),
        )
    }

    #[test]
    fn range_responses_decode_and_reject_garbage_by_key() {
        let v = json!({"header": {"revision": "5"}, "kvs": [
            kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2")),
            {"key": B64.encode("/h/bad"), "value": B64.encode("not json")},
            {"key": B64.encode("/h/bad64"), "value": "%%%"},
            kv("/h/n2", &record("n2", "198.18.0.12", "198.18.65.2")),
        ]});
        let got = nodes_from_range(&v, "/h/", &local());
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["n1", "n2"]);
        assert_eq!(rejected.len(), 2, "{rejected:?}");
        assert!(
            rejected[0].starts_with("etcd key \"/h/bad\": the value is not a node record: "),
            "{rejected:?}"
        );
        assert_eq!(
            rejected[1],
            "etcd key \"/h/bad64\": the value is not base64"
        );
        assert_eq!(
            nodes_from_range(&json!({}), "/h/", &local()),
            Validated::default()
        );
    }

    #[test]
    fn each_rule_rejects_the_record_by_key_and_keeps_the_others() {
        let good = kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2"));
        for (bad, needle) in [
            (
                kv("/h/n5", &record("n5", "127.0.0.1", "198.18.66.2")),
                "etcd key \"/h/n5\": node-ip 127.0.0.1 is loopback",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "0.0.0.0")),
                "etcd key \"/h/n5\": health-ip 0.0.0.0 is unspecified",
            ),
            (
                kv("/h/n5", &record("n5", "169.254.9.9", "198.18.66.2")),
                "node-ip 169.254.9.9 is link-local",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "239.1.1.1")),
                "health-ip 239.1.1.1 is multicast",
            ),
            (
                kv("/h/n5", &record("n5", "255.255.255.255", "198.18.66.2")),
                "limited broadcast",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "241.0.0.1")),
                "reserved (240.0.0.0/4)",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "198.18.64.77")),
                "etcd key \"/h/n5\": health-ip 198.18.64.77 is inside this node's health CIDR 198.18.64.0/24",
            ),
            (
                kv("/h/n5", &record("other", "198.18.0.15", "198.18.66.2")),
                "etcd key \"/h/n5\": the name \"other\" is not the key's last segment \"n5\"",
            ),
            (
                kv("/h/", &record("", "198.18.0.15", "198.18.66.2")),
                "etcd key \"/h/\": the name is empty",
            ),
            (
                kv("/h/a b", &record("a b", "198.18.0.15", "198.18.66.2")),
                "the name \"a b\" is not a node name",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.11", "198.18.66.2")),
                "etcd key \"/h/n5\": node-ip 198.18.0.11 is already the node-ip of node \"n1\" at etcd key \"/h/n1\", which is kept",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "198.18.0.11")),
                "health-ip 198.18.0.11 is already the node-ip of node \"n1\"",
            ),
        ] {
            let v = json!({"kvs": [good.clone(), bad]});
            let got = nodes_from_range(&v, "/h/", &local());
            let (kept, rejected) = outcome(&got);
            assert_eq!(kept, ["n1"], "{needle}");
            assert_eq!(rejected.len(), 1, "{rejected:?}");
            assert!(
                rejected[0].contains(needle),
                "{} lacks {needle:?}",
                rejected[0]
            );
        }
    }

    #[test]
    fn the_name_is_the_last_segment_after_the_prefix() {
        // A prefix without a trailing '/': the agent registers `<prefix><name>`.
        let v = json!({"kvs": [
            kv("/health/nodesn1", &record("n1", "198.18.0.11", "198.18.64.2")),
            kv("/health/nodesn2", &record("n2", "198.18.0.12", "198.18.65.2")),
            kv("/health/nodesx/n3", &record("n3", "198.18.0.13", "198.18.66.2")),
            kv("/health/nodesn4", &record("nodesn4", "198.18.0.14", "198.18.67.2")),
        ]});
        let got = nodes_from_range(&v, "/health/nodes", &local());
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["n1", "n2", "n3"]);
        assert_eq!(
            rejected,
            [
                "etcd key \"/health/nodesn4\": the name \"nodesn4\" is not the key's last segment \"n4\""
            ]
        );
    }

    #[test]
    fn conflicts_keep_the_first_key_and_this_node_wins() {
        // Listed out of order: key order decides which of two is kept.
        let v = json!({"kvs": [
            kv("/h/b/x", &record("x", "198.18.0.13", "198.18.67.2")),
            kv("/h/a/x", &record("x", "198.18.0.12", "198.18.66.2")),
            kv("/h/0", &record("0", "198.18.0.11", "198.18.65.2")),
            kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2")),
        ]});
        let got = nodes_from_range(&v, "/h/", &local());
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["n1", "x"]);
        assert_eq!(
            got.nodes.get("x").map(|n| n.node_ip.to_string()),
            Some("198.18.0.12".into())
        );
        assert_eq!(
            rejected,
            [
                "etcd key \"/h/0\": node-ip 198.18.0.11 is already the node-ip of node \"n1\" at etcd key \"/h/n1\", which is kept",
                "etcd key \"/h/b/x\": duplicate name \"x\": node \"x\" at etcd key \"/h/a/x\" has it and is kept",
            ]
        );
    }
}
