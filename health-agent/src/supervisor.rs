//! The supervisor: runs each long-lived component as a named task, notices
//! one that ends, fails or panics (logged, shown in `/v1/healthz`), restarts
//! it with backoff within a budget or stops the agent with an error, and on
//! shutdown stops the tasks in the reverse of their start order, each
//! cooperatively (its own cancellation token) within one deadline.
//!
//! A task is a factory called for each (re)start with a [`TaskContext`]:
//! the token that asks it to stop, and a [`Ready`] to fire once it serves.
//! [`Supervisor::start`] waits for that, so the agent starts in order and a
//! component that cannot start fails the start-up with its own error, after
//! the components already started are stopped (and have removed what they
//! made).

use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use futures::FutureExt as _;
use serde::{Deserialize, Serialize};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::util::timefmt::now_ms;

/// What a task returns when it fails.
pub type TaskError = Box<dyn std::error::Error + Send + Sync>;

/// A task's future.
pub type TaskFuture = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;

/// What to do when a task ends while the agent is not stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// Restart it, with backoff, within the supervisor's budget; past the
    /// budget the agent stops with an error.
    WithinBudget,
    /// Stop the agent with an error at once.
    Never,
}

/// Restart budget and shutdown deadline.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// At most this many restarts of one task within `window`...
    pub max_restarts: u32,
    pub window: Duration,
    /// First wait before a restart; doubled on each restart in the window.
    pub backoff: Duration,
    /// How long a task counts as degraded after it failed.
    pub degraded_for: Duration,
    /// All tasks must have stopped within this after shutdown begins; the
    /// rest are aborted (and named in the log).
    pub stop_deadline: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            max_restarts: 5,
            window: Duration::from_secs(60),
            backoff: Duration::from_millis(200),
            degraded_for: Duration::from_secs(60),
            stop_deadline: Duration::from_millis(1500),
        }
    }
}

/// Fired by a task once it serves.
pub struct Ready(Arc<Mutex<Option<oneshot::Sender<()>>>>);

impl Ready {
    /// The task is up; later calls do nothing.
    pub fn done(&self) {
        if let Some(tx) = self.0.lock().ok().and_then(|mut s| s.take()) {
            let _ = tx.send(());
        }
    }
}

/// What a task gets at each (re)start.
pub struct TaskContext {
    /// Cancelled when the task must stop.
    pub shutdown: CancellationToken,
    pub ready: Ready,
    /// 0 at the first start, then the number of restarts so far.
    pub restarts: u32,
    /// Where the task says what keeps it from doing all its work while it
    /// goes on running (cleared by the task once it is mended).
    pub problem: Problem,
}

/// A running task's own word on what it cannot do now (a state file it
/// cannot write, pins it cannot restore): shown in `/v1/healthz`, and the
/// agent reads as degraded while it stands.
#[derive(Debug, Clone)]
pub struct Problem {
    health: Health,
    name: &'static str,
}

impl Problem {
    /// Says what is wrong (`None`: nothing any more). The first report
    /// of a problem and its end are logged; a repeat of the same words is
    /// not.
    pub fn set(&self, problem: Option<String>) {
        self.health.update(self.name, |e| {
            if e.problem == problem {
                return;
            }
            match (&e.problem, &problem) {
                (_, Some(p)) => warn!(task = self.name, "degraded: {p}"),
                (Some(_), None) => info!(task = self.name, "no longer degraded"),
                (None, None) => {}
            }
            e.problem = problem;
        });
    }
}

/// One task as `/v1/healthz` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStatus {
    pub name: String,
    pub state: TaskState,
    pub restarts: u32,
    /// Why it last ended, when it did.
    pub last_error: Option<String>,
    /// Epoch milliseconds of that end.
    pub last_failure_ms: Option<u64>,
    /// What the running task says it cannot do now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Failed within the degraded window (or not running), or reporting a
    /// problem.
    pub degraded: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Starting,
    Running,
    /// Ended and waiting for its restart.
    Restarting,
    /// Ended for good: the agent is stopping.
    Failed,
    Stopped,
}

#[derive(Debug, Clone)]
struct Entry {
    state: TaskState,
    restarts: u32,
    last_error: Option<String>,
    last_failure: Option<(Instant, u64)>,
    problem: Option<String>,
}

/// The tasks' states, shared with the API.
#[derive(Debug, Clone, Default)]
pub struct Health(Arc<RwLock<BTreeMap<&'static str, Entry>>>);

impl Health {
    fn update(&self, name: &'static str, f: impl FnOnce(&mut Entry)) {
        if let Ok(mut all) = self.0.write() {
            let e = all.entry(name).or_insert(Entry {
                state: TaskState::Starting,
                restarts: 0,
                last_error: None,
                last_failure: None,
                problem: None,
            });
            f(e);
        }
    }

    /// Every task, in name order; `degraded_for` decides how long a
    /// failure keeps a task degraded.
    #[must_use]
    pub fn tasks(&self, degraded_for: Duration) -> Vec<TaskStatus> {
        let Ok(all) = self.0.read() else {
            return Vec::new();
        };
        all.iter()
            .map(|(name, e)| TaskStatus {
                name: (*name).to_owned(),
                state: e.state,
                restarts: e.restarts,
                last_error: e.last_error.clone(),
                last_failure_ms: e.last_failure.map(|(_, ms)| ms),
                problem: e.problem.clone(),
                degraded: !matches!(e.state, TaskState::Running | TaskState::Stopped)
                    || e.problem.is_some()
                    || e.last_failure
                        .is_some_and(|(at, _)| at.elapsed() < degraded_for),
            })
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("{task} could not start: {error}")]
    Start { task: &'static str, error: String },
    #[error("{task} failed and is not restarted (restarted {restarts} times): {error}")]
    Failed {
        task: &'static str,
        restarts: u32,
        error: String,
    },
}

struct Running {
    name: &'static str,
    token: CancellationToken,
    handle: JoinHandle<()>,
}

/// Runs the agent's tasks.
pub struct Supervisor {
    policy: Policy,
    health: Health,
    /// Cancelled by whoever decides the agent stops (a signal).
    stop: CancellationToken,
    tasks: Vec<Running>,
    fatal_tx: mpsc::UnboundedSender<SupervisorError>,
    fatal_rx: mpsc::UnboundedReceiver<SupervisorError>,
}

impl Supervisor {
    /// A supervisor that stops when `stop` is cancelled.
    #[must_use]
    pub fn new(policy: Policy, health: Health, stop: CancellationToken) -> Self {
        let (fatal_tx, fatal_rx) = mpsc::unbounded_channel();
        Self {
            policy,
            health,
            stop,
            tasks: Vec::new(),
            fatal_tx,
            fatal_rx,
        }
    }

    /// Starts task `name` and waits until it is ready. If it ends first,
    /// or the agent is asked to stop first, the tasks already started are
    /// stopped: `Err` with the task's error, or `Ok(false)` for a stop.
    pub async fn start<F>(
        &mut self,
        name: &'static str,
        restart: Restart,
        factory: F,
    ) -> Result<bool, SupervisorError>
    where
        F: FnMut(TaskContext) -> TaskFuture + Send + 'static,
    {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (first_tx, first_rx) = oneshot::channel();
        let token = CancellationToken::new();
        let runner = Runner {
            name,
            restart,
            policy: self.policy,
            health: self.health.clone(),
            token: token.clone(),
            fatal: self.fatal_tx.clone(),
        };
        self.health.update(name, |e| e.state = TaskState::Starting);
        let handle = tokio::spawn(runner.run(factory, ready_tx, first_tx));
        self.tasks.push(Running {
            name,
            token,
            handle,
        });
        let ended = |r: Result<String, oneshot::error::RecvError>| {
            r.unwrap_or_else(|_| "ended before it was ready".to_owned())
        };
        let (mut ready_rx, mut first_rx) = (ready_rx, first_rx);
        let outcome = tokio::select! {
            r = &mut first_rx => Err(ended(r)),
            r = &mut ready_rx => match r {
                Ok(()) => Ok(()),
                // The runner drops the ready sender when the task ends
                // before it was ready: the reason follows on `first_rx`.
                Err(_) => Err(ended(first_rx.await)),
            },
            () = self.stop.cancelled() => {
                info!(task = name, "stop requested during start-up");
                self.stop_all().await;
                return Ok(false);
            }
        };
        match outcome {
            Ok(()) => Ok(true),
            Err(error) => {
                error!(task = name, "could not start: {error}");
                self.stop_all().await;
                Err(SupervisorError::Start { task: name, error })
            }
        }
    }

    /// Runs until the agent is asked to stop (then stops every task: `Ok`)
    /// or a task fails for good (then stops the others: `Err`).
    pub async fn run(mut self) -> Result<(), SupervisorError> {
        let result = tokio::select! {
            () = self.stop.cancelled() => Ok(()),
            Some(fatal) = self.fatal_rx.recv() => Err(fatal),
        };
        if let Err(e) = &result {
            error!("{e}; stopping the agent");
        }
        self.stop_all().await;
        result
    }

    /// Stops every task started so far (the agent gives up during its
    /// start, after some tasks run).
    pub async fn stop(mut self) {
        self.stop_all().await;
    }

    /// Stops the tasks in the reverse of their start order, each
    /// cooperatively, all within the policy's deadline.
    async fn stop_all(&mut self) {
        let deadline = tokio::time::Instant::now() + self.policy.stop_deadline;
        while let Some(task) = self.tasks.pop() {
            task.token.cancel();
            let mut handle = task.handle;
            if tokio::time::timeout_at(deadline, &mut handle)
                .await
                .is_err()
            {
                warn!(
                    task = task.name,
                    "did not stop within the shutdown deadline: aborted"
                );
                handle.abort();
                let _ = handle.await;
            }
            self.health.update(task.name, |e| {
                if e.state != TaskState::Failed {
                    e.state = TaskState::Stopped;
                }
            });
        }
    }
}

/// Runs one task, restarting it as its policy says.
struct Runner {
    name: &'static str,
    restart: Restart,
    policy: Policy,
    health: Health,
    token: CancellationToken,
    fatal: mpsc::UnboundedSender<SupervisorError>,
}

impl Runner {
    async fn run<F>(
        self,
        mut factory: F,
        ready_tx: oneshot::Sender<()>,
        first_tx: oneshot::Sender<String>,
    ) where
        F: FnMut(TaskContext) -> TaskFuture + Send + 'static,
    {
        let ready_slot = Arc::new(Mutex::new(Some(ready_tx)));
        let mut first_tx = Some(first_tx);
        let mut restarts = 0u32;
        let mut recent: Vec<Instant> = Vec::new();
        loop {
            let health = self.health.clone();
            let name = self.name;
            // Marks the task running when it reports ready (after a
            // restart nobody waits for that, but the state still follows).
            let (relay_tx, relay_rx) = oneshot::channel::<()>();
            let slot = ready_slot.clone();
            tokio::spawn(async move {
                if relay_rx.await.is_ok() {
                    health.update(name, |e| e.state = TaskState::Running);
                    if let Some(tx) = slot.lock().ok().and_then(|mut s| s.take()) {
                        let _ = tx.send(());
                    }
                }
            });
            let ctx = TaskContext {
                shutdown: self.token.child_token(),
                ready: Ready(Arc::new(Mutex::new(Some(relay_tx)))),
                restarts,
                problem: Problem {
                    health: self.health.clone(),
                    name: self.name,
                },
            };
            let ended = std::panic::AssertUnwindSafe(factory(ctx))
                .catch_unwind()
                .await;
            if self.token.is_cancelled() {
                if let Ok(Err(e)) = &ended {
                    warn!(task = self.name, "ended with an error while stopping: {e}");
                }
                return;
            }
            let error = match ended {
                Ok(Ok(())) => "ended while the agent was running".to_owned(),
                Ok(Err(e)) => error_chain(&*e),
                Err(panic) => format!("panicked: {}", panic_text(&*panic)),
            };
            let now = Instant::now();
            self.health.update(self.name, |e| {
                e.last_error = Some(error.clone());
                e.last_failure = Some((now, now_ms()));
            });
            if let Some(tx) = first_tx.take()
                && ready_slot.lock().is_ok_and(|s| s.is_some())
            {
                // It never got ready: the start-up fails with this error.
                self.health
                    .update(self.name, |e| e.state = TaskState::Failed);
                let _ = tx.send(error);
                return;
            }
            first_tx = None;
            recent.retain(|t| now.duration_since(*t) < self.policy.window);
            if self.restart == Restart::Never
                || u32::try_from(recent.len()).unwrap_or(u32::MAX) >= self.policy.max_restarts
            {
                self.health
                    .update(self.name, |e| e.state = TaskState::Failed);
                let _ = self.fatal.send(SupervisorError::Failed {
                    task: self.name,
                    restarts,
                    error,
                });
                return;
            }
            let wait = self.policy.backoff
                * 2u32.saturating_pow(u32::try_from(recent.len()).unwrap_or(16).min(16));
            recent.push(now);
            restarts += 1;
            self.health.update(self.name, |e| {
                e.state = TaskState::Restarting;
                e.restarts = restarts;
            });
            error!(
                task = self.name,
                restarts,
                "task ended: {error}; restarting in {} ms",
                wait.as_millis()
            );
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.token.cancelled() => return,
            }
        }
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    crate::util::errors::chain(e)
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// Boxes a task's future (the factories' return type).
pub fn task<Fut, E>(fut: Fut) -> TaskFuture
where
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<TaskError>,
{
    Box::pin(async move { fut.await.map_err(Into::into) })
}

#[cfg(test)]
mod tests;
