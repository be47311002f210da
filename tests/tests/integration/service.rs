//! The systemd unit, run the way systemd would run it (systemd is not PID 1
//! here): the harness reads `packaging/health-agent.service`, runs its
//! `ExecStart` command line with its `Environment=` and a `NOTIFY_SOCKET` it
//! listens on, inside a node namespace, with a config file naming the
//! test's own namespace, directories and socket group. It checks that
//! `READY=1` comes only once the API socket serves, that a user in the
//! socket's group can run `health-agent status` (and one outside it
//! cannot), that a member holding its share of the API's connections is
//! told so while root is still served, and that SIGTERM leaves nothing
//! behind.

use std::{
    fs,
    os::unix::{fs::MetadataExt as _, net::UnixDatagram, process::CommandExt as _},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use health_agent::api::users::PER_USER;
use health_tests::{
    agent::{AgentNode, HEALTH_CIDR, agent_binary},
    api, names, process,
};
use nix::sys::signal::{Signal, kill};

/// The unit as packaged.
fn unit() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/health-agent.service");
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The values of `key=` lines of the `[Service]` section.
fn service_values(unit: &str, key: &str) -> Vec<String> {
    let mut in_service = false;
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service && let Some(v) = line.strip_prefix(&format!("{key}=")) {
            out.push(v.to_owned());
        }
    }
    out
}

/// A system group for the test, removed on drop.
struct Group {
    name: String,
    gid: u32,
}

impl Group {
    fn new() -> Self {
        let name = names::unique("grp");
        let ok = Command::new("groupadd")
            .args(["--system", &name])
            .status()
            .expect("groupadd");
        assert!(ok.success(), "groupadd {name}");
        // Removed from here on, even if its lookup fails.
        let mut group = Self { name, gid: 0 };
        group.gid = nix::unistd::Group::from_name(&group.name)
            .expect("group lookup")
            .expect("the group exists")
            .gid
            .as_raw();
        group
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("groupdel").arg(&self.name).status();
    }
}

/// The service's main process, killed if the test fails first.
struct Service(Option<Child>);

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The next notification, or `None` within `timeout`.
fn next_notification(sock: &UnixDatagram, timeout: Duration) -> Option<String> {
    sock.set_read_timeout(Some(timeout)).expect("timeout");
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// `health-agent status` as uid 65534 (nobody) with primary group `gid`
/// and no other.
fn status_as(socket: &Path, gid: u32) -> std::process::Output {
    Command::new(agent_binary())
        .args(["status", "--socket"])
        .arg(socket)
        .uid(65534)
        .gid(gid)
        .env_clear()
        .output()
        .expect("run health-agent status")
}

/// A member holding its share of connections open is answered 503,
/// saying so, and so is its CLI; root is still served, and the member
/// again once its connections are closed.
fn assert_a_member_past_its_share_is_told_so(socket: &Path, gid: u32) {
    let held = connections_as(socket, gid, PER_USER);
    let past = status_as(socket, gid);
    let said = String::from_utf8_lossy(&past.stderr);
    assert!(!past.status.success(), "a member past its share served");
    assert!(
        said.contains("503") && said.contains(&format!("user 65534 holds {PER_USER}")),
        "{said}"
    );
    let root = api::call(socket, |c| async move { c.healthz().await });
    assert!(root.is_ok(), "root locked out: {root:?}");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !status_as(socket, gid).status.success() {
        assert!(Instant::now() < deadline, "the share not given back");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `n` connections to `socket` made as uid 65534 with group `gid` (on a
/// thread of their own, whose credentials alone change), saying nothing.
fn connections_as(socket: &Path, gid: u32, n: usize) -> Vec<std::os::unix::net::UnixStream> {
    let socket = socket.to_owned();
    std::thread::spawn(move || {
        // SAFETY: raw system calls change only this thread's credentials
        // (glibc's wrappers would change every thread's).
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
                0
            );
            assert_eq!(libc::syscall(libc::SYS_setresgid, gid, gid, gid), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
        }
        (0..n)
            .map(|_| std::os::unix::net::UnixStream::connect(&socket).expect("connect as 65534"))
            .collect()
    })
    .join()
    .expect("the connecting thread")
}

/// The unit's `ExecStart=` command line with its `Environment=` (and
/// nothing else from ours), the config file at `config` in place of the
/// packaged one, and `NOTIFY_SOCKET`.
fn exec_start(unit: &str, config: &Path, notify: &Path) -> Command {
    let exec = service_values(unit, "ExecStart");
    assert_eq!(exec.len(), 1, "one ExecStart: {exec:?}");
    let mut words = exec[0].split_whitespace().map(str::to_owned);
    assert_eq!(words.next().as_deref(), Some("/usr/bin/health-agent"));
    let args: Vec<String> = words.collect();
    let config_at = args
        .iter()
        .position(|a| a == "--config")
        .expect("ExecStart names its config file");
    assert_eq!(args[config_at + 1], "/etc/health-agent/config.yaml");
    assert_eq!(service_values(unit, "Type"), ["notify"]);

    let mut cmd = Command::new(agent_binary());
    for (i, a) in args.iter().enumerate() {
        if i == config_at + 1 {
            cmd.arg(config);
        } else {
            cmd.arg(a);
        }
    }
    cmd.env_clear().env("NOTIFY_SOCKET", notify);
    for env in service_values(unit, "Environment") {
        for pair in env.split_whitespace() {
            let (k, v) = pair.split_once('=').expect("KEY=VALUE");
            cmd.env(k, v);
        }
    }
    cmd
}

#[test]
fn the_unit_notifies_ready_serves_its_group_and_stops_cleanly() {
    let node = AgentNode::new();
    let group = Group::new();
    let unit = unit();

    // What RuntimeDirectory= and StateDirectory= would give, and the
    // packaged config's keys pointed at the test's own names.
    let runtime = &node.dir;
    let socket = runtime.join("health.sock");
    let pidfile = runtime.join("health-agent.pid");
    let config = node.dir.join("config.yaml");
    fs::write(
        &config,
        format!(
            "health-cidr: {HEALTH_CIDR}\nnode-name: service\nendpoint-netns: {}\n\
             state-dir: {}\npidfile: {}\nsocket: {}\nbpffs-dir: {}\nsocket-group: {}\n",
            node.endpoint_netns,
            node.dir.join("state").display(),
            pidfile.display(),
            socket.display(),
            node.pins.display(),
            group.name,
        ),
    )
    .expect("config");
    let notify_path = node.dir.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("NOTIFY_SOCKET");

    let mut cmd = exec_start(&unit, &config, &notify_path);
    let log = node.dir.join("daemon.log");
    cmd.stdout(Stdio::null())
        .stderr(fs::File::create(&log).expect("log"));
    process::enter(&mut cmd, &node.node);
    let mut service = Service(Some(cmd.spawn().expect("spawn ExecStart")));
    let log = || fs::read_to_string(&log).unwrap_or_default();

    // READY=1, and the API answers at that moment.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = next_notification(&notify, left)
            .unwrap_or_else(|| panic!("no READY=1 within 30s; log:\n{}", log()));
        if msg.lines().any(|l| l == "READY=1") {
            break;
        }
    }
    let healthz = api::call(&socket, |c| async move { c.healthz().await });
    assert!(
        healthz.is_ok(),
        "READY=1 before the API serves: {healthz:?}"
    );

    // The socket: mode 0660, the configured group; its members may use it.
    let meta = fs::metadata(&socket).expect("socket");
    assert_eq!(meta.mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), group.gid);
    let member = status_as(&socket, group.gid);
    assert!(
        member.status.success(),
        "status as a member of {}: {}",
        group.name,
        String::from_utf8_lossy(&member.stderr)
    );
    assert!(
        String::from_utf8_lossy(&member.stdout).contains("Cluster health:"),
        "{}",
        String::from_utf8_lossy(&member.stdout)
    );
    let outsider = status_as(&socket, 65534);
    assert!(
        !outsider.status.success(),
        "status outside the group succeeded"
    );
    assert!(
        String::from_utf8_lossy(&outsider.stderr).contains("ermission denied"),
        "{}",
        String::from_utf8_lossy(&outsider.stderr)
    );

    assert_a_member_past_its_share_is_told_so(&socket, group.gid);

    // SIGTERM (systemctl stop): STOPPING=1, a clean exit, nothing left.
    let child = service.0.take().expect("running");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    let mut child = child;
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let exit = child.wait().expect("wait");
    assert!(exit.success(), "{exit}; log:\n{}", log());
    let mut stopping = false;
    while let Some(msg) = next_notification(&notify, Duration::from_millis(100)) {
        stopping |= msg.lines().any(|l| l == "STOPPING=1");
    }
    assert!(stopping, "no STOPPING=1");
    assert!(
        !Path::new("/run/netns").join(&node.endpoint_netns).exists(),
        "endpoint namespace left behind"
    );
    assert!(!node.node_has_link("lxc_health"), "lxc_health left behind");
    assert!(
        !node.pins.exists(),
        "pins left behind: {}",
        node.pins.display()
    );
    assert!(!socket.exists(), "socket left behind");
    assert!(!pidfile.exists(), "pidfile left behind");
}
