//! Work on the blocking pool that owns something which must not be
//! dropped unattended (the health endpoint: dropped, its plumbing would
//! stay behind with nobody to remove it).
//!
//! A future awaiting `spawn_blocking` can be dropped (a task aborted past
//! its shutdown deadline) while the closure runs on: whatever the closure
//! returns is then dropped with the task's output. [`handoff`] gives the
//! value back to the awaiting future when it is still there, and to an
//! `orphaned` closure, on the blocking thread, when it is not.

use tokio::sync::oneshot;

/// The work panicked: its value went with it. The panic's text.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Panicked(pub String);

/// Runs `work(value)` on the blocking pool and returns the value with the
/// work's result; if the awaiting future was dropped meanwhile, passes
/// them to `orphaned` instead, on the blocking thread.
pub async fn handoff<V, R>(
    value: V,
    work: impl FnOnce(&mut V) -> R + Send + 'static,
    orphaned: impl FnOnce(V, R) + Send + 'static,
) -> Result<(V, R), Panicked>
where
    V: Send + 'static,
    R: Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let handle = tokio::task::spawn_blocking(move || {
        let mut value = value;
        let result = work(&mut value);
        if let Err((value, result)) = tx.send((value, result)) {
            orphaned(value, result);
        }
    });
    match rx.await {
        Ok(done) => Ok(done),
        // The sender went without sending: the work panicked.
        Err(_) => Err(Panicked(match handle.await {
            Err(e) => e.to_string(),
            Ok(()) => "the work ended without its value".into(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        },
        time::Duration,
    };

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_value_comes_back_to_a_future_that_waited() {
        let orphaned = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&orphaned);
        let (value, sum) = handoff(
            vec![1, 2, 3],
            |v| v.iter().sum::<i32>(),
            move |_, _| flag.store(true, Ordering::SeqCst),
        )
        .await
        .expect("no panic");
        assert_eq!((value, sum), (vec![1, 2, 3], 6));
        assert!(!orphaned.load(Ordering::SeqCst));
    }

    /// A future dropped while the work runs (its task aborted): the value
    /// goes to `orphaned`, not to the floor.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_value_whose_future_was_dropped_goes_to_orphaned() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let task = tokio::spawn(handoff(
            String::from("endpoint"),
            |_| std::thread::sleep(Duration::from_millis(300)),
            move |value, ()| {
                let _ = done_tx.send(value);
            },
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        task.abort();
        assert!(task.await.is_err_and(|e| e.is_cancelled()));
        let got = tokio::task::spawn_blocking(move || done_rx.recv_timeout(Duration::from_secs(5)))
            .await
            .expect("joined");
        assert_eq!(got.as_deref(), Ok("endpoint"), "handed to orphaned");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_in_the_work_is_reported_with_its_text() {
        let got = handoff(
            0u8,
            |_| -> u8 { panic!("repair blew up") },
            |_, _| unreachable!("not orphaned"),
        )
        .await;
        assert!(
            got.as_ref()
                .is_err_and(|e| e.0.contains("panicked") || e.0.contains("repair blew up")),
            "{got:?}"
        );
    }
}
