//! This node in the cluster: its name and addresses, where the node set
//! comes from (a file or etcd), and how often its changes are applied.
#![allow(
    clippy::doc_markdown,
    reason = "clap turns these doc comments into --help text, shown verbatim"
)]

use std::{net::Ipv4Addr, path::PathBuf, time::Duration};

use clap::Args;

use crate::membership::{
    kvstore::{Credentials, EtcdConfig, KvConfigError, TlsConfig},
    sync::Limits,
};
use crate::util::section::section;

/// Supported key-value stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kvstore {
    Etcd,
}

section! {
    /// This node and its node set.
    #[derive(Debug, Clone, PartialEq, Eq, Args)]
    pub struct ClusterSettings {
        /// This node's name in the node set (default: the hostname): the
        /// name of its record, which its hello servers answer under (peers
        /// fail the probes of an address answered under another name).
        #[arg(long)]
        pub node_name: Option<String>,
        /// Nodes file (YAML or JSON), watched for changes.
        #[arg(long, value_name = "PATH", conflicts_with = "kvstore")]
        pub nodes_file: Option<PathBuf>,
        /// Discover nodes through a key-value store instead of a file.
        #[arg(long, value_enum)]
        pub kvstore: Option<Kvstore>,
        /// Client address of the kvstore, `host:port`; several (an etcd
        /// cluster's members) comma-separated or the flag repeated: the
        /// client uses any member that answers.
        #[arg(long, default_value = "127.0.0.1:2379", value_name = "HOST:PORT",
              value_delimiter = ',', value_parser = crate::membership::kvstore::parse_endpoint)]
        pub kvstore_endpoint: Vec<String>,
        /// Key prefix under which nodes register: a directory, ending in
        /// `/` (the summaries, the view, the election and the health
        /// allocations sit beside it).
        #[arg(long, default_value = "/health/nodes/", value_parser = key_prefix)]
        pub kvstore_prefix: String,
        /// Take a peer's addresses only as an admin allocated them to its
        /// node, at `<allocations-prefix><name>` beside the records
        /// (`/health/nodes/` gives `/health/allocations/<name>`, e.g.
        /// `{"health_cidr": "198.18.64.0/24", "node_ip": "198.18.0.11"}`), a
        /// key no node's etcd role may write: a peer's health address must
        /// lie inside its allocation's health CIDRs, and a node address an
        /// allocation names is that node's alone, so a node cannot claim
        /// another's address, even one no node holds yet. Node addresses
        /// must then lie outside --health-range, --health-range6 and every
        /// node's health CIDRs.
        #[arg(long)]
        pub kvstore_allocations: bool,
        /// TTL of this node's registration lease (kept alive while the agent
        /// runs; revoked when it stops cleanly). A node that dies stays in the
        /// others' node sets this long, so that they see it fail and the
        /// cluster view says "node down" (as Cilium's 15-minute default).
        #[arg(long, default_value = "15m", value_parser = parse_lease_ttl)]
        pub kvstore_lease_ttl: Duration,
        /// CA certificate (PEM) that signed etcd's server certificate: talk to
        /// etcd over TLS (https).
        #[arg(long, value_name = "FILE")]
        pub kvstore_ca: Option<PathBuf>,
        /// Client certificate (PEM) for etcd's --client-cert-auth; with
        /// --kvstore-key and --kvstore-ca.
        #[arg(long, value_name = "FILE", requires_all = ["kvstore_key", "kvstore_ca"])]
        pub kvstore_cert: Option<PathBuf>,
        /// The private key (PEM) of --kvstore-cert.
        #[arg(long, value_name = "FILE", requires = "kvstore_cert")]
        pub kvstore_key: Option<PathBuf>,
        /// etcd user to authenticate as; the password is read from
        /// --kvstore-password-file.
        #[arg(long, value_name = "NAME", requires = "kvstore_password_file")]
        pub kvstore_user: Option<String>,
        /// File holding the --kvstore-user's password (without its final line
        /// break); there is no flag for the password itself.
        #[arg(long, value_name = "FILE", requires = "kvstore_user")]
        pub kvstore_password_file: Option<PathBuf>,
        /// This node's IP as published in the kvstore (default: the source
        /// address of the route to the kvstore).
        #[arg(long, value_parser = parse_node_ip)]
        pub node_ip: Option<Ipv4Addr>,
        /// This node's IPv6 address as published in the kvstore, with
        /// --health-cidr6 (default: the source address toward the kvstore when
        /// it is reached over IPv6, else a global IPv6 address of the interface
        /// holding the IPv4 node IP).
        #[arg(long, value_parser = parse_node_ip6)]
        pub node_ip6: Option<std::net::Ipv6Addr>,
        /// This node's zone (a rack, a failure domain), written in its etcd
        /// record: nodes of one zone probe each other in full whatever
        /// --probe-peers says. With a nodes file, the node's entry says it.
        #[arg(long, value_name = "NAME", value_parser = parse_zone)]
        pub zone: Option<String>,
        /// The largest node set taken: a nodes file or etcd prefix with more
        /// nodes is refused whole, and the last good set is kept (said in
        /// `GET /v1/nodes`). With --kvstore-allocations, at most this many
        /// allocations are held; past it the set is refused whole.
        #[arg(long, value_name = "N", default_value_t = 65_536,
              value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
        pub max_nodes: u32,
        /// Node-set changes are applied at most this often (with --sync-burst slack)...
        #[arg(long, default_value = "1s", value_parser = crate::util::duration::parse)]
        pub sync_min_interval: Duration,
        /// ...and at least this often.
        #[arg(long, default_value = "60s", value_parser = crate::util::duration::parse)]
        pub sync_max_interval: Duration,
        /// Node-set changes applied back to back before --sync-min-interval
        /// holds them apart (a change after a quiet spell is applied at once).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
        pub sync_burst: u32,
    }
}

fn parse_zone(s: &str) -> Result<String, String> {
    crate::membership::validate::zone(s).map(str::to_owned)
}

/// A node address peers accept: not unspecified, loopback, link-local,
/// multicast or broadcast (checked as the flag is read, so `config check`
/// refuses it too).
fn parse_node_address<A: std::str::FromStr + Into<std::net::IpAddr> + Copy>(
    s: &str,
) -> Result<A, String>
where
    A::Err: std::fmt::Display,
{
    let ip: A = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    match crate::membership::validate::address_class(ip.into()) {
        Some(class) => Err(format!(
            "{s} is {class}: peers could not reach this node there"
        )),
        None => Ok(ip),
    }
}

fn parse_node_ip(s: &str) -> Result<Ipv4Addr, String> {
    parse_node_address(s)
}

fn parse_node_ip6(s: &str) -> Result<std::net::Ipv6Addr, String> {
    parse_node_address(s)
}

/// Where the node set comes from.
#[derive(Debug, Clone)]
pub enum Discovery {
    File(PathBuf),
    Etcd(EtcdConfig),
    None,
}

impl ClusterSettings {
    /// Where the node set comes from; the etcd TLS and password files are
    /// read and checked here, naming their flag.
    ///
    /// # Errors
    /// A TLS or password file that cannot be read or is not valid.
    pub fn discovery(&self) -> Result<Discovery, KvConfigError> {
        Ok(match (&self.nodes_file, self.kvstore) {
            (Some(path), _) => Discovery::File(path.clone()),
            (None, Some(Kvstore::Etcd)) => Discovery::Etcd(EtcdConfig {
                endpoints: self.kvstore_endpoint.clone(),
                prefix: self.kvstore_prefix.clone(),
                lease_ttl: self.kvstore_lease_ttl,
                tls: self
                    .kvstore_ca
                    .as_deref()
                    .map(|ca| {
                        let pair = self
                            .kvstore_cert
                            .as_deref()
                            .zip(self.kvstore_key.as_deref());
                        TlsConfig::load(ca, pair)
                    })
                    .transpose()?,
                credentials: self
                    .kvstore_user
                    .as_deref()
                    .zip(self.kvstore_password_file.as_deref())
                    .map(|(user, file)| Credentials::load(user, file))
                    .transpose()?,
                lease_file: None,
                allocations: self.kvstore_allocations.then(|| {
                    crate::membership::kvstore::beside(&self.kvstore_prefix, "allocations")
                }),
            }),
            (None, None) => Discovery::None,
        })
    }

    /// The bounded-frequency runner applying node-set changes.
    #[must_use]
    pub const fn sync_limits(&self) -> Limits {
        Limits {
            min_interval: self.sync_min_interval,
            max_interval: self.sync_max_interval,
            burst: self.sync_burst,
        }
    }

    /// `--max-nodes`: a larger node set is refused whole.
    #[must_use]
    pub fn max_nodes(&self) -> usize {
        usize::try_from(self.max_nodes).unwrap_or(usize::MAX)
    }
}

/// `--kvstore-prefix`: a directory of keys, ending in `/`. Without the
/// slash, the keys beside it (`nodes-summaries/`, `nodes-view/`) would be
/// under it, and every summary would be read as a node record.
fn key_prefix(s: &str) -> Result<String, String> {
    if !s.ends_with('/') || s.trim_matches('/').is_empty() {
        return Err(format!(
            "{s:?} is not a key directory: it ends in '/' and names one, as /health/nodes/"
        ));
    }
    let path = s.trim_end_matches('/');
    if let Some((_, leaf @ ("summaries" | "view" | "assembler" | "allocations"))) =
        path.rsplit_once('/')
    {
        return Err(format!(
            "{s:?} is where the {leaf} sit, beside the node records: name the records' own directory, as /health/nodes/"
        ));
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod prefix_tests {
    use super::key_prefix;

    #[test]
    fn a_prefix_is_a_directory_of_keys() {
        for good in ["/health/nodes/", "nodes/", "/a/b/c/"] {
            assert_eq!(key_prefix(good).as_deref(), Ok(good));
        }
        for bad in ["nodes", "/health/nodes", "/", "", "//"] {
            let e = key_prefix(bad).expect_err(bad);
            assert!(e.contains("ends in '/'"), "{bad:?}: {e}");
        }
        // The summaries', the view's and the election's own directories.
        for bad in [
            "/health/summaries/",
            "/x/view/",
            "/assembler/",
            "/health/allocations/",
        ] {
            let e = key_prefix(bad).expect_err(bad);
            assert!(e.contains("beside the node records"), "{bad:?}: {e}");
        }
        assert!(
            key_prefix("view/").is_ok(),
            "its siblings are view-summaries/..."
        );
    }
}

/// `--kvstore-lease-ttl`: whole seconds (etcd grants leases in seconds),
/// 2 at least (one keep-alive a second leaves no room under less).
fn parse_lease_ttl(s: &str) -> Result<Duration, String> {
    let ttl = crate::util::duration::parse_whole_secs(s)?;
    if ttl < Duration::from_secs(2) {
        return Err(format!("{s:?}: an etcd lease lasts 2 s at least"));
    }
    Ok(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_ttl_is_whole_seconds_two_at_least() {
        assert_eq!(parse_lease_ttl("4s"), Ok(Duration::from_secs(4)));
        for bad in ["1s", "2500ms"] {
            assert!(parse_lease_ttl(bad).is_err(), "{bad}");
        }
    }
}
