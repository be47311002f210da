//! Every `health-agent ...` command quoted in README.md, BENCHMARKS.md and
//! docs/*.md names subcommands and options that the agent's CLI has.
#![allow(
    unused_crate_dependencies,
    reason = "an integration test sees every dependency of the agent"
)]

#[allow(
    dead_code,
    unreachable_pub,
    reason = "the docs checker shared with `cargo xtask`'s own test, used in part"
)]
#[path = "../../xtask/src/docs.rs"]
mod docs;

use std::{path::Path, process::Command};

use docs::Program;

fn help(path: &[String]) -> Result<String, String> {
    docs::help(Path::new(env!("CARGO_BIN_EXE_health-agent")), path)
}

#[test]
fn every_quoted_agent_command_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (commands, problems) = docs::check_quoted(&root, Program::Agent, &mut help);
    assert!(commands >= 10, "only {commands} commands found");
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn every_option_quoted_alone_is_the_agents_or_named_as_another_programs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let documents = docs::documents(&root).expect("reading the docs");
    let options = docs::every_option(&mut help).expect("every --help answers");
    let quoted: Vec<_> = documents
        .iter()
        .flat_map(|(name, text)| docs::bare_options(name, text))
        .collect();
    assert!(quoted.len() >= 20, "only {} options found", quoted.len());
    let unknown: Vec<String> = quoted
        .iter()
        .filter(|(_, option)| {
            !docs::names_one_of(option, &options)
                && !docs::OTHER_PROGRAMS.iter().any(|(o, _)| o == option)
        })
        .map(|(place, option)| format!("{place}: `{option}` is no option of health-agent"))
        .collect();
    assert!(unknown.is_empty(), "\n{}", unknown.join("\n"));
}

/// A configuration file the docs show, through `health-agent config check`.
fn config_check(place: &str, body: &str) -> Option<String> {
    let file = std::env::temp_dir().join(format!(
        "docs-config-{}-{}.yaml",
        std::process::id(),
        place.replace(['/', ':', '.'], "-")
    ));
    std::fs::write(&file, body).expect("writing a scratch file");
    let out = Command::new(env!("CARGO_BIN_EXE_health-agent"))
        .args(["config", "check"])
        .arg(&file)
        .output();
    let _ = std::fs::remove_file(&file);
    match out {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "{place}: `health-agent config check` refuses it: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!("{place}: running health-agent: {e}")),
    }
}

#[test]
fn every_configuration_file_the_docs_show_is_accepted() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let documents = docs::documents(&root).expect("reading the docs");
    // Nodes files (a `nodes:` list) are not configuration files.
    let configs: Vec<_> = documents
        .iter()
        .flat_map(|(name, text)| docs::yaml_blocks(name, text))
        .filter(|(_, body)| {
            !body
                .lines()
                .any(|l| l.trim_end() == "nodes:" || l.starts_with("nodes: "))
        })
        .collect();
    assert!(!configs.is_empty(), "the README shows a configuration file");
    let refused: Vec<String> = configs
        .iter()
        .filter_map(|(place, body)| config_check(place, body))
        .collect();
    assert!(refused.is_empty(), "\n{}", refused.join("\n"));
}
