//! The API's connections by user (the client's `SO_PEERCRED`): a user
//! other than root holds at most [`PER_USER`] at once, and all of them
//! together leave [`ROOT_RESERVED`] of the API's connections to root. A
//! member of the socket's group holding connections open, or never
//! reading its answers, then locks neither the other members nor root
//! out, and holds at most its share of the kernel memory the answers
//! queued for it take.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

/// Connections one user other than root holds at once: a `status --watch`
/// holds one for as long as it runs, the other commands one a request.
pub const PER_USER: usize = 32;
/// Connections kept for root, whatever the other users hold.
pub const ROOT_RESERVED: usize = 32;

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The user (`None`: one the kernel did not name) holds its share.
    User(Option<u32>),
    /// The users other than root together hold theirs.
    Users,
}

impl Full {
    /// The 503's text.
    #[must_use]
    pub fn reason(self, max_connections: usize) -> String {
        match self {
            Self::User(Some(uid)) => format!(
                "user {uid} holds {PER_USER} connections to the agent's API, the most one user \
                 other than root may: close some and try again"
            ),
            Self::User(None) => format!(
                "clients the kernel names no user of hold {PER_USER} connections to the agent's \
                 API, their most: try again"
            ),
            Self::Users => format!(
                "users other than root hold {} connections to the agent's API, their most ({} \
                 are kept for root): try again",
                max_connections.saturating_sub(ROOT_RESERVED),
                ROOT_RESERVED
            ),
        }
    }
}

/// Connections open by user, other than root's.
#[derive(Debug)]
pub struct Users {
    open: Mutex<Open>,
    /// What the users other than root may hold together.
    shared: usize,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    /// By user ID; `u32::MAX` for clients of no known user.
    by_user: HashMap<u32, usize>,
}

/// A connection's place in its user's share, given back when dropped
/// (root's hold none).
#[derive(Debug)]
pub struct UserSlot {
    users: Arc<Users>,
    uid: u32,
}

impl Users {
    /// For an API of `max_connections`.
    #[must_use]
    pub fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            open: Mutex::new(Open::default()),
            shared: max_connections.saturating_sub(ROOT_RESERVED),
        })
    }

    /// A place for one more connection of user `uid` (`None`: the kernel
    /// named none); root's are not counted (`Ok(None)`).
    ///
    /// # Errors
    /// The share the connection would pass.
    pub fn take(self: &Arc<Self>, uid: Option<u32>) -> Result<Option<UserSlot>, Full> {
        if uid == Some(0) {
            return Ok(None);
        }
        let key = uid.unwrap_or(u32::MAX);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.by_user.get(&key).copied().unwrap_or(0) >= PER_USER {
            return Err(Full::User(uid));
        }
        if open.total >= self.shared {
            return Err(Full::Users);
        }
        open.total += 1;
        *open.by_user.entry(key).or_insert(0) += 1;
        Ok(Some(UserSlot {
            users: Arc::clone(self),
            uid: key,
        }))
    }
}

impl Drop for UserSlot {
    fn drop(&mut self) {
        let mut open = self
            .users
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.total -= 1;
        if let Some(n) = open.by_user.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                open.by_user.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_holds_its_share_and_the_users_leave_roots() {
        let users = Users::new(ROOT_RESERVED + 2 * PER_USER + 1);
        let mut held = Vec::new();
        for _ in 0..PER_USER {
            held.push(users.take(Some(1000)).expect("within the share"));
        }
        assert_eq!(users.take(Some(1000)).err(), Some(Full::User(Some(1000))));
        // Another user is not held back by the first.
        for _ in 0..PER_USER {
            held.push(users.take(Some(1001)).expect("its own share"));
        }
        held.push(users.take(None).expect("one more for the users"));
        // The users' shared part is full: root's part is kept.
        assert_eq!(users.take(Some(1002)).err(), Some(Full::Users));
        assert!(
            matches!(users.take(Some(0)), Ok(None)),
            "root is not counted"
        );
        // One given back: that user may take it again.
        held.remove(0);
        assert!(users.take(Some(1000)).is_ok_and(|s| s.is_some()));
        drop(held);
        let open = users.open.lock().expect("lock");
        assert_eq!((open.total, open.by_user.len()), (0, 0), "all given back");
    }

    #[test]
    fn refusals_say_whose_share_is_full() {
        assert!(
            Full::User(Some(1000))
                .reason(256)
                .contains("user 1000 holds 32")
        );
        assert!(Full::Users.reason(256).contains("hold 224"));
        assert!(Full::Users.reason(256).contains("32 are kept for root"));
    }
}
