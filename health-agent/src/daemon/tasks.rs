//! The agent's tasks as the supervisor runs them: each factory builds its
//! component's `run(config, shutdown)` afresh for every (re)start.

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::{
    net::TcpListener,
    sync::{broadcast, watch},
};
use tracing::info;

use super::node_sync::NodeSync;
use crate::{
    api::server::{self, ApiState},
    datapath::{
        DatapathHandle,
        maintenance::{self, DatapathConfig},
    },
    endpoint::{
        SharedView,
        controller::{self, ControllerConfig},
    },
    membership::{discovery::NodeSource, published::Nodes},
    probe::{
        Prober, hello,
        scheduler::{self, First},
    },
    supervisor::{Restart, Supervisor, SupervisorError, task},
    sys::netlink::{NetlinkError, watch_links},
};

type Started = Result<bool, SupervisorError>;

/// The API on its unix socket (removed when the task ends).
pub(super) async fn api(
    sup: &mut Supervisor,
    socket: PathBuf,
    group: Option<String>,
    state: ApiState,
) -> Started {
    sup.start("api", Restart::WithinBudget, move |ctx| {
        let (state, socket, group) = (state.clone(), socket.clone(), group.clone());
        task(async move {
            let (bound_tx, bound) = tokio::sync::oneshot::channel();
            let served = api_thread(socket.clone(), group, state, ctx.shutdown, bound_tx)?;
            // The thread says when the socket is bound, before serving; a
            // socket it could not bind ends it with the error.
            if bound.await.is_ok() {
                info!(socket = %socket.display(), "API listening");
                ctx.ready.done();
            }
            served.await.map_err(|_| api_thread_gone(&socket))?
        })
    })
    .await
}

/// Serves the API from runtimes of its own, so that answers do not queue
/// behind thousands of probe futures on the agent's workers (a status
/// request during a 5,000-peer round): the kernel shares the CPUs between
/// the threads. A thread of its own accepts and answers the small
/// questions (the summary, one node), which so never wait behind the
/// whole status; the bulk lane's [`API_WORKERS`] threads answer the rest.
/// At 10,000 peers, with 8 clients pulling the whole status beside one
/// asking small questions, the small ones' p99 went from 2.1-2.4 ms to
/// 0.6-0.8 ms, the whole status's from 3.3-3.7 to 4.5-5.0 ms (the small
/// client, answered sooner, asked 3.6 to 6.4 times as often)
/// (`cargo xtask bench round --peers 10000 --rounds 4 --interval 5s`).
/// Every thread runs at a lower priority ([`API_NICE`]): when clients keep
/// the API busy, probing (whose timing is the product) still gets the CPU
/// first. A synchronous `PUT /v1/status/probe` runs its round in the bulk
/// lane.
fn api_thread(
    socket: PathBuf,
    group: Option<String>,
    state: ApiState,
    shutdown: tokio_util::sync::CancellationToken,
    bound: tokio::sync::oneshot::Sender<()>,
) -> Result<tokio::sync::oneshot::Receiver<Result<(), server::ServerError>>, server::ServerError> {
    let path = socket.clone();
    let unbuilt = {
        let path = path.clone();
        move |source| server::ServerError::Io {
            op: "building the API's runtimes for",
            path,
            source,
        }
    };
    in_lanes(
        "api",
        move |bulk| async move {
            let (guard, listener) = server::bind(&socket, group.as_deref())?;
            let _ = bound.send(());
            let served = server::serve_in_lanes(listener, state, shutdown, bulk).await;
            drop(guard);
            served
        },
        move |e| Err(unbuilt(e)),
    )
    .map_err(|source| server::ServerError::Io {
        op: "starting the API thread for",
        path,
        source,
    })
}

/// Runs `serve` on a thread of its own named `name`, in a runtime of its
/// own, with a second runtime of [`API_WORKERS`] threads whose handle
/// `serve` gets: its bulk lane; every thread at [`API_NICE`]. What `serve`
/// returns comes back through the receiver, or what `unbuilt` makes of the
/// error when a runtime cannot be built; a thread that panicked drops it
/// unsent. The runtimes are built and dropped on that thread, never in
/// the caller's async context.
fn in_lanes<T, F, Fut>(
    name: &'static str,
    serve: F,
    unbuilt: impl FnOnce(std::io::Error) -> T + Send + 'static,
) -> std::io::Result<tokio::sync::oneshot::Receiver<T>>
where
    T: Send + 'static,
    F: FnOnce(tokio::runtime::Handle) -> Fut + Send + 'static,
    Fut: Future<Output = T>,
{
    at_api_priority(name, move || match lanes(name) {
        Ok((front, bulk)) => {
            let served = front.block_on(serve(bulk.handle().clone()));
            // The front waited for every connection of both lanes: what
            // the bulk lane still runs, a handler spawned.
            bulk.shutdown_timeout(Duration::from_secs(1));
            served
        }
        Err(e) => unbuilt(e),
    })
}

/// The front runtime (on the calling thread, its blocking threads named
/// `name`) and the bulk lane's ([`API_WORKERS`] threads, `name-bulk`),
/// every thread at [`API_NICE`].
fn lanes(name: &str) -> std::io::Result<(tokio::runtime::Runtime, tokio::runtime::Runtime)> {
    let bulk = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(API_WORKERS)
        .thread_name(format!("{name}-bulk"))
        .on_thread_start(lower_priority)
        .enable_all()
        .build()?;
    let front = tokio::runtime::Builder::new_current_thread()
        .thread_name(name)
        .on_thread_start(lower_priority)
        .enable_all()
        .build()?;
    Ok((front, bulk))
}

/// Runs `serve` on a thread of its own named `name`, in a runtime of its
/// own on that thread, at [`API_NICE`]: where the metrics listener
/// answers, never queued behind probes. What `serve` returns comes back
/// through the receiver, or what `unbuilt` makes of the error when the
/// runtime cannot be built; a thread that panicked drops it unsent.
fn apart<T, F, Fut>(
    name: &'static str,
    serve: F,
    unbuilt: impl FnOnce(std::io::Error) -> T + Send + 'static,
) -> std::io::Result<tokio::sync::oneshot::Receiver<T>>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
{
    at_api_priority(
        name,
        move || match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(serve()),
            Err(e) => unbuilt(e),
        },
    )
}

/// Runs `body` on a thread of its own named `name`, at [`API_NICE`];
/// what it returns comes back through the receiver (a thread that
/// panicked drops it unsent).
fn at_api_priority<T: Send + 'static>(
    name: &'static str,
    body: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<tokio::sync::oneshot::Receiver<T>> {
    let (done_tx, done) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            lower_priority();
            let _ = done_tx.send(body());
        })?;
    Ok(done)
}

/// The API runtime's worker threads. With 8 clients pulling the status
/// through a 5,000-peer first round, 2 gave a p99 of 3.75-5.00 ms in six
/// runs, 1 gave 3.41-6.34 ms (`cargo xtask bench round --peers 5000`).
const API_WORKERS: usize = 2;

/// The nice value of the API's threads (the agent's others keep 0). At
/// 5,000 peers with 8 clients pulling the status through the first round,
/// 5 gave a p99 of 4.0-4.1 ms and a first round of 1.25-1.26 s; 10 gave
/// 5.2-6.2 ms (the API starved) and 0 gave 4.6-5.3 ms and 1.28-1.40 s (the
/// clients took the round's CPU) (`cargo xtask bench round --peers 5000`).
pub(super) const API_NICE: libc::c_int = 5;

/// Gives the calling thread [`API_NICE`] (the nice value is per thread on
/// Linux); a failure only costs the preference, and is logged.
fn lower_priority() {
    // SAFETY: plain syscalls on the calling thread.
    let rc = unsafe {
        let tid = libc::syscall(libc::SYS_gettid);
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::id_t::try_from(tid).unwrap_or(0),
            API_NICE,
        )
    };
    if rc != 0 {
        tracing::debug!(
            "lowering the API thread's priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn api_thread_gone(socket: &std::path::Path) -> server::ServerError {
    server::ServerError::Io {
        op: "the API thread stopped while serving",
        path: socket.to_owned(),
        source: std::io::Error::other("the API thread panicked"),
    }
}

/// The metrics listener on `addr`, from a thread and runtime of its own at
/// the API's priority (a scrape or the page never queues behind probes).
pub(super) async fn web(
    sup: &mut Supervisor,
    addr: std::net::SocketAddr,
    router: axum::Router,
) -> Started {
    sup.start("web", Restart::WithinBudget, move |ctx| {
        let router = router.clone();
        task(async move {
            let listener = crate::web::listen(addr)
                .map_err(|source| crate::web::WebError::Bind { addr, source })?;
            let bound = listener.local_addr().unwrap_or(addr);
            let shutdown = ctx.shutdown.clone();
            let done = apart(
                "web",
                move || async move {
                    match TcpListener::from_std(listener) {
                        Ok(l) => crate::web::serve(l, router, shutdown).await,
                        Err(source) => Err(crate::web::WebError::Serve { addr, source }),
                    }
                },
                move |source| Err(crate::web::WebError::Serve { addr, source }),
            )
            .map_err(|source| crate::web::WebError::Serve { addr, source })?;
            info!(addr = %bound, "metrics and connectivity page listening");
            ctx.ready.done();
            done.await.map_err(|_| crate::web::WebError::Serve {
                addr,
                source: std::io::Error::other("the web thread panicked"),
            })?
        })
    })
    .await
}

/// The cluster view (with etcd): summaries published and watched.
pub(super) async fn cluster_view(
    sup: &mut Supervisor,
    view: super::cluster_view::ClusterViewTask,
) -> Started {
    sup.start("cluster-view", Restart::WithinBudget, move |ctx| {
        let view = view.clone();
        task(async move {
            ctx.ready.done();
            Box::pin(view.run(ctx.shutdown)).await;
            Ok::<_, std::convert::Infallible>(())
        })
    })
    .await
}

/// Link events of the node's namespace, for the endpoint and the routes.
pub(super) async fn links(sup: &mut Supervisor, links: broadcast::Sender<()>) -> Started {
    sup.start("links", Restart::WithinBudget, move |ctx| {
        let links = links.clone();
        task(async move {
            ctx.ready.done();
            ctx.shutdown
                .run_until_cancelled(watch_links(links))
                .await
                .transpose()?;
            Ok::<_, NetlinkError>(())
        })
    })
    .await
}

/// The node's datapath: pins, configuration, masquerade, maintenance,
/// through the kernel object's owner.
pub(super) async fn datapath(
    sup: &mut Supervisor,
    cfg: DatapathConfig,
    kernel: DatapathHandle,
) -> Started {
    sup.start("datapath", Restart::WithinBudget, move |ctx| {
        task(maintenance::run(
            cfg.clone(),
            kernel.clone(),
            ctx.problem,
            ctx.shutdown,
            move || {
                ctx.ready.done();
            },
        ))
    })
    .await
}

/// The health endpoint and its controller.
pub(super) async fn endpoint(
    sup: &mut Supervisor,
    cfg: ControllerConfig,
    kernel: DatapathHandle,
    view: SharedView,
    links: broadcast::Sender<()>,
) -> Started {
    sup.start("endpoint", Restart::WithinBudget, move |ctx| {
        let (cfg, view, events) = (cfg.clone(), view.clone(), links.subscribe());
        task(controller::run(
            cfg,
            kernel.clone(),
            view,
            events,
            ctx.problem,
            ctx.shutdown,
            move || {
                ctx.ready.done();
            },
        ))
    })
    .await
}

/// The node's own :4240 hello server.
pub(super) async fn hello(sup: &mut Supervisor, port: u16, node: &str) -> Started {
    let node: Arc<str> = Arc::from(node);
    sup.start("hello", Restart::WithinBudget, move |ctx| {
        let node = node.clone();
        task(async move {
            let listener = hello::listen(port)
                .and_then(TcpListener::from_std)
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("binding the hello server on port {port}: {e}"),
                    )
                })?;
            ctx.ready.done();
            hello::serve(listener, ctx.shutdown, &node).await;
            Ok::<_, std::io::Error>(())
        })
    })
    .await
}

/// Node discovery.
pub(super) async fn discovery(sup: &mut Supervisor, source: NodeSource, nodes: Nodes) -> Started {
    sup.start("discovery", Restart::WithinBudget, move |ctx| {
        let (source, nodes) = (source.clone(), nodes.clone());
        task(async move {
            ctx.ready.done();
            source.run(nodes, ctx.shutdown).await;
            Ok::<_, std::convert::Infallible>(())
        })
    })
    .await
}

/// Node-set changes applied to the prober and the routes.
pub(super) async fn sync(
    sup: &mut Supervisor,
    sync: NodeSync,
    nodes: Nodes,
    links: broadcast::Sender<()>,
) -> Started {
    sup.start("sync", Restart::WithinBudget, move |ctx| {
        let sync = sync.clone();
        let (nodes, links) = (nodes.subscribe(), links.subscribe());
        task(async move {
            ctx.ready.done();
            sync.run(nodes, links, ctx.shutdown).await;
            Ok::<_, std::convert::Infallible>(())
        })
    })
    .await
}

/// The probe rounds, by the prober in service: when a reload replaces it,
/// the round under way is dropped (its probes' tasks aborted) and the new
/// one's rounds start one interval later, its liveness echoes and the
/// rounds of nodes that joined going on meanwhile (before any round, the
/// first round goes when it was due).
pub(super) async fn probe(
    sup: &mut Supervisor,
    probers: watch::Receiver<Arc<Prober>>,
    initial_delay: Duration,
) -> Started {
    sup.start("probe", Restart::WithinBudget, move |ctx| {
        let mut probers = probers.clone();
        // A restarted loop probes at once: the first delay is for start-up.
        let delay = if ctx.restarts == 0 {
            initial_delay
        } else {
            Duration::ZERO
        };
        let began = tokio::time::Instant::now();
        let mut first = First::After(delay);
        task(async move {
            ctx.ready.done();
            loop {
                let prober = probers.borrow_and_update().clone();
                let rounds = scheduler::run(prober, first, ctx.shutdown.clone());
                tokio::select! {
                    () = rounds => break,
                    changed = probers.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        // Before any round (a reload in the initial
                        // delay, or during the first round) nothing is
                        // resumed: the first round goes when it was due.
                        let prober = probers.borrow().clone();
                        first = if prober.status_summary().round.is_some() {
                            First::Resumed(prober.config().interval)
                        } else {
                            First::After(delay.saturating_sub(began.elapsed()))
                        };
                    }
                }
            }
            Ok::<_, std::convert::Infallible>(())
        })
    })
    .await
}
