//! The etcd endpoints given by name (`--kvstore-endpoint etcd-1:2379`),
//! resolved at each route sync, so that no peer's route takes an address
//! the agent reaches etcd at: those given as addresses are protected as
//! they are. A name that cannot be resolved in time keeps the addresses
//! it last resolved to; one never resolved protects nothing, and says so
//! once.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use tracing::warn;

/// How long a sync waits for every name's addresses.
const RESOLVE_WITHIN: Duration = Duration::from_secs(2);

/// The names, and the addresses each last resolved to.
#[derive(Debug, Default)]
pub(super) struct EndpointNames {
    /// `host:port`, the host a name.
    names: Vec<String>,
    /// By name: its addresses when last resolved (none yet: absent).
    last: Mutex<HashMap<String, Vec<IpAddr>>>,
}

/// The address of a `host:port` endpoint, when its host is an address
/// (`198.18.0.1:2379`, `[2001:2::1]:2379`), or of a bare address.
pub(super) fn address_of(endpoint: &str) -> Option<IpAddr> {
    endpoint
        .parse::<std::net::SocketAddr>()
        .map(|a| a.ip())
        .ok()
        .or_else(|| endpoint.parse().ok())
}

impl EndpointNames {
    /// The endpoints of `endpoints` given by name.
    pub(super) fn of(endpoints: &[String]) -> Self {
        Self {
            names: endpoints
                .iter()
                .filter(|e| address_of(e).is_none())
                .cloned()
                .collect(),
            last: Mutex::default(),
        }
    }

    /// Every name's addresses: resolved now, within [`RESOLVE_WITHIN`]
    /// for all of them, or as last resolved.
    pub(super) async fn addresses(&self) -> Vec<IpAddr> {
        if self.names.is_empty() {
            return Vec::new();
        }
        // At once, each within the bound: a name whose server does not
        // answer holds up no other.
        let lookups = self.names.iter().map(|name| async move {
            let found =
                tokio::time::timeout(RESOLVE_WITHIN, tokio::net::lookup_host(name.as_str()))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|addrs| addrs.map(|a| a.ip()).collect::<Vec<_>>());
            (name, found)
        });
        let resolved = futures::future::join_all(lookups).await;
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, found) in resolved {
            match found {
                Some(addrs) if !addrs.is_empty() => {
                    last.insert(name.clone(), addrs);
                }
                _ if !last.contains_key(name) => {
                    // Once: the entry stands for the name from now on.
                    warn!(
                        endpoint = %name,
                        "the etcd endpoint's name does not resolve: no peer route is kept off its addresses until it does"
                    );
                    last.insert(name.clone(), Vec::new());
                }
                _ => {}
            }
        }
        let mut addrs: Vec<IpAddr> = last.values().flatten().copied().collect();
        addrs.sort_unstable();
        addrs.dedup();
        addrs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_endpoints_given_by_name_are_resolved() {
        let names = EndpointNames::of(&[
            "198.18.0.1:2379".into(),
            "[2001:2::1]:2379".into(),
            "localhost:2379".into(),
        ]);
        assert_eq!(names.names, ["localhost:2379"]);
        assert_eq!(address_of("198.18.0.1:2379"), Some([198, 18, 0, 1].into()));
        assert_eq!(address_of("localhost:2379"), None);
    }

    #[tokio::test]
    async fn a_name_resolves_and_keeps_its_addresses_when_it_no_longer_does() {
        let names =
            EndpointNames::of(&["localhost:2379".into(), "no-such-name.invalid:2379".into()]);
        let addrs = names.addresses().await;
        assert!(addrs.contains(&IpAddr::from([127, 0, 0, 1])), "{addrs:?}");
        // The name no longer resolving: its last addresses stay.
        names.last.lock().expect("lock").insert(
            "no-such-name.invalid:2379".into(),
            vec![[198, 18, 0, 9].into()],
        );
        let addrs = names.addresses().await;
        assert!(addrs.contains(&IpAddr::from([198, 18, 0, 9])), "{addrs:?}");
        assert!(addrs.contains(&IpAddr::from([127, 0, 0, 1])), "{addrs:?}");
    }
}
