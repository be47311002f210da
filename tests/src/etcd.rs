//! etcd for the tests, the demo and the load bench: the server's flags
//! (plain or TLS with client certificates), TLS material made with the
//! `openssl` CLI, etcd's user/password authentication switched on through
//! the `etcd-client` crate (a user and a role per node, as in production:
//! a node writes only its own keys), and a local etcd on loopback.

use std::{
    ffi::OsString,
    fs,
    net::{Ipv4Addr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use etcd_client::{
    Certificate, Client, ConnectOptions, Identity, Permission, PutOptions, TlsOptions,
};
use health_agent::sys::netns::Netns;

/// How a test cluster's etcd is secured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Security {
    /// https only, with client certificates required (`--client-cert-auth`).
    pub tls: bool,
    /// etcd's authentication on: each agent logs in as the user named
    /// after its node ([`enable_auth`]), with [`node_password`].
    pub auth: bool,
    /// Each node's health CIDRs written as its allocation
    /// (`/health/allocations/<name>`, as root when `auth`) and the agents
    /// started with `--kvstore-allocations`.
    pub allocations: bool,
}

const ROOT_PASSWORD: &str = "root-password-for-tests";

/// The password of node `name`'s etcd user.
#[must_use]
pub fn node_password(name: &str) -> String {
    format!("{name}-password-for-tests")
}

/// The keys a node's role may write and the prefixes it may read, for the
/// node records under `prefix` (`/health/nodes/`: the summaries are under
/// `/health/summaries/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGrants {
    /// Read, with everything below: the node records', the summaries' and
    /// the health allocations' prefixes.
    pub read: [String; 3],
    /// Read and write, that key alone: the node's record and its summary.
    pub write: [String; 2],
    /// For the elected assembler: its own view's key alone (read and
    /// write), the election's prefix (read and write: each candidate's key
    /// is below it), and the views' prefix (read).
    pub assemble: [String; 3],
}

impl NodeGrants {
    #[must_use]
    pub fn new(prefix: &str, name: &str) -> Self {
        let summaries = health_agent::daemon::cluster_view::summaries_prefix(prefix);
        Self {
            write: [format!("{prefix}{name}"), format!("{summaries}{name}")],
            read: [
                prefix.to_owned(),
                summaries,
                health_agent::membership::kvstore::beside(prefix, "allocations"),
            ],
            assemble: [
                format!(
                    "{}{name}",
                    health_agent::cluster::published_view::view_prefix(prefix)
                ),
                health_agent::cluster::published_view::election_name(prefix),
                health_agent::cluster::published_view::view_prefix(prefix),
            ],
        }
    }
}
/// A CA, etcd's server certificate and key (for `server_ip` and
/// 127.0.0.1), a client certificate and key, and a second, unrelated CA
/// (what a misconfigured agent trusts). All PEM, in `dir`.
#[derive(Debug, Clone)]
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    /// Makes the files under `dir` (P-256 keys, valid for two days).
    #[must_use]
    pub fn generate(dir: &Path, server_ip: Ipv4Addr) -> Self {
        fs::create_dir_all(dir).expect("pki dir");
        let pki = Self {
            dir: dir.to_owned(),
        };
        pki.ca("ca");
        pki.ca("other-ca");
        pki.leaf(
            "server",
            "etcd",
            &format!("subjectAltName=IP:{server_ip},IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"),
        );
        pki.leaf("client", "health-agent", "extendedKeyUsage=clientAuth\n");
        pki
    }

    #[must_use]
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("run openssl (Debian package openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn ca(&self, name: &str) {
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=health test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &format!("{name}-key.pem"),
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    fn leaf(&self, name: &str, cn: &str, extensions: &str) {
        let ext = format!("{name}.ext");
        fs::write(
            self.dir.join(&ext),
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}"),
        )
        .expect("extensions file");
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &format!("{name}-key.pem"),
            "-out",
            &format!("{name}.csr"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    /// etcd's flags for serving clients over TLS with client certificates.
    #[must_use]
    pub fn server_args(&self) -> Vec<OsString> {
        vec![
            "--cert-file".into(),
            self.path("server.pem").into(),
            "--key-file".into(),
            self.path("server-key.pem").into(),
            "--trusted-ca-file".into(),
            self.path("ca.pem").into(),
            "--client-cert-auth".into(),
        ]
    }

    /// The crate's TLS options of a client trusting the CA, with the
    /// client certificate.
    #[must_use]
    pub fn client_tls(&self) -> TlsOptions {
        let read = |name: &str| fs::read(self.path(name)).expect("read pki file");
        TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read("ca.pem")))
            .identity(Identity::from_pem(
                read("client.pem"),
                read("client-key.pem"),
            ))
    }
}

/// A current-thread runtime for a few client calls from a test thread.
fn block_on<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(f)
}

/// A client of the etcd at `endpoint` (`host:port`), as root when auth is
/// on, run in `ns` (or here).
async fn admin_client(endpoint: &str, pki: Option<&Pki>, as_root: bool) -> Client {
    let mut opts = ConnectOptions::new().with_connect_timeout(Duration::from_secs(3));
    let scheme = if let Some(pki) = pki {
        opts = opts.with_tls(pki.client_tls());
        "https"
    } else {
        "http"
    };
    if as_root {
        opts = opts.with_user("root", ROOT_PASSWORD);
    }
    Client::connect([format!("{scheme}://{endpoint}")], Some(opts))
        .await
        .expect("connect to etcd")
}

/// Switches etcd's authentication on (through the crate, in `ns`):
/// `root`, and for each node of `names` a user and a role of its name whose
/// grants are [`NodeGrants`] for the node records under `prefix`: it
/// reads the records and the summaries, and writes only its own record
/// and its own summary.
pub fn enable_auth(
    ns: Option<&Netns>,
    endpoint: &str,
    pki: Option<&Pki>,
    prefix: &str,
    names: &[String],
) {
    health_agent::sys::netns::run_in(ns, || {
        block_on(async {
            let mut c = admin_client(endpoint, pki, false).await;
            c.user_add("root", ROOT_PASSWORD, None)
                .await
                .expect("add root");
            c.user_grant_role("root", "root").await.expect("root role");
            for name in names {
                add_node_user(&mut c, prefix, name).await;
            }
            c.auth_enable().await.expect("auth enable");
        });
    })
    .expect("netns");
}

/// Node `name`'s role (of its name, with its [`NodeGrants`]) and user.
async fn add_node_user(c: &mut Client, prefix: &str, name: &str) {
    let grants = NodeGrants::new(prefix, name);
    c.role_add(name).await.expect("add role");
    for key in &grants.read {
        c.role_grant_permission(name, Permission::read(key.as_str()).with_prefix())
            .await
            .expect("grant read");
    }
    for key in &grants.write {
        c.role_grant_permission(name, Permission::read_write(key.as_str()))
            .await
            .expect("grant write");
    }
    c.role_grant_permission(name, Permission::read_write(grants.assemble[0].as_str()))
        .await
        .expect("grant the view");
    c.role_grant_permission(
        name,
        Permission::read_write(grants.assemble[1].as_str()).with_prefix(),
    )
    .await
    .expect("grant the election");
    c.role_grant_permission(
        name,
        Permission::read(grants.assemble[2].as_str()).with_prefix(),
    )
    .await
    .expect("grant the views");
    c.user_add(name, node_password(name), None)
        .await
        .expect("add node user");
    c.user_grant_role(name, name).await.expect("node role");
}

/// A client logged in as node `user` (with [`node_password`]).
async fn node_client(endpoint: &str, pki: Option<&Pki>, user: &str) -> Result<Client, String> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_user(user, node_password(user));
    let scheme = if let Some(pki) = pki {
        opts = opts.with_tls(pki.client_tls());
        "https"
    } else {
        "http"
    };
    Client::connect([format!("{scheme}://{endpoint}")], Some(opts))
        .await
        .map_err(|e| e.to_string())
}

/// The keys under `prefix`, read as node `user`: etcd's error as text
/// when refused.
pub fn keys_as(
    ns: Option<&Netns>,
    endpoint: &str,
    pki: Option<&Pki>,
    user: &str,
    prefix: &str,
) -> Result<Vec<String>, String> {
    health_agent::sys::netns::run_in(ns, || {
        block_on(async {
            let mut c = node_client(endpoint, pki, user).await?;
            let opts = etcd_client::GetOptions::new()
                .with_prefix()
                .with_keys_only();
            let resp = c.get(prefix, Some(opts)).await.map_err(|e| e.to_string())?;
            Ok(resp
                .kvs()
                .iter()
                .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                .collect())
        })
    })
    .expect("netns")
}

/// Puts `key` = `value` as node `user` (with [`node_password`]): etcd's
/// error as text when refused.
pub fn put_as(
    ns: Option<&Netns>,
    endpoint: &str,
    pki: Option<&Pki>,
    user: &str,
    kv: (&str, &str),
) -> Result<(), String> {
    health_agent::sys::netns::run_in(ns, || {
        block_on(async {
            let mut c = node_client(endpoint, pki, user).await?;
            c.put(kv.0, kv.1, None::<PutOptions>)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    })
    .expect("netns")
}

/// Puts `key` = `value` (no lease), as root when auth is on.
pub fn put(ns: Option<&Netns>, endpoint: &str, security: (Option<&Pki>, bool), kv: (&str, &str)) {
    let (pki, auth) = security;
    health_agent::sys::netns::run_in(ns, || {
        block_on(async {
            admin_client(endpoint, pki, auth)
                .await
                .put(kv.0, kv.1, None::<PutOptions>)
                .await
                .expect("etcd put");
        });
    })
    .expect("netns");
}

/// etcd's flag that writes without syncing. etcd syncs its log on every
/// write; on a disk shared with parallel builds and package installs a
/// sync can stall a leader for seconds, and a leader stalled past a
/// lease's TTL lets it expire although its client kept it alive. What the
/// tests check is the agents, not the disk.
pub const UNSAFE_NO_FSYNC: &str = "--unsafe-no-fsync";

/// Starts etcd (in `ns` when given) with its data in `data` and waits
/// until its client port accepts connections.
#[must_use]
pub fn spawn(
    ns: Option<&Netns>,
    data: &Path,
    client_addr: &str,
    peer_port: u16,
    pki: Option<&Pki>,
    log: &Path,
) -> Child {
    let scheme = if pki.is_some() { "https" } else { "http" };
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = Command::new("etcd");
    cmd.args(["--name", "default", "--data-dir"])
        .arg(data)
        .arg(UNSAFE_NO_FSYNC)
        .args(["--listen-client-urls", &format!("{scheme}://{client_addr}")])
        .args([
            "--advertise-client-urls",
            &format!("{scheme}://{client_addr}"),
        ])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("default={peer}")])
        .args(pki.map(Pki::server_args).unwrap_or_default())
        .stdout(Stdio::null())
        .stderr(fs::File::create(log).expect("etcd log"));
    if let Some(ns) = ns {
        crate::process::enter(&mut cmd, ns);
    }
    let mut child = cmd
        .spawn()
        .expect("start etcd (Debian package etcd-server)");
    let deadline = Instant::now() + crate::patience(Duration::from_secs(15));
    while health_agent::sys::netns::run_in(ns, || TcpStream::connect(client_addr).is_err())
        .expect("netns")
    {
        // Gone (its port taken, say), or too slow: stopped and reaped
        // before failing, never left running.
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || Instant::now() >= deadline {
            let _ = child.kill();
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            let why = if exited.is_some() {
                "exited"
            } else {
                "did not answer in time, stopped"
            };
            panic!(
                "etcd {why} ({status}):\n{}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

/// An etcd of its own on loopback (free ports, a temporary data
/// directory), stopped and removed on drop.
pub struct LocalEtcd {
    pub endpoint: String,
    pub dir: PathBuf,
    peer_port: u16,
    child: Option<Child>,
}

impl LocalEtcd {
    #[must_use]
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(crate::names::unique("etcd"));
        fs::create_dir_all(&dir).expect("etcd dir");
        let port = |_| {
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .expect("free port")
                .port()
        };
        let [client, peer_port] = [0, 1].map(port);
        let mut etcd = Self {
            endpoint: format!("127.0.0.1:{client}"),
            dir,
            peer_port,
            child: None,
        };
        etcd.resume();
        etcd
    }

    /// etcd's process ID.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops etcd (SIGTERM), keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::process::stop(&mut child, nix::sys::signal::Signal::SIGTERM);
        }
    }

    /// Starts etcd again on the same data and ports.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "etcd already running");
        self.child = Some(spawn(
            None,
            &self.dir.join("data"),
            &self.endpoint,
            self.peer_port,
            None,
            &self.dir.join("etcd.log"),
        ));
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Puts `key` = `value` (bytes, no lease), without authentication.
pub fn put_bytes(ns: Option<&Netns>, endpoint: &str, key: &str, value: Vec<u8>) {
    health_agent::sys::netns::run_in(ns, || {
        block_on(async {
            admin_client(endpoint, None, false)
                .await
                .put(key, value, None::<PutOptions>)
                .await
                .expect("etcd put");
        });
    })
    .expect("netns");
}

/// Puts each of `values` at `key` in turn, through one client, as fast
/// as etcd takes them.
pub fn put_bytes_each(ns: Option<&Netns>, endpoint: &str, key: &str, values: Vec<Vec<u8>>) {
    health_agent::sys::netns::run_in(ns, || {
        block_on(async {
            let mut c = admin_client(endpoint, None, false).await;
            for value in values {
                c.put(key, value, None::<PutOptions>)
                    .await
                    .expect("etcd put");
            }
        });
    })
    .expect("netns");
}

/// The value of election `name`'s leader, if any.
#[must_use]
pub fn election_leader(ns: Option<&Netns>, endpoint: &str, name: &str) -> Option<String> {
    health_agent::sys::netns::run_in(ns, || {
        block_on(async {
            let mut c = admin_client(endpoint, None, false).await;
            let r = c.leader(name).await.ok()?;
            r.kv()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
        })
    })
    .expect("netns")
}
