//! Which `Host` the metrics listener answers: its listen address (with its
//! port or bare), `localhost` (with its port or bare), and the names given
//! by `--web-allowed-hosts`. Anything else is refused with 421 Misdirected
//! Request. A page of another site that rebinds its own name to this
//! host's address (DNS rebinding) still sends its own name as the `Host`,
//! so it is refused before any route runs.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    str::FromStr,
    sync::Arc,
};

use axum::{
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header, uri::Authority},
    middleware::Next,
    response::{IntoResponse, Response},
};

/// A value of `--web-allowed-hosts` that is not a host name or address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid host {given:?}: {reason}")]
pub struct HostError {
    given: String,
    reason: &'static str,
}

/// One allowed name: a DNS name or an IP address, with an optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Allowed {
    /// Lower case; an IPv6 address in brackets, as in a `Host` header.
    host: String,
    /// `None`: the listen port, or no port.
    port: Option<u16>,
}

/// The names `--web-allowed-hosts` adds to the listen address and
/// `localhost`: `NAME[:PORT],...`. A name without a port is accepted bare
/// or with the listen port; one with a port (a forwarded port, say) only
/// with that port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    names: Arc<[Allowed]>,
}

impl FromStr for AllowedHosts {
    type Err = HostError;

    /// A comma-separated list; empty items are refused, an empty list
    /// allows no name beyond the defaults.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let names = s
            .split(',')
            .map(|item| parse_allowed(item.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            names: names.into(),
        })
    }
}

impl fmt::Display for AllowedHosts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.names.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&a.host)?;
            if let Some(p) = a.port {
                write!(f, ":{p}")?;
            }
        }
        Ok(())
    }
}

fn parse_allowed(item: &str) -> Result<Allowed, HostError> {
    let err = |reason| HostError {
        given: item.to_owned(),
        reason,
    };
    if item.is_empty() {
        return Err(err("empty (a stray comma?)"));
    }
    // A bare IPv6 address, written without brackets.
    if let Ok(v6) = item.parse::<std::net::Ipv6Addr>() {
        return Ok(Allowed {
            host: format!("[{v6}]"),
            port: None,
        });
    }
    let (host, port) = split(item).ok_or_else(|| {
        err("expected NAME, NAME:PORT, an IP address or [IPv6]:PORT (no scheme, user or path)")
    })?;
    // `split` checked a bracketed IPv6 address already.
    if !host.starts_with('[') && host.parse::<IpAddr>().is_err() && !is_dns_name(&host) {
        return Err(err(
            "not a DNS name (letters, digits, '-' and '.', at most 253 characters) or an IP address",
        ));
    }
    Ok(Allowed { host, port })
}

/// A DNS name (RFC 1123): labels of letters, digits and `-`, not starting
/// or ending with `-`, of at most 63 characters, at most 253 in all.
fn is_dns_name(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// `host[:port]` as in a `Host` header: the host lower case, an IPv6
/// address kept in brackets (canonical form). `None` when it is not one.
fn split(value: &str) -> Option<(String, Option<u16>)> {
    if value.contains(['@', '/', '?', '#']) {
        return None;
    }
    let authority = value.parse::<Authority>().ok()?;
    let host = authority.host();
    // What follows the host: nothing, or `:` and a port (not empty, not
    // past 65535, which `Authority` lets through as no port).
    let port = match authority.as_str().get(host.len()..)? {
        "" => None,
        rest => Some(rest.strip_prefix(':')?.parse::<u16>().ok()?),
    };
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => format!("[{}]", v6.parse::<std::net::Ipv6Addr>().ok()?),
        None => host.to_ascii_lowercase(),
    };
    if host.is_empty() {
        return None;
    }
    Some((host, port))
}

/// Why a request's host is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `Host` header (and no authority in the request line).
    Missing,
    /// More than one `Host` header, or a host that is not `host[:port]`
    /// (what was given, cut short).
    Malformed(String),
    /// `Host` given this many times.
    Repeated(usize),
    /// A well-formed host this listener does not answer to.
    Foreign(String),
}

impl AllowedHosts {
    /// Whether `value` (a `Host` header or a request line's authority) names
    /// this listener, listening on `listen`.
    ///
    /// # Errors
    /// The [`Refusal`].
    pub fn check(&self, listen: SocketAddr, value: &str) -> Result<(), Refusal> {
        let (host, port) = split(value).ok_or_else(|| Refusal::Malformed(shown(value)))?;
        let listen_port = port.is_none() || port == Some(listen.port());
        let ip = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&host)
            .parse::<IpAddr>()
            .ok();
        // Listening on every address: any address of this host may be
        // used, and an address literal cannot be rebound by DNS.
        let listen_ip = ip.is_some_and(|ip| {
            listen.ip().is_unspecified() || ip.to_canonical() == listen.ip().to_canonical()
        });
        let named = self.names.iter().any(|a| {
            a.host == host
                && match a.port {
                    Some(p) => port == Some(p),
                    None => listen_port,
                }
        });
        if named || (listen_port && (listen_ip || host == "localhost")) {
            Ok(())
        } else {
            Err(Refusal::Foreign(value.to_owned()))
        }
    }
}

/// The address the connection was accepted on, set by the listener on
/// every request.
#[derive(Debug, Clone, Copy)]
pub struct ListenAddr(pub SocketAddr);

/// The middleware: a request whose host is not this listener's is answered
/// 421 (400 when it has none or a malformed one), naming the host refused.
pub async fn require_allowed_host(
    State(allowed): State<AllowedHosts>,
    request: Request,
    next: Next,
) -> Response {
    // Without the listener's address (a router served some other way) only
    // `localhost` and the names given are accepted.
    let listen = request
        .extensions()
        .get::<ListenAddr>()
        .map_or(SocketAddr::from(([0, 0, 0, 1], 0)), |l| l.0);
    let mut hosts = request.headers().get_all(header::HOST).iter();
    // The absolute form (`GET http://host/ HTTP/1.1`) names the host in
    // the request line, which wins over the header (RFC 9112 3.2.2).
    let from = if request.uri().authority().is_some() {
        "the request line's host"
    } else {
        "the Host header"
    };
    let value = match (request.uri().authority(), hosts.next(), hosts.next()) {
        (Some(a), _, _) => Ok(a.as_str().to_owned()),
        (None, Some(h), None) => h
            .to_str()
            .map(str::to_owned)
            .map_err(|_| Refusal::Malformed(shown(&String::from_utf8_lossy(h.as_bytes())))),
        (None, None, _) => Err(Refusal::Missing),
        (None, Some(_), Some(_)) => Err(Refusal::Repeated(
            request.headers().get_all(header::HOST).iter().count(),
        )),
    };
    match value.and_then(|v| allowed.check(listen, &v)) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refused(&refusal, listen, from),
    }
}

/// The longest part of a refused host shown in the answer.
const SHOWN: usize = 64;

/// `value` cut to [`SHOWN`] bytes, quoted.
fn shown(value: &str) -> String {
    format!("{:?}", crate::util::text::clip(value, SHOWN))
}

fn refused(refusal: &Refusal, listen: SocketAddr, from: &str) -> Response {
    let (status, body) = match refusal {
        Refusal::Missing => (
            StatusCode::BAD_REQUEST,
            "a Host header is required\n".to_owned(),
        ),
        Refusal::Repeated(n) => (
            StatusCode::BAD_REQUEST,
            format!("{from} is given {n} times: give one host[:port]\n"),
        ),
        Refusal::Malformed(what) => (
            StatusCode::BAD_REQUEST,
            format!("{from} {what} is not one host[:port]\n"),
        ),
        Refusal::Foreign(host) => {
            tracing::debug!(host = ?host, "refused a request for a foreign host");
            (
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "host {} is not served here: this listener answers to {listen}, \
                     localhost and the names of --web-allowed-hosts\n",
                    shown(host)
                ),
            )
        }
    };
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().expect("a socket address")
    }

    #[test]
    fn the_listen_address_and_localhost_are_allowed_with_their_port_or_bare() {
        let none = AllowedHosts::default();
        let v4 = at("127.0.0.1:9962");
        for ok in [
            "127.0.0.1:9962",
            "127.0.0.1",
            "localhost",
            "localhost:9962",
            "LocalHost:9962",
        ] {
            assert_eq!(none.check(v4, ok), Ok(()), "{ok}");
        }
        for foreign in [
            "evil.example",
            "evil.example:9962",
            "localhost:80",
            "127.0.0.1:80",
            "127.0.0.2:9962",
            "[::1]:9962",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
        ] {
            assert_eq!(
                none.check(v4, foreign),
                Err(Refusal::Foreign(foreign.to_owned())),
                "{foreign}"
            );
        }
        let v6 = at("[::1]:9962");
        for ok in ["[::1]:9962", "[::1]", "[0:0::1]", "localhost"] {
            assert_eq!(none.check(v6, ok), Ok(()), "{ok}");
        }
        assert!(none.check(v6, "127.0.0.1:9962").is_err());
    }

    #[test]
    fn listening_on_every_address_allows_any_address_but_no_other_name() {
        let none = AllowedHosts::default();
        for listen in [at("0.0.0.0:9962"), at("[::]:9962")] {
            for ok in ["198.18.0.1:9962", "[2001:2::1]:9962", "198.18.0.1"] {
                assert_eq!(none.check(listen, ok), Ok(()), "{listen} {ok}");
            }
            assert!(none.check(listen, "198.18.0.1:8080").is_err());
            assert!(none.check(listen, "rebound.example:9962").is_err());
        }
    }

    #[test]
    fn names_given_are_allowed_with_the_listen_port_or_their_own() {
        let given: AllowedHosts = "health.example, Node-1.Cluster.example:8080,2001:2::7"
            .parse()
            .expect("valid");
        let listen = at("198.18.0.1:9962");
        for ok in [
            "health.example",
            "HEALTH.example:9962",
            "node-1.cluster.example:8080",
            "[2001:2::7]:9962",
        ] {
            assert_eq!(given.check(listen, ok), Ok(()), "{ok}");
        }
        for foreign in [
            "health.example:8080",
            "node-1.cluster.example",
            "node-1.cluster.example:9962",
            "other.example",
        ] {
            assert!(given.check(listen, foreign).is_err(), "{foreign}");
        }
        assert_eq!(
            given.to_string(),
            "health.example,node-1.cluster.example:8080,[2001:2::7]"
        );
        assert_eq!(
            given
                .to_string()
                .parse::<AllowedHosts>()
                .expect("reads back"),
            given
        );
        assert_eq!("".parse::<AllowedHosts>(), Ok(AllowedHosts::default()));
    }

    #[test]
    fn malformed_hosts_are_refused_naming_them() {
        for bad in [
            "a,,b",
            "http://health.example",
            "user@health.example",
            "health.example/x",
            "health.example:",
            "health.example:99999",
            "under_score.example",
            "-dash.example",
            "a..b",
            "[not-v6]:80",
        ] {
            let err = bad.parse::<AllowedHosts>().expect_err(bad).to_string();
            assert!(err.contains("invalid host"), "{bad}: {err}");
        }
        let err = "ok.example,bad host"
            .parse::<AllowedHosts>()
            .expect_err("a space");
        assert!(err.to_string().contains("\"bad host\""), "{err}");
        let listen = at("127.0.0.1:9962");
        for bad in ["", "a b", "user@localhost", "localhost:x", "[::1"] {
            assert_eq!(
                AllowedHosts::default().check(listen, bad),
                Err(Refusal::Malformed(format!("{bad:?}"))),
                "{bad:?}"
            );
        }
    }
}
