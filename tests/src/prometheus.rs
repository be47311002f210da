//! A real Prometheus server (Debian's `prometheus`) run in a namespace the
//! test made, scraping agents every second, and asked through its HTTP
//! query API; plus a plain HTTP GET from inside a namespace.

use std::{
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use health_agent::sys::netns::Netns;

use crate::process;

/// Where Prometheus listens, in its namespace.
const LISTEN: &str = "127.0.0.1:9090";

/// `GET path` on `addr` from inside `ns`: the status code and the body.
#[must_use]
pub fn http_get(ns: &Netns, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let (head, body) = http_exchange(ns, addr, path)?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body))
}

/// `GET path` from `ns` to `addr`: the answer's head and body, or `None`
/// when there is no answer.
#[must_use]
pub fn http_exchange(ns: &Netns, addr: SocketAddr, path: &str) -> Option<(String, String)> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    ns.run(move || -> Option<(String, String)> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(request.as_bytes()).ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        Some((head.to_owned(), body.to_owned()))
    })
    .ok()
    .flatten()
}

/// A Prometheus server; stopped and its data removed on drop.
pub struct Prometheus {
    ns: Netns,
    dir: PathBuf,
    child: Child,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Prometheus {
    /// Starts Prometheus in `ns` scraping `targets` (`/metrics`) every
    /// second, with its data under `dir`, and waits until it is ready.
    #[must_use]
    pub fn start(ns: &Netns, dir: PathBuf, targets: &[SocketAddr]) -> Self {
        Self::start_with_rules(ns, dir, targets, &[])
    }

    /// [`Self::start`], with the rule files `rules` evaluated every
    /// second.
    #[must_use]
    pub fn start_with_rules(
        ns: &Netns,
        dir: PathBuf,
        targets: &[SocketAddr],
        rules: &[&std::path::Path],
    ) -> Self {
        fs::create_dir_all(&dir).expect("prometheus dir");
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n",
        );
        if !rules.is_empty() {
            config.push_str("rule_files:\n");
            for r in rules {
                let _ = writeln!(config, "  - \"{}\"", r.display());
            }
        }
        config.push_str(
            "scrape_configs:\n  - job_name: health\n    static_configs:\n      - targets:\n",
        );
        for t in targets {
            let _ = writeln!(config, "          - \"{t}\"");
        }
        let config_file = dir.join("prometheus.yml");
        fs::write(&config_file, config).expect("prometheus config");
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={LISTEN}"))
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("prometheus.log")).expect("log"));
        process::enter(&mut cmd, ns);
        let child = cmd
            .spawn()
            .expect("start prometheus (Debian package prometheus: cargo xtask setup installs it)");
        let me = Self {
            ns: Netns::at(ns.path()),
            dir,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while me.get("/-/ready").is_none_or(|(code, _)| code != 200) {
            assert!(
                Instant::now() < deadline,
                "prometheus did not become ready:\n{}",
                me.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        me
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(&self.ns, LISTEN.parse().expect("address"), path)
    }

    /// The JSON answer of `GET /api/v1/...` (`path` after `/api/v1/`),
    /// whatever its status.
    #[must_use]
    pub fn api(&self, path: &str) -> Option<serde_json::Value> {
        let (_, body) = self.get(&format!("/api/v1/{path}"))?;
        serde_json::from_str(&body).ok()
    }

    /// The answer of an instant query: Prometheus's whole JSON (`status`,
    /// `error`, `data`).
    #[must_use]
    pub fn query_raw(&self, promql: &str) -> Option<serde_json::Value> {
        self.api(&format!("query?query={}", url_encode(promql)))
    }

    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// The instant vector `promql` evaluates to: each series' labels and
    /// value.
    #[must_use]
    pub fn query(&self, promql: &str) -> Vec<(serde_json::Value, f64)> {
        let path = format!("/api/v1/query?query={}", url_encode(promql));
        let Some((200, body)) = self.get(&path) else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_str(&body).expect("query answer is JSON");
        v["data"]["result"]
            .as_array()
            .map(|r| {
                r.iter()
                    .filter_map(|s| {
                        let value = s["value"][1].as_str()?.parse().ok()?;
                        Some((s["metric"].clone(), value))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The single value of `promql`, if it has exactly one series.
    #[must_use]
    pub fn value(&self, promql: &str) -> Option<f64> {
        match self.query(promql).as_slice() {
            [(_, v)] => Some(*v),
            _ => None,
        }
    }

    /// Waits until `promql` has the single value `want`.
    pub fn wait_value(&self, promql: &str, want: f64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.value(promql);
            if got == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{promql}: wanted {want}, got {got:?} after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
