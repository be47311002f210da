//! `health-lab`'s benchmarks: they stop on Ctrl-C and remove what they
//! made (the namespaces, the bpffs pins and the run's directory), and with
//! the simulated network in a thread of its own every live peer answers;
//! an agent that ends fails the run at once (the round, soak and page
//! benches; at its start, mid-run, or at the soak's next sample), with
//! its exit status and its log.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use health_agent::{datapath::remove_pins, sys::netns::Netns};
use health_tests::{
    agent::{lab_binary, socket_in},
    names, require_root,
};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// The directories where a lab run makes things named after its pid.
const PLACES: [&str; 2] = [health_agent::sys::netns::NETNS_RUN_DIR, "/sys/fs/bpf"];

/// What a process made, by the pid in its names (`htest-<pid>-...`).
fn made_by(pid: u32) -> Vec<PathBuf> {
    let prefix = names::of_pid(pid);
    PLACES
        .iter()
        .map(PathBuf::from)
        .chain([std::env::temp_dir()])
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect()
}

/// A round bench that runs until it is stopped: 1,000 rounds of 20
/// answering peers, a round a second.
const ENDLESS_ROUNDS: [&str; 9] = [
    "bench-round",
    "--peers",
    "20",
    "--silent",
    "0",
    "--rounds",
    "1000",
    "--interval",
    "1s",
];

/// The processes other than `pid` whose command line names what `pid`
/// made (its agent, by its namespaces' and directories' names).
fn processes_of(pid: u32) -> Vec<i32> {
    let prefix = names::of_pid(pid);
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| i64::from(p) != i64::from(pid))
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&prefix))
        })
        .collect()
}

/// The lab process, killed with its agent and its leftovers removed if
/// the test fails.
struct Run(Child);

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        for p in processes_of(self.0.id()) {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        let end = Instant::now() + Duration::from_secs(2);
        while !processes_of(self.0.id()).is_empty() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        for path in made_by(self.0.id()) {
            if path.starts_with(health_agent::sys::netns::NETNS_RUN_DIR) {
                let _ = Netns::at(path).delete();
            } else if path.starts_with("/sys/fs/bpf") {
                let _ = remove_pins(&path);
            } else {
                let _ = std::fs::remove_dir_all(path);
            }
        }
    }
}

impl Run {
    /// `health-lab ARGS`, with `env` set, its stderr kept.
    fn lab(args: &[&str], env: &[(&str, &str)]) -> Self {
        let child = Command::new(lab_binary())
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("health-lab runs");
        Self(child)
    }

    /// SIGKILL to the run's one agent.
    fn kill_agent(&self) {
        let agents = processes_of(self.0.id());
        assert_eq!(agents.len(), 1, "one agent: {agents:?}");
        kill(Pid::from_raw(agents[0]), Signal::SIGKILL).expect("SIGKILL");
    }

    /// Its exit status and what it wrote to stderr, once it ends; a
    /// failure if it still runs after `within` (`after`: since what).
    fn ended_within(&mut self, within: Duration, after: &str) -> (ExitStatus, String) {
        let end = Instant::now() + within;
        let status = loop {
            if let Some(s) = self.0.try_wait().expect("wait") {
                break s;
            }
            assert!(
                Instant::now() < end,
                "health-lab still runs {} s after {after}",
                within.as_secs()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut stderr = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            e.read_to_string(&mut stderr).expect("stderr");
        }
        (status, stderr)
    }
}

/// The run's directory once its agent's socket is there.
fn socket_up(pid: u32, within: Duration) -> Option<PathBuf> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(dir) = made_by(pid)
            .into_iter()
            .find(|p| p.starts_with(std::env::temp_dir()) && socket_in(p).exists())
        {
            return Some(dir);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[test]
fn a_benchmark_interrupted_stops_its_agent_and_removes_what_it_made() {
    require_root();
    let mut run = Run::lab(&ENDLESS_ROUNDS, &[]);
    let pid = run.0.id();
    let dir = socket_up(pid, Duration::from_secs(60)).expect("the agent's socket within 60 s");
    // A round or two, then Ctrl-C to the lab alone (its agent is stopped
    // by the lab, not by the terminal's signal), twice 20 ms apart as a
    // terminal's Ctrl-C reaches it through `cargo xtask`: one request.
    std::thread::sleep(Duration::from_secs(2));
    let lab = Pid::from_raw(i32::try_from(pid).expect("pid"));
    kill(lab, Signal::SIGINT).expect("SIGINT");
    std::thread::sleep(Duration::from_millis(20));
    kill(lab, Signal::SIGINT).expect("SIGINT");
    let (status, stderr) = run.ended_within(Duration::from_secs(30), "Ctrl-C");
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_eq!(made_by(pid), Vec::<PathBuf>::new(), "{stderr}");
    assert_eq!(processes_of(pid), Vec::<i32>::new(), "its agent still runs");
    assert!(!Path::new(&dir).exists());
}

#[test]
fn with_the_network_in_a_thread_every_echo_is_answered() {
    require_root();
    let child = Command::new(lab_binary())
        .args(["bench-round", "--peers", "200", "--silent", "50"])
        .args(["--rounds", "3", "--interval", "2s", "--network-thread"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("health-lab runs");
    let mut run = Run(child);
    let end = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = run.0.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < end, "health-lab still runs after 120 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut o) = run.0.stdout.take() {
        o.read_to_string(&mut out).expect("stdout");
    }
    if let Some(mut e) = run.0.stderr.take() {
        e.read_to_string(&mut err).expect("stderr");
    }
    // The run fails on any live path not OK or any MTU black hole: the
    // echoes and the MTU probes of the last rounds were all answered.
    assert!(status.success(), "{out}\n{err}");
    let answered = out
        .lines()
        .find_map(|l| l.strip_prefix("the peers' echo, answered by the lab: "))
        .unwrap_or_else(|| panic!("no count of the lab's echo replies:\n{out}"));
    let (replies, not_sent) = answered
        .split_once(" replies, ")
        .unwrap_or_else(|| panic!("{answered}"));
    assert_eq!(not_sent, "0 not sent", "{out}");
    // 100 live peers (the last 50 of each hundred), two addresses each,
    // over 3 rounds (counted before fping runs).
    assert!(replies.parse::<u64>().expect("a count") >= 3 * 200, "{out}");
    assert!(
        out.contains("after the last round: 400/400 live paths OK, 0 silent paths OK (false OK), 0 MTU black holes (false)"),
        "{out}"
    );
}

#[test]
fn an_agent_that_refuses_its_flags_fails_the_benchmark_at_once_with_its_words() {
    require_root();
    let mut run = Run::lab(
        &[
            "bench-round",
            "--peers",
            "100",
            "--silent",
            "50",
            "--rounds",
            "2",
        ],
        &[("BENCH_AGENT_ARGS", "--probe-spread 0s")],
    );
    let pid = run.0.id();
    // Not after the 60 s the socket is given.
    let (status, err) = run.ended_within(Duration::from_secs(45), "its start");
    assert!(!status.success(), "{err}");
    // The agent's own error is in the bench's: the run's directory, and
    // the log in it, are gone.
    assert!(
        err.contains("the agent ended before its socket served: the agent exited (exit status: 2)"),
        "{err}"
    );
    assert!(err.contains("'--probe-spread <PROBE_SPREAD>'"), "{err}");
    assert!(err.contains("must be more than zero"), "{err}");
    assert_eq!(made_by(pid), Vec::<PathBuf>::new(), "{err}");
}

/// Runs `health-lab ARGS` until its agent serves, waits `settle` and
/// kills the agent; then checks that the lab ended within `within`,
/// failed, said the agent was killed right after `said`, gave its log,
/// and left nothing behind.
fn killed_agent(args: &[&str], settle: Duration, within: Duration, said: &str) {
    let mut run = Run::lab(args, &[]);
    let pid = run.0.id();
    socket_up(pid, Duration::from_secs(60)).expect("the agent's socket within 60 s");
    std::thread::sleep(settle);
    run.kill_agent();
    let (status, stderr) = run.ended_within(within, "its agent was killed");
    assert!(!status.success(), "{stderr}");
    let expected = format!("{said}: the agent exited (signal: 9 (SIGKILL)); ");
    assert!(stderr.contains(&expected), "{expected:?} in:\n{stderr}");
    // Its log, empty or not, is accounted for.
    assert!(stderr.contains("its log"), "{stderr}");
    assert_eq!(made_by(pid), Vec::<PathBuf>::new(), "{stderr}");
}

#[test]
fn a_soak_whose_agent_is_killed_stops_saying_so_and_removes_what_it_made() {
    require_root();
    // Found at the next sample (every 10 s), not at the soak's end.
    killed_agent(
        &[
            "bench-soak",
            "--peers",
            "20",
            "--minutes",
            "1",
            "--interval",
            "1s",
        ],
        Duration::ZERO,
        Duration::from_secs(30),
        "s into the soak",
    );
}

#[test]
fn a_round_bench_whose_agent_is_killed_stops_at_once_saying_so() {
    require_root();
    // Its rounds under way (the bench past the socket's first answer);
    // stopped long before the deadline of 1,000 rounds.
    killed_agent(
        &ENDLESS_ROUNDS,
        Duration::from_secs(2),
        Duration::from_secs(20),
        " of 1000 rounds",
    );
}

#[test]
fn a_page_bench_whose_agent_is_killed_stops_at_once_saying_so() {
    require_root();
    // Killed before its first round ends (a timeout of 1 s, every peer
    // silent): the bench stops then, not at its deadline, nor later for
    // want of an agent behind the page.
    killed_agent(
        &["bench-page", "--peers", "20"],
        Duration::ZERO,
        Duration::from_secs(20),
        "before a round showing 20 failing peers",
    );
}

/// The main job (`cargo xtask run`, `health-lab demo`) prints where node
/// 1's page and metrics are on the host; a browser there, naming that
/// address as its `Host`, is answered.
#[test]
fn the_demo_serves_node_1s_page_at_the_address_it_prints() {
    use std::io::{BufRead as _, Write as _};

    require_root();
    let child = Command::new(lab_binary())
        .args(["demo", "--nodes", "2", "--seconds", "60", "--no-redraw"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("health-lab runs");
    let mut run = Run(child);
    let stdout = run.0.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let printed = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the page's address printed within 60 s");
        if let Some(url) = line
            .strip_prefix("node-1 metrics: http://")
            .and_then(|rest| rest.strip_suffix("/metrics"))
        {
            break url.to_owned();
        }
    };
    assert!(printed.starts_with("127.0.0.1:"), "{printed}");
    let end = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let mut s = std::net::TcpStream::connect(&printed).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        // Until node 1's listener is up, the forwarder closes what it
        // accepted: the request may then find the connection gone.
        let sent = write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: {printed}\r\nConnection: close\r\n\r\n"
        );
        let mut answer = String::new();
        if sent.is_ok() {
            let _ = s.read_to_string(&mut answer);
        }
        if answer.starts_with("HTTP/1.1 200") || Instant::now() > end {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("health_build_info"), "{answer}");
}
