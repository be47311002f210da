//! A 3-member (or N-member) etcd cluster for the tests and the chaos
//! suite: each member a real `etcd` process in a namespace of its own,
//! joined to a fabric namespace's bridge `br0` by a veth, with its client
//! and peer URLs on `198.18.0.2`, `.3`, ... (plain http). Members can be
//! killed, stopped and started again on their data; the leader is asked
//! of the members themselves. Everything is removed on drop, including
//! when a test panics.

use std::{
    fs,
    net::{Ipv4Addr, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use health_agent::sys::{netlink::in_netns, netns::Netns};
use nix::sys::signal::Signal;

use crate::{names, netns_guard::NetnsGuard};

/// The client port of every member.
pub const CLIENT_PORT: u16 = 2379;
/// The peer port of every member.
pub const PEER_PORT: u16 = 2380;

/// Member `i`'s address: `198.18.0.2`, `.3`, ...
#[must_use]
pub fn member_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        198,
        18,
        0,
        2 + u8::try_from(i).expect("fewer than 9 members"),
    )
}

/// One member: its namespace, its data and log, its process when running.
pub struct Member {
    pub name: String,
    pub ns: Netns,
    pub ip: Ipv4Addr,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl Member {
    /// `host:port` of its client URL.
    #[must_use]
    pub fn endpoint(&self) -> String {
        format!("{}:{CLIENT_PORT}", self.ip)
    }

    /// Whether its process runs (as far as this fixture started it).
    #[must_use]
    pub const fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Its process ID when running.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }
}

/// The members, on the fabric's bridge.
pub struct EtcdCluster {
    pub members: Vec<Member>,
    /// `name=http://ip:2380,...` for every member.
    initial: String,
    token: String,
}

impl EtcdCluster {
    /// Makes `n` members' namespaces on `fabric`'s bridge `br0` (which
    /// must exist and be up) with their directories under `dir`, starts
    /// them all and waits until each answers.
    #[must_use]
    pub fn start(fabric: &Netns, dir: &std::path::Path, n: usize) -> Self {
        crate::require_root();
        let mut cluster = Self {
            members: Vec::new(),
            initial: String::new(),
            token: names::unique("etcd-cluster"),
        };
        for i in 0..n {
            let name = format!("etcd-{}", i + 1);
            // Removed if a step fails before the member is the cluster's
            // (whose drop removes it from then on).
            let guard = NetnsGuard::create(&names::unique(&name), "member");
            let ns = guard.ns().clone();
            let ip = member_ip(i);
            let port = format!("e{}", i + 1);
            let member_ns = ns.clone();
            in_netns(Some(fabric), |nl| async move {
                nl.add_veth(&port, "uplink", Some(&member_ns)).await?;
                nl.set_controller(&port, "br0").await?;
                nl.set_up(&port).await
            })
            .expect("member's veth");
            in_netns(Some(&ns), |nl| async move {
                nl.set_up("lo").await?;
                nl.add_address("uplink", ip, 24).await?;
                nl.set_up("uplink").await
            })
            .expect("member's address");
            let mdir = dir.join(&name);
            fs::create_dir_all(&mdir).expect("member dir");
            cluster.members.push(Member {
                name,
                ns: guard.keep(),
                ip,
                dir: mdir,
                child: None,
            });
        }
        cluster.initial = cluster
            .members
            .iter()
            .map(|m| format!("{}=http://{}:{PEER_PORT}", m.name, m.ip))
            .collect::<Vec<_>>()
            .join(",");
        for i in 0..n {
            cluster.spawn(i);
        }
        for i in 0..n {
            cluster.wait_answering(i, Duration::from_secs(30));
        }
        cluster
    }

    /// Every member's client endpoint, comma-separated (the agents'
    /// `--kvstore-endpoint`).
    #[must_use]
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(Member::endpoint)
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        assert!(m.child.is_none(), "{} already running", m.name);
        let client = format!("http://{}:{CLIENT_PORT}", m.ip);
        let peer = format!("http://{}:{PEER_PORT}", m.ip);
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", &m.name, "--data-dir"])
            .arg(m.dir.join("data"))
            .arg(crate::etcd::UNSAFE_NO_FSYNC)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .stdout(Stdio::null())
            .stderr(
                fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(m.dir.join("etcd.log"))
                    .expect("etcd log"),
            );
        crate::process::enter(&mut cmd, &m.ns);
        let child = cmd
            .spawn()
            .expect("start etcd (Debian package etcd-server)");
        self.members[i].child = Some(child);
    }

    /// Waits until member `i`'s client port accepts connections.
    pub fn wait_answering(&self, i: usize, timeout: Duration) {
        let m = &self.members[i];
        let deadline = Instant::now() + crate::patience(timeout);
        let addr = (m.ip, CLIENT_PORT);
        while health_agent::sys::netns::run_in(Some(&m.ns), || {
            TcpStream::connect_timeout(&addr.into(), Duration::from_millis(300)).is_err()
        })
        .expect("netns")
        {
            assert!(
                Instant::now() < deadline,
                "{} did not start:\n{}",
                m.name,
                m.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops member `i` with `signal` (SIGKILL: a crash; SIGTERM: a clean
    /// stop) and waits for it; its data stays.
    pub fn stop(&mut self, i: usize, signal: Signal) {
        if let Some(mut child) = self.members[i].child.take() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
            let _ = nix::sys::signal::kill(pid, signal);
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data (it rejoins the others); does
    /// not wait (a lone member answers only once it has a quorum).
    pub fn restart(&mut self, i: usize) {
        self.spawn(i);
    }

    /// The index of the member that is the leader, as the running
    /// members say (asked in the member's namespace), if one says so.
    #[must_use]
    pub fn leader(&self) -> Option<usize> {
        for m in self.members.iter().filter(|m| m.running()) {
            let answer = ask(m, async |c| {
                let s = c.status().await.ok()?;
                Some((s.leader(), s.header()?.member_id()))
            });
            if let Some((leader, me)) = answer
                && leader != 0
            {
                if leader == me {
                    return self.members.iter().position(|x| x.name == m.name);
                }
                // Another member leads: find which by asking it.
                return self.member_with_id(leader);
            }
        }
        None
    }

    fn member_with_id(&self, id: u64) -> Option<usize> {
        let first = self.members.iter().find(|m| m.running())?;
        let list = ask(first, async |c| {
            let r = c.member_list().await.ok()?;
            Some(
                r.members()
                    .iter()
                    .map(|m| (m.id(), m.name().to_owned()))
                    .collect::<Vec<_>>(),
            )
        })?;
        let name = list.into_iter().find(|(i, _)| *i == id)?.1;
        self.members.iter().position(|m| m.name == name)
    }
}

/// Runs `f` on a client of member `m` alone, made in its namespace, with
/// one-second timeouts; `None` when it cannot connect or `f` says so.
fn ask<T: Send>(
    m: &Member,
    f: impl AsyncFnOnce(&mut etcd_client::Client) -> Option<T> + Send,
) -> Option<T> {
    let one = Duration::from_secs(1);
    client_in(
        &m.ns,
        vec![format!("http://{}", m.endpoint())],
        (one, one),
        f,
    )
}

/// Runs `f` on a client of `endpoints` made in `ns` on a runtime of its
/// own, with `(connect, request)` timeouts.
fn client_in<T: Send>(
    ns: &Netns,
    endpoints: Vec<String>,
    (connect, request): (Duration, Duration),
    f: impl AsyncFnOnce(&mut etcd_client::Client) -> Option<T> + Send,
) -> Option<T> {
    health_agent::sys::netns::run_in(Some(ns), || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async {
                let opts = etcd_client::ConnectOptions::new()
                    .with_connect_timeout(connect)
                    .with_timeout(request);
                let mut c = etcd_client::Client::connect(endpoints, Some(opts))
                    .await
                    .ok()?;
                f(&mut c).await
            })
    })
    .ok()
    .flatten()
}

impl EtcdCluster {
    /// A client of the running members, made in the first one's namespace
    /// (the bridge reaches the others), running `f` on it.
    fn with_client<T: Send>(
        &self,
        f: impl AsyncFnOnce(&mut etcd_client::Client) -> Option<T> + Send,
    ) -> Option<T> {
        let first = self.members.iter().find(|m| m.running())?;
        let endpoints: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.running())
            .map(|m| format!("http://{}", m.endpoint()))
            .collect();
        client_in(
            &first.ns,
            endpoints,
            (Duration::from_secs(2), Duration::from_secs(3)),
            f,
        )
    }

    /// The keys under `prefix` with their lease (0: none), as the running
    /// members have them; `None` when none answers.
    #[must_use]
    pub fn keys(&self, prefix: &str) -> Option<Vec<(String, i64)>> {
        let prefix = prefix.to_owned();
        self.with_client(async move |c| {
            let r = c
                .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
                .await
                .ok()?;
            Some(
                r.kvs()
                    .iter()
                    .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.lease()))
                    .collect(),
            )
        })
    }

    /// Every lease etcd holds; `None` when no member answers.
    #[must_use]
    pub fn leases(&self) -> Option<Vec<i64>> {
        self.with_client(async |c| {
            let r = c.leases().await.ok()?;
            Some(
                r.leases()
                    .iter()
                    .map(etcd_client::LeaseStatus::id)
                    .collect(),
            )
        })
    }
}

impl EtcdCluster {
    /// Every lease with its granted TTL, the seconds it has left and its
    /// keys, a line each: what a lease count that grew needs to be read.
    #[must_use]
    pub fn lease_details(&self) -> String {
        self.with_client(async |c| {
            let ids: Vec<i64> = c
                .leases()
                .await
                .ok()?
                .leases()
                .iter()
                .map(etcd_client::LeaseStatus::id)
                .collect();
            let mut out = String::new();
            for id in ids {
                let opts = etcd_client::LeaseTimeToLiveOptions::new().with_keys();
                let line = match c.lease_time_to_live(id, Some(opts)).await {
                    Ok(t) => format!(
                        "lease {id:x}: granted {} s, {} s left, keys {:?}\n",
                        t.granted_ttl(),
                        t.ttl(),
                        t.keys()
                            .iter()
                            .map(|k| String::from_utf8_lossy(k).into_owned())
                            .collect::<Vec<_>>()
                    ),
                    Err(e) => format!("lease {id:x}: {e}\n"),
                };
                out += &line;
            }
            Some(out)
        })
        .unwrap_or_else(|| "no etcd member answered".into())
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.stop(i, Signal::SIGKILL);
        }
        for m in &self.members {
            if let Err(e) = m.ns.delete() {
                eprintln!("warning: could not remove {}: {e}", m.ns.path().display());
            }
            let _ = fs::remove_dir_all(&m.dir);
        }
    }
}

/// How many established connections to etcd's client port `pid`'s
/// namespace holds (the etcd client connects to one member or several).
#[must_use]
pub fn etcd_connections(pid: u32) -> usize {
    let text = fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(3) == Some(&"01")
                && fields
                    .get(2)
                    .and_then(|r| r.split_once(':'))
                    .and_then(|(_, port)| u16::from_str_radix(port, 16).ok())
                    == Some(CLIENT_PORT)
        })
        .count()
}

/// The etcd members `pid`'s process holds established connections to
/// (its client port, IPv4), read from the process's own `net/tcp` (its
/// namespace's).
#[must_use]
pub fn connected_members(pid: u32) -> Vec<Ipv4Addr> {
    let text = fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let mut found: Vec<Ipv4Addr> = text
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (remote, state) = (fields.get(2)?, fields.get(3)?);
            let (ip, port) = remote.split_once(':')?;
            (*state == "01" && u16::from_str_radix(port, 16).ok()? == CLIENT_PORT).then_some(())?;
            // The address is in network order, printed as a host-order
            // (little-endian) number.
            let raw = u32::from_str_radix(ip, 16).ok()?;
            Some(Ipv4Addr::from(raw.swap_bytes()))
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}
