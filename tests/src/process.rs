//! Running programs as the processes of a node: inside its network
//! namespace only (the mount namespace is shared, as with `nsenter --net`).

use std::{
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    process::Command,
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
