use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

fn policy() -> Policy {
    Policy {
        max_restarts: 3,
        window: Duration::from_secs(60),
        backoff: Duration::from_millis(10),
        degraded_for: Duration::from_secs(60),
        stop_deadline: Duration::from_millis(500),
    }
}

/// A task that panics in its first `fail` runs, then serves until
/// stopped; counts its starts and records its clean stops.
fn flaky(
    fail: u32,
    starts: Arc<AtomicU32>,
    stopped: Arc<Mutex<Vec<&'static str>>>,
    name: &'static str,
) -> impl FnMut(TaskContext) -> TaskFuture + Send + 'static {
    move |ctx| {
        let n = starts.fetch_add(1, Ordering::SeqCst);
        let stopped = stopped.clone();
        task(async move {
            ctx.ready.done();
            assert!(n >= fail, "{name} run {n} fails on purpose");
            ctx.shutdown.cancelled().await;
            stopped.lock().expect("lock").push(name);
            Ok::<_, std::io::Error>(())
        })
    }
}

async fn wait_for(mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "condition not met in 5 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_panicking_task_is_shown_degraded_and_restarted() {
    let (health, stop) = (Health::default(), CancellationToken::new());
    let mut sup = Supervisor::new(policy(), health.clone(), stop.clone());
    let starts = Arc::new(AtomicU32::new(0));
    let stopped = Arc::new(Mutex::new(Vec::new()));
    // Ready, then it panics at once: after its start-up, so it restarts.
    let s = starts.clone();
    let mut first = true;
    let factory = move |ctx: TaskContext| {
        s.fetch_add(1, Ordering::SeqCst);
        let fail = std::mem::take(&mut first);
        task(async move {
            ctx.ready.done();
            tokio::task::yield_now().await;
            assert!(!fail, "the first run panics");
            ctx.shutdown.cancelled().await;
            Ok::<_, std::io::Error>(())
        })
    };
    assert!(
        sup.start("probe", Restart::WithinBudget, factory)
            .await
            .expect("starts")
    );
    let f = flaky(0, Arc::new(AtomicU32::new(0)), stopped.clone(), "api");
    assert!(
        sup.start("api", Restart::WithinBudget, f)
            .await
            .expect("starts")
    );
    let run = tokio::spawn(sup.run());
    wait_for(|| starts.load(Ordering::SeqCst) == 2).await;
    wait_for(|| {
        health
            .tasks(Duration::from_secs(60))
            .iter()
            .any(|t| t.name == "probe" && t.state == TaskState::Running)
    })
    .await;
    let probe = health
        .tasks(Duration::from_secs(60))
        .into_iter()
        .find(|t| t.name == "probe")
        .expect("listed");
    assert_eq!(probe.restarts, 1);
    assert!(probe.degraded, "it failed within the window: {probe:?}");
    let why = probe.last_error.expect("error kept");
    assert!(
        why.contains("panicked") && why.contains("the first run panics"),
        "{why}"
    );
    // With a short window the same task is no longer degraded.
    assert!(health.tasks(Duration::ZERO).iter().all(|t| !t.degraded));
    stop.cancel();
    run.await.expect("joined").expect("a stop is not an error");
    assert_eq!(*stopped.lock().expect("lock"), ["api"]);
}

#[tokio::test]
async fn a_running_task_that_reports_a_problem_is_degraded_until_it_clears_it() {
    let (health, stop) = (Health::default(), CancellationToken::new());
    let mut sup = Supervisor::new(policy(), health.clone(), stop.clone());
    let (say, said) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let (s, d) = (say.clone(), said.clone());
    let factory = move |ctx: TaskContext| {
        let (say, said) = (s.clone(), d.clone());
        task(async move {
            ctx.ready.done();
            ctx.problem.set(Some("state directory read-only".into()));
            said.notify_one();
            say.notified().await;
            ctx.problem.set(None);
            said.notify_one();
            ctx.shutdown.cancelled().await;
            Ok::<_, std::io::Error>(())
        })
    };
    sup.start("endpoint", Restart::WithinBudget, factory)
        .await
        .expect("starts");
    let run = tokio::spawn(sup.run());
    said.notified().await;
    let t = &health.tasks(Duration::from_secs(60))[0];
    assert_eq!(t.state, TaskState::Running);
    assert!(t.degraded, "{t:?}");
    assert_eq!(t.problem.as_deref(), Some("state directory read-only"));
    assert_eq!(t.restarts, 0, "a problem is no failure: {t:?}");
    say.notify_one();
    said.notified().await;
    let t = &health.tasks(Duration::from_secs(60))[0];
    assert!(!t.degraded && t.problem.is_none(), "{t:?}");
    stop.cancel();
    run.await.expect("joined").expect("a stop is not an error");
}

#[tokio::test]
async fn past_the_budget_the_supervisor_fails_naming_the_task() {
    let (health, stop) = (Health::default(), CancellationToken::new());
    let mut sup = Supervisor::new(policy(), health.clone(), stop);
    let stopped = Arc::new(Mutex::new(Vec::new()));
    let f = flaky(0, Arc::new(AtomicU32::new(0)), stopped.clone(), "api");
    sup.start("api", Restart::WithinBudget, f)
        .await
        .expect("starts");
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let failing = move |ctx: TaskContext| {
        r.fetch_add(1, Ordering::SeqCst);
        task(async move {
            ctx.ready.done();
            tokio::task::yield_now().await;
            Err::<(), _>(std::io::Error::other("uplink gone"))
        })
    };
    sup.start("datapath", Restart::WithinBudget, failing)
        .await
        .expect("starts");
    let err = tokio::time::timeout(Duration::from_secs(5), sup.run())
        .await
        .expect("gives up within the budget")
        .expect_err("a task failed for good");
    let text = err.to_string();
    assert!(
        text.contains("datapath") && text.contains("uplink gone") && text.contains("3 times"),
        "{text}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "first run and three restarts"
    );
    assert_eq!(
        *stopped.lock().expect("lock"),
        ["api"],
        "the others are stopped"
    );
    let datapath = health
        .tasks(Duration::from_secs(60))
        .into_iter()
        .find(|t| t.name == "datapath")
        .expect("listed");
    assert_eq!(datapath.state, TaskState::Failed);
}

#[tokio::test]
async fn a_task_that_cannot_start_fails_the_start_after_stopping_the_others() {
    let (health, stop) = (Health::default(), CancellationToken::new());
    let mut sup = Supervisor::new(policy(), health, stop);
    let stopped = Arc::new(Mutex::new(Vec::new()));
    for name in ["api", "datapath"] {
        let f = flaky(0, Arc::new(AtomicU32::new(0)), stopped.clone(), name);
        sup.start(name, Restart::WithinBudget, f)
            .await
            .expect("starts");
    }
    let err = sup
        .start("hello", Restart::WithinBudget, |_ctx| {
            task(async { Err::<(), _>(std::io::Error::other("port 4240 is in use")) })
        })
        .await
        .expect_err("cannot start");
    assert!(
        err.to_string()
            .contains("hello could not start: port 4240 is in use"),
        "{err}"
    );
    assert_eq!(
        *stopped.lock().expect("lock"),
        ["datapath", "api"],
        "stopped in the reverse of their start order"
    );
}

#[tokio::test]
async fn a_stop_during_start_up_stops_what_started() {
    let (health, stop) = (Health::default(), CancellationToken::new());
    let mut sup = Supervisor::new(policy(), health, stop.clone());
    let stopped = Arc::new(Mutex::new(Vec::new()));
    let f = flaky(0, Arc::new(AtomicU32::new(0)), stopped.clone(), "api");
    sup.start("api", Restart::WithinBudget, f)
        .await
        .expect("starts");
    let stop_now = stop.clone();
    let slow = move |ctx: TaskContext| {
        stop_now.cancel();
        task(async move {
            ctx.shutdown.cancelled().await;
            Ok::<_, std::io::Error>(())
        })
    };
    let started = sup.start("endpoint", Restart::WithinBudget, slow).await;
    assert!(!started.expect("a stop is not an error"), "not started");
    assert_eq!(*stopped.lock().expect("lock"), ["api"]);
}

#[tokio::test]
async fn a_task_that_ignores_the_stop_is_aborted_at_the_deadline() {
    let (health, stop) = (Health::default(), CancellationToken::new());
    let mut sup = Supervisor::new(policy(), health, stop.clone());
    sup.start("stubborn", Restart::WithinBudget, |ctx| {
        task(async move {
            ctx.ready.done();
            std::future::pending::<()>().await;
            Ok::<_, std::io::Error>(())
        })
    })
    .await
    .expect("starts");
    stop.cancel();
    let t = Instant::now();
    sup.run().await.expect("stopped");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(2),
        "aborted at the 500 ms deadline, took {took:?}"
    );
}
