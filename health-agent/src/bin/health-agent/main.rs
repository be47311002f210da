//! `health-agent`: errors reach the user here, on stderr, with their causes.
#![allow(
    clippy::print_stderr,
    reason = "the binary edge reports errors on stderr"
)]
#![allow(
    unused_crate_dependencies,
    reason = "the binary sees every dependency of the package; most serve its library"
)]

use std::process::ExitCode;

mod cli;
mod logging;

fn main() -> ExitCode {
    let (cli, invocation) = match cli::config::parse_command_line(std::env::args_os().collect()) {
        Ok(parsed) => parsed,
        Err(cli::config::ConfigFileError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("error: {}", health_agent::util::errors::chain(&e));
            return ExitCode::from(2);
        }
    };
    // The daemon creates namespaces, links and pins: a SIGINT/SIGTERM from
    // now on must stop it cleanly, so the signals are held until its
    // handlers are in place (its threads inherit the mask).
    if cli.is_daemon() {
        health_agent::util::memory::tune_allocator();
    }
    if cli.is_daemon()
        && let Err(e) = health_agent::sys::signals::hold_until_installed()
    {
        eprintln!("error: holding SIGINT/SIGTERM until the handlers are in place: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = logging::init(&cli.log_level) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli.run(invocation)) {
        Ok(()) => ExitCode::SUCCESS,
        // `| head` read what it wanted: nothing went wrong.
        Err(e) if cli::out::reader_gone(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
