//! Every `cargo xtask ...` command quoted in README.md, BENCHMARKS.md and
//! docs/*.md names subcommands and options that `cargo xtask` has.
#![allow(
    unused_crate_dependencies,
    reason = "an integration test sees every dependency of the package"
)]

use std::path::Path;

use xtask::docs::{self, Program};

fn help(path: &[String]) -> Result<String, String> {
    docs::help(Path::new(env!("CARGO_BIN_EXE_xtask")), path)
}

#[test]
fn every_quoted_xtask_command_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (commands, problems) = docs::check_quoted(&root, Program::Xtask, &mut help);
    // The README alone quotes `run`, `test` and `package`.
    assert!(commands >= 3, "only {commands} commands found");
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn the_options_the_docs_give_to_xtask_exist() {
    let options = docs::every_option(&mut help).expect("every --help answers");
    let missing: Vec<_> = docs::OTHER_PROGRAMS
        .iter()
        .filter(|(option, program)| *program == "cargo xtask" && !options.contains(*option))
        .collect();
    assert!(
        missing.is_empty(),
        "not options of cargo xtask: {missing:?}"
    );
}
