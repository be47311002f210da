//! The metrics listener: Prometheus' `/metrics`, the connectivity page and
//! the read-only API, over TCP.
#![allow(
    clippy::doc_markdown,
    reason = "clap turns these doc comments into --help text, shown verbatim"
)]

use clap::Args;

use crate::util::section::section;
use crate::web::host::{AllowedHosts, HostError};

/// `--prometheus-serve-addr`: an address and port, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeAddr(pub Option<std::net::SocketAddr>);

section! {
    /// The metrics listener.
    #[derive(Debug, Clone, PartialEq, Eq, Args)]
    pub struct WebSettings {
        /// Where Prometheus scrapes `/metrics` and where the connectivity page
        /// (`/`) is served, read-only; `off` serves neither.
        #[arg(long, value_name = "ADDR:PORT|off", default_value = "127.0.0.1:9962", value_parser = parse_serve_addr)]
        pub prometheus_serve_addr: ServeAddr,
        /// Also export series per peer and path (reachability, RTT): their
        /// number grows with the cluster, so they are off by default.
        #[arg(long)]
        pub metrics_per_peer: bool,
        /// Host names (`NAME` or `NAME:PORT`, comma-separated) the metrics
        /// listener answers besides its listen address and `localhost`: a
        /// request naming any other `Host` is refused (421), which defeats DNS
        /// rebinding. A name without a port is accepted bare or with the listen
        /// port; give the port a forwarded or proxied address uses.
        #[arg(long, value_name = "NAME[:PORT],...", value_parser = parse_allowed_hosts)]
        pub web_allowed_hosts: Option<AllowedHosts>,
    }
}

/// `--prometheus-serve-addr`: `ADDR:PORT`, or `off` (an empty value is
/// refused: a template's blank is not taken to turn metrics off).
fn parse_serve_addr(s: &str) -> Result<ServeAddr, String> {
    if s == "off" {
        return Ok(ServeAddr(None));
    }
    s.parse()
        .map(|a| ServeAddr(Some(a)))
        .map_err(|_| format!("{s:?} is not an ADDR:PORT (such as 127.0.0.1:9962) or `off`"))
}

/// `--web-allowed-hosts`: `NAME[:PORT],...`.
fn parse_allowed_hosts(s: &str) -> Result<AllowedHosts, String> {
    s.parse().map_err(|e: HostError| e.to_string())
}

impl WebSettings {
    /// Where the listener serves (`None`: not served).
    #[must_use]
    pub const fn serve_addr(&self) -> Option<std::net::SocketAddr> {
        self.prometheus_serve_addr.0
    }

    /// The `Host` names served besides the listen address and `localhost`.
    #[must_use]
    pub fn allowed_hosts(&self) -> AllowedHosts {
        self.web_allowed_hosts.clone().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listen_address_is_an_address_or_off_never_empty() {
        assert_eq!(parse_serve_addr("off"), Ok(ServeAddr(None)));
        assert!(parse_serve_addr("127.0.0.1:9962").is_ok_and(|a| a.0.is_some()));
        let err = parse_serve_addr("").expect_err("empty");
        assert!(err.contains("or `off`"), "{err}");
    }
}
