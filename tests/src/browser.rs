//! Headless Chromium inside a network namespace, driven over `WebDriver`.
//!
//! `chromedriver` (Debian's `chromium-driver`) runs in the namespace on a
//! free loopback port and starts Chromium (Debian's `chromium`) there, so
//! the page's requests go to the namespace's addresses. Every `WebDriver`
//! call runs on a thread that has entered the namespace too: the TCP
//! connections to chromedriver are made there (a socket belongs to the
//! namespace of the thread that made it).
//!
//! Chromium runs headless, as root (`--no-sandbox`), with a profile of its
//! own under the fixture's temp dir. Dropping the fixture ends the session,
//! stops chromedriver, kills whatever Chromium process still runs with
//! that profile, and removes the dir, panics included.

use std::{
    fs,
    future::Future,
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fantoccini::{
    Client, ClientBuilder, Locator,
    actions::{InputSource as _, MouseActions, PointerAction},
};
use health_agent::sys::netns::Netns;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

use crate::{names, process, require_root};

/// Debian's paths for the two packages.
pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// The browser window (and so the screenshots).
pub const WINDOW: (u32, u32) = (1400, 900);

pub struct Browser {
    ns: Netns,
    dir: PathBuf,
    driver: Option<Child>,
    rt: tokio::runtime::Runtime,
    client: Option<Client>,
}

impl Browser {
    /// Starts chromedriver in `ns` and opens a headless Chromium session.
    /// Panics (naming the Debian package) if either is not installed.
    #[must_use]
    pub fn start(ns: &Netns) -> Self {
        require_root();
        for (bin, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: the browser tests need Debian's {package} package \
                 (apt-get install {package}, or cargo xtask setup)"
            );
        }
        let dir = std::env::temp_dir().join(names::unique("browser"));
        fs::create_dir_all(dir.join("profile")).expect("browser temp dir");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let mut me = Self {
            ns: ns.clone(),
            dir,
            driver: None,
            rt,
            client: None,
        };
        let port = me.start_driver();
        let caps = me.capabilities();
        let url = format!("http://127.0.0.1:{port}");
        let client = me
            .in_ns(|| {
                me.rt.block_on(async {
                    ClientBuilder::new(HttpConnector::new())
                        .capabilities(caps)
                        .connect(&url)
                        .await
                })
            })
            .unwrap_or_else(|e| {
                panic!(
                    "starting headless Chromium through chromedriver: {e}\nchromedriver log:\n{}",
                    me.driver_log()
                )
            });
        me.client = Some(client);
        me
    }

    /// Starts chromedriver on a free loopback port of the namespace and
    /// waits until it accepts connections; returns the port.
    fn start_driver(&mut self) -> u16 {
        let port = self
            .in_ns(|| {
                TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
                    .and_then(|l| l.local_addr())
                    .map(|a| a.port())
            })
            .expect("a free loopback port in the namespace");
        let mut cmd = Command::new(CHROMEDRIVER);
        cmd.arg(format!("--port={port}"))
            .arg(format!(
                "--log-path={}",
                self.dir.join("chromedriver.log").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(self.dir.join("chromedriver.stderr")).expect("log"));
        process::enter(&mut cmd, &self.ns);
        self.driver = Some(
            cmd.spawn()
                .expect("start chromedriver (Debian package chromium-driver)"),
        );
        let deadline = Instant::now() + crate::patience(Duration::from_secs(20));
        while self.in_ns(|| TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err()) {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on 127.0.0.1:{port}; log:\n{}",
                self.driver_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        port
    }

    fn capabilities(&self) -> serde_json::Map<String, Value> {
        let profile = self.dir.join("profile");
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            format!("--user-data-dir={}", profile.display()),
            format!("--window-size={},{}", WINDOW.0, WINDOW.1),
            "--force-device-scale-factor=1".to_owned(),
            "--hide-scrollbars".to_owned(),
            "--no-first-run".to_owned(),
            "--no-default-browser-check".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-default-apps".to_owned(),
            "--disable-extensions".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-breakpad".to_owned(),
            "--mute-audio".to_owned(),
        ];
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
        });
        match caps {
            Value::Object(m) => m,
            _ => unreachable!("a JSON object literal"),
        }
    }

    /// Runs `f` on a thread inside the browser's namespace.
    fn in_ns<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.ns.run(f).expect("enter the browser's namespace")
    }

    /// Runs a `WebDriver` exchange with the session, inside the namespace.
    pub fn call<T, F, Fut>(&self, f: F) -> T
    where
        T: Send,
        F: FnOnce(Client) -> Fut + Send,
        Fut: Future<Output = T>,
    {
        let client = self.client.clone().expect("a browser session");
        self.in_ns(|| self.rt.block_on(f(client)))
    }

    /// chromedriver's log (it includes Chromium's start-up errors).
    #[must_use]
    pub fn driver_log(&self) -> String {
        let mut log = fs::read_to_string(self.dir.join("chromedriver.log")).unwrap_or_default();
        log.push_str(&fs::read_to_string(self.dir.join("chromedriver.stderr")).unwrap_or_default());
        log
    }

    /// Navigates to `url` and waits for the document to load.
    pub fn goto(&self, url: &str) {
        self.call(|c| async move { c.goto(url).await })
            .unwrap_or_else(|e| panic!("loading {url}: {e}"));
    }

    /// The value of the JavaScript function body `script` (`return ...`).
    #[must_use]
    pub fn eval(&self, script: &str) -> Value {
        self.call(|c| async move { c.execute(script, Vec::new()).await })
            .unwrap_or_else(|e| panic!("running {script:?}: {e}"))
    }

    /// Like [`Self::eval`] for a script that ends by calling its last
    /// argument (`arguments[arguments.length - 1]`) with the result.
    #[must_use]
    pub fn eval_async(&self, script: &str) -> Value {
        self.call(|c| async move { c.execute_async(script, Vec::new()).await })
            .unwrap_or_else(|e| panic!("running {script:?}: {e}"))
    }

    /// Evaluates `script` until it gives something other than `null` or
    /// `false`, and returns that; panics naming `what` and the last value
    /// after `timeout` (stretched by [`crate::patience`]).
    pub fn wait_for(&self, what: &str, timeout: Duration, script: &str) -> Value {
        let timeout = crate::patience(timeout);
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.eval(script);
            if !matches!(v, Value::Null | Value::Bool(false)) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {timeout:?}; the script {script:?} last gave {v}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The attributes `names` of every element matching `css`, read
    /// through `WebDriver` (the DOM as rendered, not the page's model).
    #[must_use]
    pub fn attributes(&self, css: &str, names: &[&str]) -> Vec<Vec<Option<String>>> {
        self.call(|c| async move {
            let mut rows = Vec::new();
            for e in c.find_all(Locator::Css(css)).await? {
                let mut row = Vec::new();
                for n in names {
                    row.push(e.attr(n).await?);
                }
                rows.push(row);
            }
            Ok::<_, fantoccini::error::CmdError>(rows)
        })
        .unwrap_or_else(|e| panic!("reading {names:?} of {css:?}: {e}"))
    }

    /// Whether an element matching `css` is displayed.
    #[must_use]
    pub fn is_displayed(&self, css: &str) -> bool {
        self.call(|c| async move { c.find(Locator::Css(css)).await?.is_displayed().await })
            .unwrap_or_else(|e| panic!("finding {css:?}: {e}"))
    }

    /// Clicks the first element matching `css`.
    pub fn click(&self, css: &str) {
        self.call(|c| async move { c.find(Locator::Css(css)).await?.click().await })
            .unwrap_or_else(|e| panic!("clicking {css:?}: {e}"));
    }

    /// Moves the mouse pointer to `(x, y)`, in CSS pixels from the top
    /// left of the viewport: the page gets the events a user's pointer
    /// makes (`mousemove`, hover).
    pub fn move_mouse(&self, x: f64, y: f64) {
        self.call(|c| async move {
            let mouse = MouseActions::new("mouse".into()).then(PointerAction::MoveTo {
                duration: None,
                x,
                y,
            });
            c.perform_actions(mouse).await
        })
        .unwrap_or_else(|e| panic!("moving the mouse to ({x}, {y}): {e}"));
    }

    /// Types `text` into the first element matching `css`.
    pub fn type_into(&self, css: &str, text: &str) {
        self.call(|c| async move { c.find(Locator::Css(css)).await?.send_keys(text).await })
            .unwrap_or_else(|e| panic!("typing into {css:?}: {e}"));
    }

    /// Writes a PNG of the window to `path`.
    pub fn screenshot(&self, path: &Path) {
        let png = self
            .call(|c| async move { c.screenshot().await })
            .unwrap_or_else(|e| panic!("taking a screenshot: {e}"));
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("screenshot dir");
        }
        fs::write(path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// Kills every process still running with this fixture's profile
    /// (Chromium and its helpers, started by our chromedriver).
    fn kill_leftovers(&self) {
        let profile = format!("--user-data-dir={}", self.dir.join("profile").display());
        let Ok(entries) = fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == profile.as_bytes())
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            // Ends the session: chromedriver quits Chromium.
            let _ = self.ns.run(|| {
                self.rt.block_on(async {
                    tokio::time::timeout(Duration::from_secs(5), client.close()).await
                })
            });
        }
        if let Some(mut driver) = self.driver.take() {
            if let Ok(pid) = i32::try_from(driver.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let deadline = Instant::now() + Duration::from_secs(3);
            while matches!(driver.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = driver.kill();
            let _ = driver.wait();
        }
        self.kill_leftovers();
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("removing {}: {e}", self.dir.display());
        }
    }
}
