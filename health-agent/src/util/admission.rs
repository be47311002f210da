//! Which connections a listener admits: at most so many in all and a share
//! of them per key (a [`Source`](super::source::Source): an IPv4 address or
//! an IPv6 /64). A connection is *idle* while it waits for a request (it
//! has sent none yet, or is kept alive between requests) and *busy* while
//! one is answered. When a new connection finds no room, an idle one is
//! closed to make it:
//!
//! 1. at its key's share, that key's own oldest idle connection: hosts
//!    sharing a key (an IPv6 /64, an address behind SNAT) are not locked
//!    out by one of them holding idle connections, whose flood only turns
//!    over its own share;
//! 2. when the listener is full, the oldest idle connection of any key;
//! 3. when the listener is full of busy connections, the oldest of the
//!    keys holding the most, if they hold at least two more than the new
//!    connection's key: a few clients reading their answers slowly keep
//!    no other client out, and a client holding one or two is never the
//!    one closed for them.
//!
//! Otherwise the new connection is refused. A closed connection's place is
//! given back at once; its task sees [`Admitted::evicted`] and ends.
//!
//! Both listeners accept a connection when its first bytes arrive, or
//! after [`ACCEPT_ON_DATA`], and a connection whose whole request is there
//! when accepted is busy from its accept: a peer's request, sent as it
//! connects or within a second of it, is never closed for newer
//! connections of its key, however fast they come; a client holding
//! connections open with nothing sent takes no place for that second.
//! (While a listener's queue of connections not yet accepted is full, the
//! kernel answers with SYN cookies, and a cookie's connection is accepted
//! on its handshake's last ACK, data or not: as if there were no wait.)

use std::{
    collections::{BTreeMap, HashMap},
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use tokio_util::sync::CancellationToken;

/// How long a listener's kernel holds a connection that has sent nothing
/// before handing it over anyway (`TCP_DEFER_ACCEPT`, `sys::sockopt::defer_accept`):
/// a prober sends its request within its probe timeout (1 s by default),
/// and a browser or Prometheus as it connects.
pub const ACCEPT_ON_DATA: std::time::Duration = std::time::Duration::from_secs(1);

/// A listener's caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections at once.
    pub total: usize,
    /// Connections at once of one key.
    pub per_key: usize,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its key holds its whole share, every connection of it busy.
    KeyFull,
    /// The listener is full, every connection busy, and no key holds two
    /// more than the new connection's.
    Full,
}

/// The connections a listener has admitted.
#[derive(Debug)]
pub struct Admission<K> {
    state: Mutex<State<K>>,
    limits: Limits,
}

#[derive(Debug)]
struct State<K> {
    per_key: HashMap<K, usize>,
    /// Every admitted connection, by admission order.
    open: BTreeMap<u64, Entry<K>>,
    next: u64,
}

#[derive(Debug)]
struct Entry<K> {
    key: K,
    /// Requests being answered (hyper answers one at a time).
    busy: u32,
    /// Cancelled when the connection is closed to make room.
    evicted: CancellationToken,
}

/// One admitted connection; gives its place back when dropped.
#[derive(Debug)]
pub struct Admitted<K: Copy + Eq + Hash> {
    id: u64,
    evicted: CancellationToken,
    admission: Arc<Admission<K>>,
}

impl<K: Copy + Eq + Hash> Admission<K> {
    #[must_use]
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                per_key: HashMap::new(),
                open: BTreeMap::new(),
                next: 0,
            }),
            limits,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        // Every critical section leaves the state consistent: a panic in
        // one (none is expected) does not make it unusable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a connection of `key`, idle, closing another to make room
    /// as the module says.
    ///
    /// # Errors
    /// No room could be made.
    pub fn take(self: &Arc<Self>, key: K) -> Result<Admitted<K>, Refused> {
        let mut s = self.lock();
        if s.held(key) >= self.limits.per_key {
            let own = s.oldest_idle(Some(key)).ok_or(Refused::KeyFull)?;
            s.evict(own);
        }
        if s.open.len() >= self.limits.total {
            let victim = s
                .oldest_idle(None)
                .or_else(|| s.oldest_of_the_largest(key))
                .ok_or(Refused::Full)?;
            s.evict(victim);
        }
        *s.per_key.entry(key).or_insert(0) += 1;
        let id = s.next;
        s.next += 1;
        let evicted = CancellationToken::new();
        s.open.insert(
            id,
            Entry {
                key,
                busy: 0,
                evicted: evicted.clone(),
            },
        );
        Ok(Admitted {
            id,
            evicted,
            admission: Arc::clone(self),
        })
    }
}

impl<K: Copy + Eq + Hash> State<K> {
    fn held(&self, key: K) -> usize {
        self.per_key.get(&key).copied().unwrap_or(0)
    }

    fn oldest_idle(&self, of: Option<K>) -> Option<u64> {
        self.open
            .iter()
            .find(|(_, e)| e.busy == 0 && of.is_none_or(|k| e.key == k))
            .map(|(&id, _)| id)
    }

    /// The oldest connection of the keys holding the most, when they hold
    /// at least two more than `newcomer` does.
    fn oldest_of_the_largest(&self, newcomer: K) -> Option<u64> {
        let most = self.per_key.values().copied().max()?;
        if most < self.held(newcomer) + 2 {
            return None;
        }
        self.open
            .iter()
            .find(|(_, e)| self.held(e.key) == most)
            .map(|(&id, _)| id)
    }

    /// Closes connection `id`, giving its place back at once (its own drop
    /// then gives back nothing).
    fn evict(&mut self, id: u64) {
        if let Some(e) = self.open.remove(&id) {
            e.evicted.cancel();
            self.release(e.key);
        }
    }

    fn release(&mut self, key: K) {
        if let Some(n) = self.per_key.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.per_key.remove(&key);
            }
        }
    }
}

impl<K: Copy + Eq + Hash> Admitted<K> {
    /// Cancelled when the connection was closed to make room: its task
    /// ends it.
    #[must_use]
    pub fn evicted(&self) -> &CancellationToken {
        &self.evicted
    }

    /// A request is being answered: the connection is not closed for an
    /// idle one's sake until [`Self::idle`].
    pub fn busy(&self) {
        if let Some(e) = self.admission.lock().open.get_mut(&self.id) {
            e.busy += 1;
        }
    }

    /// The request marked by [`Self::busy`] is answered.
    pub fn idle(&self) {
        if let Some(e) = self.admission.lock().open.get_mut(&self.id) {
            e.busy = e.busy.saturating_sub(1);
        }
    }
}

impl<K: Copy + Eq + Hash> Drop for Admitted<K> {
    fn drop(&mut self) {
        let mut s = self.admission.lock();
        // An evicted connection was given back when it was evicted.
        if let Some(e) = s.open.remove(&self.id) {
            s.release(e.key);
        }
    }
}

/// For the listeners' tests: connects to `addr`, opens `idle` connections
/// from the same source that send nothing, and 100 ms later writes
/// `request` on the first. Accepted on its connect, that first connection
/// would by then be its source's oldest idle one, closed for newer ones
/// past a share smaller than `idle`. Returns it and the idle ones.
#[cfg(test)]
pub(crate) async fn sent_late_behind_idle(
    addr: std::net::SocketAddr,
    request: &[u8],
    idle: usize,
) -> (tokio::net::TcpStream, Vec<tokio::net::TcpStream>) {
    use tokio::io::AsyncWriteExt as _;
    let connect = || tokio::net::TcpStream::connect(addr);
    let mut asking = connect().await.expect("connect");
    let mut held = Vec::with_capacity(idle);
    for _ in 0..idle {
        held.push(connect().await.expect("idle connection"));
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    asking.write_all(request).await.expect("send");
    (asking, held)
}

#[cfg(test)]
mod tests;
