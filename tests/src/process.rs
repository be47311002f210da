//! Running programs as the processes of a node: inside its network
//! namespace only (the mount namespace is shared, as with `nsenter --net`).

use std::{
    io::Read,
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use health_agent::sys::netns::Netns;

/// Makes `cmd` enter `ns` between fork and exec.
pub fn enter<'a>(cmd: &'a mut Command, ns: &Netns) -> &'a mut Command {
    let file = ns.open().expect("open the node's netns");
    // SAFETY: setns is async-signal-safe. The closure owns `file`, so the fd
    // stays open for as long as the command can spawn.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// How long a stopped program may take to exit before it is killed: an
/// agent's orderly stop (its endpoint removed) takes well under it.
pub const STOP_WITHIN: Duration = Duration::from_secs(20);

/// Sends `signal` to `child` and reaps it; one still running after
/// [`STOP_WITHIN`] is killed (SIGKILL) and reaped, so that a stop that
/// hangs never holds a test or a bench's teardown. Its exit status.
pub fn stop(
    child: &mut std::process::Child,
    signal: nix::sys::signal::Signal,
) -> Option<std::process::ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
    let deadline = Instant::now() + STOP_WITHIN;
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    child.wait().ok()
}

/// How long a program expected to exit by itself may run before it is
/// stopped: a refused daemon exits within a second, one that was wrongly
/// let start would otherwise hold its test until the suite times out.
pub const EXIT_WITHIN: Duration = Duration::from_secs(60);

/// Runs `cmd` to its exit, as [`Command::output`] does, but sends it
/// SIGTERM once it has run for `limit`, and SIGKILL 10 s later (its
/// output then says how far it got, and its status is a failure or what
/// it chose on SIGTERM).
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    let started = Instant::now();
    // SIGTERM at `limit`, SIGKILL if it is still there 10 s later.
    let mut signals = [
        (limit, nix::sys::signal::Signal::SIGTERM),
        (
            limit + Duration::from_secs(10),
            nix::sys::signal::Signal::SIGKILL,
        ),
    ]
    .into_iter()
    .peekable();
    let status = loop {
        // Not reaped until `try_wait` says so: until then the pid is the
        // child's, and a signal reaches no one else.
        if let Some(status) = child.try_wait().expect("waiting for the program") {
            break status;
        }
        if let Some((_, signal)) = signals.next_if(|&(at, _)| started.elapsed() >= at) {
            let _ = nix::sys::signal::kill(pid, signal);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().expect("its stdout"),
        stderr: stderr.join().expect("its stderr"),
    }
}
