//! The etcd endpoints given by name (`--kvstore-endpoint etcd-1:2379`),
//! resolved at each route sync, so that no peer's route takes an address
//! the agent reaches etcd at: those given as addresses are protected as
//! they are.
//!
//! Each name has at most one lookup in flight, started by a sync and
//! written to the cache whenever it ends, however late (a resolver whose
//! first server is dead answers after its own timeout). A sync waits for
//! the lookups of names never resolved yet, [`RESOLVE_WITHIN`] at most;
//! the others it reads from the cache. A name keeps every address it has
//! resolved to ([`MAX_KEPT`] at most, the oldest going first): the etcd
//! client may still hold a connection to an address the name no longer
//! gives. A name that does not resolve is said in the log once, until it
//! does.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tracing::{info, warn};

/// How long a sync waits for the names never resolved yet.
const RESOLVE_WITHIN: Duration = Duration::from_secs(2);

/// The most addresses kept for a name.
const MAX_KEPT: usize = 64;

/// The names, and what each resolved to.
#[derive(Debug, Default)]
pub(super) struct EndpointNames {
    /// `host:port`, the host a name.
    names: Vec<String>,
    state: Arc<Mutex<HashMap<String, NameState>>>,
}

/// One name's addresses and lookup.
#[derive(Debug, Default)]
struct NameState {
    /// Every address it resolved to, oldest first.
    addrs: Vec<IpAddr>,
    /// A lookup is in flight.
    looking: bool,
    /// Its last lookup failed, and that was said.
    failing: bool,
}

impl NameState {
    /// Takes a lookup's outcome in, saying what changed.
    fn take(&mut self, name: &str, found: std::io::Result<Vec<IpAddr>>) {
        self.looking = false;
        match found {
            Ok(addrs) if !addrs.is_empty() => {
                if std::mem::take(&mut self.failing) {
                    info!(endpoint = %name, "the etcd endpoint's name resolves again");
                }
                for a in addrs {
                    if let Some(at) = self.addrs.iter().position(|k| *k == a) {
                        self.addrs.remove(at);
                    }
                    self.addrs.push(a);
                }
                let over = self.addrs.len().saturating_sub(MAX_KEPT);
                self.addrs.drain(..over);
            }
            found if !self.failing => {
                self.failing = true;
                let why = found
                    .err()
                    .map_or_else(|| "no address".to_owned(), |e| e.to_string());
                if self.addrs.is_empty() {
                    warn!(endpoint = %name, "the etcd endpoint's name does not resolve ({why}): no peer route is kept off its addresses until it does");
                } else {
                    warn!(endpoint = %name, "the etcd endpoint's name does not resolve ({why}): the {} addresses it resolved to stay kept off peer routes", self.addrs.len());
                }
            }
            _ => {}
        }
    }
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

async fn lookup(name: String) -> std::io::Result<Vec<IpAddr>> {
    tokio::net::lookup_host(name.as_str())
        .await
        .map(|found| found.map(|a| a.ip()).collect())
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
            state: Arc::default(),
        }
    }

    /// Every address the names have resolved to, after starting a lookup
    /// of each name that has none in flight, and waiting for those of
    /// names never resolved yet ([`RESOLVE_WITHIN`] at most).
    pub(super) async fn addresses(&self) -> Vec<IpAddr> {
        self.addresses_by(lookup).await
    }

    async fn addresses_by<F, L>(&self, resolve: F) -> Vec<IpAddr>
    where
        F: Fn(String) -> L,
        L: Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'static,
    {
        let mut first = Vec::new();
        for name in &self.names {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let entry = state.entry(name.clone()).or_default();
            if entry.looking {
                continue;
            }
            entry.looking = true;
            let never = entry.addrs.is_empty();
            drop(state);
            let (shared, name, found) = (self.state.clone(), name.clone(), resolve(name.clone()));
            let done = tokio::spawn(async move {
                let found = found.await;
                let mut state = shared.lock().unwrap_or_else(PoisonError::into_inner);
                state.entry(name.clone()).or_default().take(&name, found);
            });
            if never {
                first.push(done);
            }
        }
        if !first.is_empty() {
            let _ = tokio::time::timeout(RESOLVE_WITHIN, futures::future::join_all(first)).await;
        }
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut addrs: Vec<IpAddr> = state
            .values()
            .flat_map(|s| s.addrs.iter().copied())
            .collect();
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
            "etcd-1:2379".into(),
        ]);
        assert_eq!(names.names, ["etcd-1:2379"]);
        assert_eq!(address_of("198.18.0.1:2379"), Some([198, 18, 0, 1].into()));
        assert_eq!(address_of("etcd-1:2379"), None);
    }

    /// The answers a scripted resolver gives, by name, in turn (`None`:
    /// the lookup never ends); a name not scripted fails.
    type Answers = Arc<Mutex<HashMap<String, Vec<Option<Vec<IpAddr>>>>>>;

    /// A scripted resolver: each lookup of a name takes the next answer
    /// given for it.
    fn scripted(
        answers: &Answers,
    ) -> impl Fn(String) -> futures::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        let answers = answers.clone();
        move |name: String| {
            // A name scripted has an answer for every lookup the test
            // expects, and no more.
            let next = answers.lock().expect("lock").get_mut(&name).map(|a| {
                assert!(!a.is_empty(), "a lookup of {name} past the script");
                a.remove(0)
            });
            Box::pin(async move {
                match next {
                    Some(Some(addrs)) => Ok(addrs),
                    Some(None) => std::future::pending().await,
                    None => Err(std::io::Error::other("no such name")),
                }
            })
        }
    }

    fn ip(last: u8) -> IpAddr {
        [198, 18, 0, last].into()
    }

    #[tokio::test(start_paused = true)]
    async fn names_keep_every_address_and_a_slow_lookup_holds_up_no_sync() {
        // Resolves, then moves to another address, then hangs.
        let answers = Arc::new(Mutex::new(HashMap::from([(
            "etcd-1:2379".to_owned(),
            vec![Some(vec![ip(1)]), Some(vec![ip(2)]), None],
        )])));
        let names = EndpointNames::of(&["etcd-1:2379".into()]);
        let resolve = scripted(&answers);
        assert_eq!(names.addresses_by(&resolve).await, [ip(1)]);
        // A name resolved before is not waited for: its new lookup is
        // taken when it ends.
        assert_eq!(names.addresses_by(&resolve).await, [ip(1)]);
        tokio::task::yield_now().await;
        // Moved: the old address stays kept.
        assert_eq!(names.addresses_by(&resolve).await, [ip(1), ip(2)]);
        // Hanging: the sync reads what is known at once, and starts no
        // second lookup of the name while one is in flight.
        let at = tokio::time::Instant::now();
        assert_eq!(names.addresses_by(&resolve).await, [ip(1), ip(2)]);
        assert_eq!(names.addresses_by(&resolve).await, [ip(1), ip(2)]);
        assert!(at.elapsed() < RESOLVE_WITHIN, "{:?}", at.elapsed());
        assert!(names.state.lock().expect("lock")["etcd-1:2379"].looking);
    }

    #[tokio::test(start_paused = true)]
    async fn a_name_never_resolved_is_waited_for_a_while_and_taken_late() {
        // etcd-1 hangs; etcd-2 fails at once, every time.
        let answers = Arc::new(Mutex::new(HashMap::from([(
            "etcd-1:2379".to_owned(),
            vec![None, None],
        )])));
        let names = EndpointNames::of(&["etcd-1:2379".into(), "etcd-2:2379".into()]);
        let at = tokio::time::Instant::now();
        assert_eq!(
            names.addresses_by(scripted(&answers)).await,
            [] as [IpAddr; 0]
        );
        assert_eq!(at.elapsed(), RESOLVE_WITHIN, "waited for, then given up");
        {
            let state = names.state.lock().expect("lock");
            assert!(state["etcd-1:2379"].looking && !state["etcd-1:2379"].failing);
            assert!(state["etcd-2:2379"].failing && state["etcd-2:2379"].addrs.is_empty());
        }
        // In flight: not waited for again.
        let at = tokio::time::Instant::now();
        assert_eq!(
            names.addresses_by(scripted(&answers)).await,
            [] as [IpAddr; 0]
        );
        assert!(at.elapsed() < RESOLVE_WITHIN);
        // A late answer is taken whenever it comes.
        names
            .state
            .lock()
            .expect("lock")
            .get_mut("etcd-1:2379")
            .expect("its state")
            .take("etcd-1:2379", Ok(vec![ip(7)]));
        assert_eq!(names.addresses_by(scripted(&answers)).await, [ip(7)]);
    }

    #[tokio::test]
    async fn localhost_resolves_through_the_system() {
        let names = EndpointNames::of(&["localhost:2379".into()]);
        let addrs = names.addresses().await;
        assert!(addrs.contains(&IpAddr::from([127, 0, 0, 1])), "{addrs:?}");
    }
}
