//! Something a task owns that must not be dropped unattended (the health
//! endpoint: dropped, its plumbing would stay behind with nobody to remove
//! it).
//!
//! A task is aborted when it outlasts the agent's stop deadline, and its
//! future is dropped wherever it was waiting, with everything it owned.
//! An [`Owned`] value dropped so is removed on a thread of its own, which
//! [`wait`] joins before the agent lets go of its pidfile. A value dropped
//! while its thread panics is left as it is: the restarted task restores
//! it. Work on such a value that a blocking thread carries on after its
//! task was aborted (a repair, the removal itself) is marked with
//! [`busy`], and [`wait`] waits for it too, and for the removal its end
//! may start.

use std::{
    ops::{Deref, DerefMut},
    sync::Mutex,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tracing::{error, warn};

/// What removes itself when dropped unattended.
pub trait Remove: Send + 'static {
    /// Removes it; `why` says what happened, for its log.
    fn remove(self, why: &str);
}

/// The removals under way.
static UNDER_WAY: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// Blocking work under way on a value that removes itself ([`busy`]).
static BUSY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Marks blocking work on an [`Owned`] value (or its removal) as under
/// way until the mark is dropped: [`wait`] waits for it. Drop the mark
/// after the value, so that a removal the value's drop starts is seen.
#[must_use = "the work is under way only while the mark is held"]
pub fn busy() -> Busy {
    BUSY.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Busy(())
}

/// Blocking work under way ([`busy`]).
#[derive(Debug)]
pub struct Busy(());

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A value that is removed if dropped before [`Owned::release`].
#[derive(Debug)]
pub struct Owned<T: Remove>(Option<T>);

impl<T: Remove> Owned<T> {
    pub const fn new(value: T) -> Self {
        Self(Some(value))
    }

    /// The value, no longer removed when dropped.
    ///
    /// # Panics
    ///
    /// Never: the value is held until it is released or dropped.
    pub fn release(mut self) -> T {
        self.0.take().expect("held until released or dropped")
    }
}

impl<T: Remove> Deref for Owned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("held until released or dropped")
    }
}

impl<T: Remove> DerefMut for Owned<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("held until released or dropped")
    }
}

impl<T: Remove> Drop for Owned<T> {
    fn drop(&mut self) {
        let Some(value) = self.0.take() else { return };
        if std::thread::panicking() {
            return;
        }
        // A thread of its own: the value may need a runtime of its own,
        // which a runtime's thread cannot start.
        let removal = std::thread::Builder::new()
            .name("health-reclaim".into())
            .spawn(move || value.remove("its task was stopped before it could remove it"));
        match (removal, UNDER_WAY.lock()) {
            (Ok(h), Ok(mut under_way)) => under_way.push(h),
            (Ok(_), Err(_)) => {}
            (Err(e), _) => error!("no thread to remove what a stopped task left: {e}"),
        }
    }
}

/// Waits, at most `patience`, for the removals and the blocking work
/// under way ([`busy`]), and the removals that work starts; how many
/// were still running when it gave up.
pub fn wait(patience: Duration) -> usize {
    let until = Instant::now() + patience;
    let mut left = 0;
    loop {
        // Read before the removals are taken: work that ended since had
        // registered the removal its end started (its mark drops last).
        let busy = BUSY.load(std::sync::atomic::Ordering::SeqCst);
        let under_way = UNDER_WAY
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        if under_way.is_empty() && busy == 0 {
            break;
        }
        for h in under_way {
            while !h.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            if h.is_finished() {
                let _ = h.join();
            } else {
                left += 1;
            }
        }
        if Instant::now() >= until {
            left += BUSY.load(std::sync::atomic::Ordering::SeqCst);
            break;
        }
        if busy > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    if left > 0 {
        warn!(
            left,
            "gave up waiting for the removal of what stopped tasks left"
        );
    }
    left
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// The tests share the removals under way.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    #[derive(Debug)]
    struct Plumbing(mpsc::Sender<&'static str>, &'static str);

    impl Remove for Plumbing {
        fn remove(self, _why: &str) {
            std::thread::sleep(Duration::from_millis(50));
            let _ = self.0.send(self.1);
        }
    }

    /// Aborts `task` once it has started, then [`wait`]s; what `wait` left.
    async fn abort_then_wait(task: tokio::task::JoinHandle<()>) -> usize {
        tokio::time::sleep(Duration::from_millis(20)).await;
        task.abort();
        assert!(task.await.is_err_and(|e| e.is_cancelled()));
        tokio::task::spawn_blocking(|| wait(Duration::from_secs(5)))
            .await
            .expect("joined")
    }

    /// A task aborted while it waits, owning the value: the value is
    /// removed, and `wait` returns once it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_value_left_by_an_aborted_task_is_removed() {
        let _one = ONE_AT_A_TIME.lock();
        let (tx, rx) = mpsc::channel();
        let owned = Owned::new(Plumbing(tx, "aborted"));
        let task = tokio::spawn(async move {
            let _held = owned;
            std::future::pending::<()>().await;
        });
        assert_eq!(abort_then_wait(task).await, 0);
        assert_eq!(rx.try_recv(), Ok("aborted"), "removed before wait returned");
    }

    /// A task aborted while a blocking thread works on its value: `wait`
    /// returns once that work has ended and the removal the value's drop
    /// started then has run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_carried_on_past_an_aborted_task_is_waited_for() {
        let _one = ONE_AT_A_TIME.lock();
        let (tx, rx) = mpsc::channel();
        let owned = Owned::new(Plumbing(tx, "repaired, then dropped"));
        let task = tokio::spawn(async move {
            let _ = tokio::task::spawn_blocking(move || {
                let mark = busy();
                std::thread::sleep(Duration::from_millis(200));
                (owned, mark)
            })
            .await;
        });
        assert_eq!(abort_then_wait(task).await, 0);
        assert_eq!(
            rx.try_recv(),
            Ok("repaired, then dropped"),
            "removed before wait returned"
        );
    }

    #[test]
    fn a_released_value_is_not_removed_nor_one_dropped_in_a_panic() {
        let _one = ONE_AT_A_TIME.lock();
        let (tx, rx) = mpsc::channel();
        let kept = Owned::new(Plumbing(tx.clone(), "released")).release();
        drop(kept);
        let panicked = std::thread::spawn(move || {
            let _held = Owned::new(Plumbing(tx, "panicked"));
            panic!("the task's work failed");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(wait(Duration::from_secs(1)), 0);
        assert!(rx.try_recv().is_err(), "nothing removed");
    }
}
