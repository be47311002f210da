//! A node namespace with a real `health-agent daemon` running as its agent.
//!
//! The daemon process enters only the node's network namespace (as
//! `nsenter --net` does), so the endpoint namespace it creates under
//! /run/netns and its bpffs pins are visible to the test. Everything is
//! named uniquely and removed on drop.

use std::{
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    time::{Duration, Instant},
};

use health_agent::{
    datapath::remove_pins,
    endpoint::{EndpointView, lifecycle::State},
    sys::{netlink::in_netns, netns::Netns},
};

use crate::{names, require_root};

/// The node's own address, on its uplink veth.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
pub const HEALTH_CIDR: &str = "198.18.64.0/24";

pub struct AgentNode {
    pub node: Netns,
    pub endpoint_netns: String,
    pub dir: PathBuf,
    pub pins: PathBuf,
    daemon: Option<Child>,
}

impl AgentNode {
    #[must_use]
    pub fn new() -> Self {
        require_root();
        names::sweep_stale_netns();
        // Removed if a step fails before the node is `me`'s.
        let guard = crate::netns_guard::NetnsGuard::create(&names::unique("node"), "node");
        let dir = std::env::temp_dir().join(names::unique("agent"));
        fs::create_dir_all(&dir).expect("temp dir");
        let me = Self {
            endpoint_netns: names::unique("ep"),
            pins: Path::new(health_agent::datapath::BPFFS_ROOT).join(names::unique("pins")),
            node: guard.keep(),
            dir,
            daemon: None,
        };
        in_netns(Some(&me.node), |nl| async move {
            nl.set_up("lo").await?;
            nl.add_veth("uplink", "uplink-peer", None).await?;
            nl.add_address("uplink", NODE_IP, 24).await?;
            nl.set_up("uplink").await?;
            nl.set_up("uplink-peer").await
        })
        .expect("node uplink");
        me
    }

    #[must_use]
    pub fn socket(&self) -> PathBuf {
        socket_in(&self.dir)
    }

    #[must_use]
    pub fn pidfile(&self) -> PathBuf {
        pidfile_in(&self.dir)
    }

    #[must_use]
    pub fn endpoint_ns(&self) -> Netns {
        Netns::named(&self.endpoint_netns).expect("valid name")
    }

    /// Whether a socket of the namespace at the endpoint's name listens on
    /// port 4240 (0x1090, state LISTEN: 0A), either family.
    #[must_use]
    pub fn hello_listening(&self) -> bool {
        let tables = self.endpoint_ns().run(|| {
            ["tcp", "tcp6"].map(|t| {
                fs::read_to_string(format!("/proc/thread-self/net/{t}")).unwrap_or_default()
            })
        });
        tables.is_ok_and(|tables| {
            tables.iter().flat_map(|t| t.lines()).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(":1090") && cols[3] == "0A"
            })
        })
    }

    fn daemon_command(&self, cidr: &str, extra: &[&str]) -> Command {
        let mut cmd = daemon_command(
            &self.node,
            &self.dir,
            &self.pins,
            &self.endpoint_netns,
            cidr,
        );
        cmd.args(crate::agent_env_args())
            .args(extra)
            .env("RUST_LOG", "info");
        cmd
    }

    /// Starts the daemon in the background; its log goes to `daemon.log`.
    pub fn start(&mut self, extra: &[&str]) {
        self.start_with(extra, |_| {});
    }

    /// [`Self::start`], with `adjust` applied to the command (environment,
    /// credentials) before it is spawned.
    pub fn start_with(&mut self, extra: &[&str], adjust: impl FnOnce(&mut Command)) {
        self.start_from(HEALTH_CIDR, extra, adjust);
    }

    /// [`Self::start_with`], the endpoint's address from `cidr`.
    pub fn start_from(&mut self, cidr: &str, extra: &[&str], adjust: impl FnOnce(&mut Command)) {
        let log = fs::File::create(self.dir.join("daemon.log")).expect("log file");
        let mut cmd = self.daemon_command(cidr, extra);
        adjust(&mut cmd);
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn health-agent daemon");
        self.daemon = Some(child);
    }

    /// Runs the daemon with `cidr` (and `extra` flags) expecting it to exit
    /// by itself.
    #[must_use]
    pub fn run_to_exit(&self, cidr: &str, extra: &[&str]) -> Output {
        crate::process::output_within(
            &mut self.daemon_command(cidr, extra),
            crate::process::EXIT_WITHIN,
        )
    }

    /// With the kernel's own echo off in the endpoint, `n` pings from the
    /// node to `ip` (identifier `id`) each get a correct reply, and the
    /// eBPF responder's pinned counter counts them: the replies came from
    /// the responder.
    pub fn assert_echo_answered_in_kernel(&self, ip: Ipv4Addr, id: u16, n: u16) {
        crate::topology::TwoNodes::sysctl(
            &self.endpoint_ns(),
            "net/ipv4/icmp_echo_ignore_all",
            "1",
        );
        let answered = || {
            health_agent::datapath::read_pinned_stats(&self.pins)
                .expect("pinned stats")
                .answered
        };
        let before = answered();
        let ex = crate::pinger::ping(&self.node, ip, id, n, Duration::from_secs(1)).expect("ping");
        for e in &ex {
            crate::pinger::check_reply(e, id)
                .unwrap_or_else(|err| panic!("{err}; daemon log:\n{}", self.log()));
        }
        let after = answered();
        assert!(
            after >= before + u64::from(n),
            "the eBPF responder's answered counter {before} -> {after} after {n} replies"
        );
    }

    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// The daemon's exit status once it has ended by itself or been
    /// killed (reaped then: no signal goes to its process ID afterwards);
    /// `None` while it runs, or when it was not started.
    pub fn ended(&mut self) -> Option<ExitStatus> {
        let status = self.daemon.as_mut()?.try_wait().ok().flatten()?;
        self.daemon = None;
        Some(status)
    }

    /// Sends `signal` to the daemon, which keeps running.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let child = self.daemon.as_ref().expect("daemon running");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        nix::sys::signal::kill(pid, signal).expect("signal the daemon");
    }

    /// Sends `signal` to the daemon and waits for it to exit.
    pub fn stop(&mut self, signal: nix::sys::signal::Signal) -> ExitStatus {
        let mut child = self.daemon.take().expect("daemon running");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        nix::sys::signal::kill(pid, signal).expect("signal the daemon");
        child.wait().expect("wait for the daemon")
    }

    /// Waits for the daemon to exit by itself, within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.daemon.take().expect("daemon running");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the daemon did not exit within {timeout:?}; log:
{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `health-agent ARGS --socket <ours>`, returning the output.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(agent_binary())
            .args(args)
            .arg("--socket")
            .arg(self.socket())
            .output()
            .expect("run health-agent")
    }

    /// `GET /v1/endpoints`, or `None` while the socket does not answer.
    #[must_use]
    pub fn endpoints(&self) -> Option<Vec<EndpointView>> {
        crate::api::call(&self.socket(), |c| async move { c.endpoints().await }).ok()
    }

    /// Waits until the endpoint is ready and `accept` holds; returns it.
    pub fn wait_endpoint(
        &self,
        timeout: Duration,
        accept: impl Fn(&EndpointView) -> bool,
    ) -> EndpointView {
        let timeout = crate::patience(timeout);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ep) = self.endpoints().and_then(|v| v.into_iter().next())
                && ep.state == Some(State::Ready)
                && accept(&ep)
            {
                return ep;
            }
            assert!(
                Instant::now() < deadline,
                "endpoint not ready in {timeout:?}; daemon log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether `name` exists in the node's namespace.
    #[must_use]
    pub fn node_has_link(&self, name: &str) -> bool {
        let name = name.to_owned();
        in_netns(
            Some(&self.node),
            |nl| async move { nl.link_index(&name).await },
        )
        .expect("netlink")
        .is_some()
    }

    /// Whether the node has any route to `addr`.
    #[must_use]
    pub fn node_has_route_to(&self, addr: Ipv4Addr) -> bool {
        in_netns(Some(&self.node), |nl| async move {
            nl.routes::<Ipv4Addr>().await
        })
        .expect("netlink")
        .iter()
        .any(|r| r.destination == addr && r.prefix == 32)
    }
}

impl Default for AgentNode {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for AgentNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self.endpoint_ns().delete();
        let _ = self.node.delete();
        let _ = remove_pins(&self.pins);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The API socket of an agent whose files are under `dir`.
#[must_use]
pub fn socket_in(dir: &Path) -> PathBuf {
    dir.join("health.sock")
}

/// The pidfile of an agent whose files are under `dir`.
#[must_use]
pub fn pidfile_in(dir: &Path) -> PathBuf {
    dir.join("health-agent.pid")
}

/// `health-agent daemon` as the agent of `node` (it enters that namespace
/// only), its endpoint in `endpoint_netns`, its state, pidfile and socket
/// under `dir` and its pins in `pins`: every test agent's own files.
#[must_use]
pub fn daemon_command(
    node: &Netns,
    dir: &Path,
    pins: &Path,
    endpoint_netns: &str,
    cidr: &str,
) -> Command {
    let mut cmd = Command::new(agent_binary());
    cmd.args([
        "daemon",
        "--health-cidr",
        cidr,
        "--endpoint-netns",
        endpoint_netns,
    ])
    .arg("--state-dir")
    .arg(dir.join("state"))
    .arg("--pidfile")
    .arg(pidfile_in(dir))
    .arg("--socket")
    .arg(socket_in(dir))
    .arg("--bpffs-dir")
    .arg(pins);
    crate::process::enter(&mut cmd, node);
    cmd
}

/// The `health-agent` binary of the same build: next to this executable
/// (`target/<profile>/health-lab`) or one level up from a test executable
/// (`target/<profile>/deps/<test>`).
#[must_use]
pub fn agent_binary() -> PathBuf {
    built_binary("health-agent")
}

/// The `health-lab` binary of the same build, found as [`agent_binary`].
#[must_use]
pub fn lab_binary() -> PathBuf {
    built_binary("health-lab")
}

fn built_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("executable directory");
    let candidates = [
        dir.join(name),
        dir.parent().map(|p| p.join(name)).unwrap_or_default(),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{} missing: run `cargo build --workspace --bins` (cargo xtask test does)",
                candidates[1].display()
            )
        })
}
