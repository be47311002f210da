//! The commands the Markdown docs quote, checked against the binaries'
//! own `--help`: every `health-agent ...` and `cargo xtask ...` command in
//! a fenced code block or an inline code span names only subcommands and
//! options that exist. Std only: the agent's tests include this file too.

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    path::Path,
};

/// A program the docs quote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Program {
    /// `health-agent ...`
    Agent,
    /// `cargo xtask ...`
    Xtask,
}

impl Program {
    /// How the docs write it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Agent => "health-agent",
            Self::Xtask => "cargo xtask",
        }
    }
}

/// One command quoted in a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quoted {
    /// `file:line` where it is quoted.
    pub place: String,
    pub program: Program,
    /// The words after the program, as quoted (brackets of optional parts
    /// taken off, a trailing comment and anything after `--` or a pipe
    /// left out).
    pub words: Vec<String>,
}

impl fmt::Display for Quoted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: `{} {}`",
            self.place,
            self.program.name(),
            self.words.join(" ")
        )
    }
}

/// What one `--help` lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Help {
    /// Options, long and short (`--output`, `-o`).
    pub options: BTreeSet<String>,
    pub subcommands: BTreeSet<String>,
}

impl Help {
    /// Reads clap's help text: option lines (indented at most 6 spaces,
    /// starting with `-`) and the `Commands:` section.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut help = Self::default();
        let mut in_commands = false;
        for line in text.lines() {
            if !line.starts_with(' ') {
                in_commands = line.trim_end() == "Commands:";
                continue;
            }
            let indent = line.len() - line.trim_start().len();
            let body = line.trim_start();
            if indent <= 6 && body.starts_with('-') {
                let head = body.split("  ").next().unwrap_or(body);
                for part in head.split(", ") {
                    let word = part.split_whitespace().next().unwrap_or("");
                    let word = word.split(['=', '[', '<']).next().unwrap_or("");
                    if word.len() > 1 {
                        help.options.insert(word.to_owned());
                    }
                }
            } else if in_commands
                && indent <= 6
                && let Some(name) = body.split_whitespace().next()
            {
                help.subcommands.insert(name.to_owned());
            }
        }
        help
    }
}

/// The commands quoted in `text` (a Markdown document named `file`).
#[must_use]
pub fn quoted(file: &str, text: &str) -> Vec<Quoted> {
    let mut found: Vec<Quoted> = Vec::new();
    let mut pending = String::new();
    for (n, line) in block_lines(text) {
        // Shell lines continued with a backslash are one command.
        if let Some(head) = line.trim_end().strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        found.extend(command(file, n, &pending));
        pending.clear();
    }
    found.extend(
        code_spans(text)
            .into_iter()
            .filter_map(|(n, span)| command(file, n, &span)),
    );
    found.sort_by_key(|q| {
        let line = q.place.rsplit(':').next().unwrap_or("0");
        line.parse::<usize>().unwrap_or(0)
    });
    found
}

/// The lines inside fenced code blocks, with their numbers.
fn block_lines(text: &str) -> Vec<(usize, &str)> {
    let mut lines = Vec::new();
    let mut fence: Option<&str> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match fence {
            Some(marker) if trimmed.starts_with(marker) => fence = None,
            Some(_) => lines.push((i + 1, line)),
            None if trimmed.starts_with("```") => fence = Some("```"),
            None if trimmed.starts_with("~~~") => fence = Some("~~~"),
            None => {}
        }
    }
    lines
}

/// The inline code spans outside code blocks, with the line each starts
/// on; a span may go on over a line break, not over a blank line.
fn code_spans(text: &str) -> Vec<(usize, String)> {
    let inside: std::collections::HashSet<usize> =
        block_lines(text).into_iter().map(|(n, _)| n).collect();
    let mut found = Vec::new();
    let mut paragraph: Vec<(usize, &str)> = Vec::new();
    let lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    for (n, line) in lines.chain(std::iter::once((0, ""))) {
        let fence = line.trim_start().starts_with("```") || line.trim_start().starts_with("~~~");
        if n == 0 || line.trim().is_empty() || inside.contains(&n) || fence {
            found.extend(spans_of(&paragraph));
            paragraph.clear();
        } else {
            paragraph.push((n, line));
        }
    }
    found
}

/// The code spans of one paragraph.
fn spans_of(paragraph: &[(usize, &str)]) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (n, line) in paragraph {
        for (k, piece) in line.split('`').enumerate() {
            if k > 0 {
                // A backtick: a span opens or closes here.
                match open.take() {
                    Some(span) => found.push(span),
                    None => open = Some((*n, String::new())),
                }
            }
            if let Some((_, span)) = open.as_mut() {
                if !span.is_empty() {
                    span.push(' ');
                }
                span.push_str(piece);
            }
        }
    }
    found
}

/// The command on one line of a code block or in one span, if it starts
/// (after a prompt, `sudo` or environment settings) with a quoted program.
fn command(file: &str, line: usize, text: &str) -> Option<Quoted> {
    let text = text.split(" #").next().unwrap_or(text);
    let text = text.split(" | ").next().unwrap_or(text);
    let mut words = text.split_whitespace().peekable();
    while let Some(w) = words.peek() {
        if *w == "$" || *w == "sudo" || (w.contains('=') && !w.starts_with('-')) {
            words.next();
        } else {
            break;
        }
    }
    let first = words.next()?;
    let program = match first {
        "health-agent" => Program::Agent,
        "cargo" if words.peek() == Some(&"xtask") => {
            words.next();
            Program::Xtask
        }
        _ => return None,
    };
    let words = words
        .take_while(|w| *w != "--" && *w != "&&" && *w != ";")
        .map(|w| w.trim_matches(['[', ']', '(', ')', ',', ';', ':', '`']))
        .map(|w| w.strip_suffix('.').unwrap_or(w))
        .filter(|w| !w.is_empty() && !w.contains("..."))
        .map(str::to_owned)
        .collect();
    Some(Quoted {
        place: format!("{file}:{line}"),
        program,
        words,
    })
}

/// What was wrong with a quoted command.
pub type Problem = String;

/// Checks `cmd` against the help of each subcommand it names:
/// `help(path)` is the `--help` text of the program with the subcommands
/// `path`. A word of the form `a|b` where a subcommand may come checks
/// each alternative.
pub fn check<E: fmt::Display>(
    cmd: &Quoted,
    help: &mut impl FnMut(&[String]) -> Result<String, E>,
) -> Vec<Problem> {
    let mut cache: HashMap<Vec<String>, Help> = HashMap::new();
    let mut problems = Vec::new();
    walk(cmd, &cmd.words, Vec::new(), help, &mut cache, &mut problems);
    problems
}

fn walk<E: fmt::Display>(
    cmd: &Quoted,
    words: &[String],
    mut path: Vec<String>,
    help: &mut impl FnMut(&[String]) -> Result<String, E>,
    cache: &mut HashMap<Vec<String>, Help>,
    problems: &mut Vec<Problem>,
) {
    let mut descending = true;
    for (i, word) in words.iter().enumerate() {
        let Some(h) = help_of(cmd, &path, help, cache, problems) else {
            return;
        };
        if let Some(flag) = word.strip_prefix('-').map(|_| word.as_str()) {
            descending = false;
            let flag = flag.split('=').next().unwrap_or(flag);
            if flag.len() > 1 && !h.options.contains(flag) {
                problems.push(format!(
                    "{cmd}: `{flag}` is not an option of `{}` (its --help lists {})",
                    shown(cmd.program, &path),
                    h.options.iter().cloned().collect::<Vec<_>>().join(" ")
                ));
            }
        } else if descending {
            let alternatives: Vec<&str> = word.split('|').collect();
            if alternatives.len() > 1 && alternatives.iter().all(|a| h.subcommands.contains(*a)) {
                for a in alternatives {
                    let mut branch = path.clone();
                    branch.push(a.to_owned());
                    walk(cmd, &words[i + 1..], branch, help, cache, problems);
                }
                return;
            }
            if h.subcommands.contains(word.as_str()) {
                path.push(word.clone());
            } else {
                descending = false;
            }
        }
    }
    // The subcommand itself must answer --help.
    let _ = help_of(cmd, &path, help, cache, problems);
}

fn help_of<E: fmt::Display>(
    cmd: &Quoted,
    path: &[String],
    help: &mut impl FnMut(&[String]) -> Result<String, E>,
    cache: &mut HashMap<Vec<String>, Help>,
    problems: &mut Vec<Problem>,
) -> Option<Help> {
    if let Some(h) = cache.get(path) {
        return Some(h.clone());
    }
    match help(path) {
        Ok(text) => {
            let h = Help::parse(&text);
            cache.insert(path.to_vec(), h.clone());
            Some(h)
        }
        Err(e) => {
            problems.push(format!(
                "{cmd}: `{} --help` failed: {e}",
                shown(cmd.program, path)
            ));
            None
        }
    }
}

fn shown(program: Program, path: &[String]) -> String {
    std::iter::once(program.name())
        .chain(path.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The fenced blocks marked `yaml`, as (`file:line` of the fence, text).
#[must_use]
pub fn yaml_blocks(file: &str, text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match open.as_mut() {
            Some(_) if trimmed.starts_with("```") => {
                if let Some((n, body)) = open.take() {
                    found.push((format!("{file}:{n}"), body));
                }
            }
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None if trimmed.starts_with("```yaml") => open = Some((i + 1, String::new())),
            None => {}
        }
    }
    found
}

/// Options of other programs that the docs quote alone in inline code
/// (`--client-cert-auth` is etcd's), with the program: an option quoted
/// alone must be the agent's or one of these. The `cargo xtask` ones are
/// checked against its `--help` in its own test.
pub const OTHER_PROGRAMS: &[(&str, &str)] = &[
    ("--auto-compaction-mode", "etcd"),
    ("--auto-compaction-retention", "etcd"),
    ("--cert-file", "etcd"),
    ("--client-cert-auth", "etcd"),
    ("--key-file", "etcd"),
    ("--trusted-ca-file", "etcd"),
    ("--unsafe-no-fsync", "etcd"),
    ("--cacert", "etcdctl"),
    ("--cert", "etcdctl"),
    ("--endpoints", "etcdctl"),
    ("--key", "etcdctl"),
    ("--prefix", "etcdctl"),
    ("--user", "etcdctl"),
    ("--bpf-expand-memcpy-in-order", "bpf-linker"),
    ("--disable-expand-memcpy-in-order", "bpf-linker"),
    ("--kernel", "cargo xtask"),
    ("--network-thread", "cargo xtask"),
    ("--no-lint", "cargo xtask"),
    ("--nodes", "cargo xtask"),
    ("--peers", "cargo xtask"),
    ("--release", "cargo xtask"),
    ("--zones", "cargo xtask"),
];

/// The options quoted alone in inline code outside code blocks
/// (`--probe-interval`, `--attach auto|tcx|tc`), as (`file:line`, option);
/// `--ct-lifetime-*` stands for every option it starts.
#[must_use]
pub fn bare_options(file: &str, text: &str) -> Vec<(String, String)> {
    code_spans(text)
        .into_iter()
        .filter_map(|(n, span)| {
            let word = span.split([' ', '=', '[', '/', '|', ',']).next()?;
            let name = word.strip_prefix("--")?;
            let plain = name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '*');
            (!name.is_empty() && plain).then(|| (format!("{file}:{n}"), word.to_owned()))
        })
        .collect()
}

/// Every option of the program and of all its subcommands, walking the
/// `Commands:` of each `--help`.
pub fn every_option<E: fmt::Display>(
    help: &mut impl FnMut(&[String]) -> Result<String, E>,
) -> Result<BTreeSet<String>, String> {
    let mut options = BTreeSet::new();
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        let text = help(&path).map_err(|e| format!("{path:?} --help: {e}"))?;
        let h = Help::parse(&text);
        options.extend(h.options);
        for sub in h.subcommands.into_iter().filter(|s| s != "help") {
            let mut next = path.clone();
            next.push(sub);
            todo.push(next);
        }
    }
    Ok(options)
}

/// Whether `option` (maybe `--prefix-*`) is among `options`.
#[must_use]
pub fn names_one_of(option: &str, options: &BTreeSet<String>) -> bool {
    match option.strip_suffix('*') {
        Some(prefix) => options.iter().any(|o| o.starts_with(prefix)),
        None => options.contains(option),
    }
}

/// The documents whose commands are checked, under the workspace `root`:
/// `README.md`, `BENCHMARKS.md` and every `docs/*.md`, as (name, text).
pub fn documents(root: &Path) -> std::io::Result<Vec<(String, String)>> {
    let mut names = vec!["README.md".to_owned(), "BENCHMARKS.md".to_owned()];
    let mut in_docs: Vec<String> = std::fs::read_dir(root.join("docs"))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .filter_map(|p| Some(format!("docs/{}", p.file_name()?.to_string_lossy())))
        .collect();
    in_docs.sort();
    names.extend(in_docs);
    names
        .into_iter()
        .filter(|n| root.join(n).exists())
        .map(|n| std::fs::read_to_string(root.join(&n)).map(|t| (n, t)))
        .collect()
}

/// Every command of `program` quoted in the documents under the workspace
/// `root`, checked against `help` (see [`check`]): how many there are, and
/// their problems.
///
/// # Panics
///
/// A document cannot be read (the checks run as tests).
pub fn check_quoted<E: fmt::Display>(
    root: &Path,
    program: Program,
    help: &mut impl FnMut(&[String]) -> Result<String, E>,
) -> (usize, Vec<Problem>) {
    let documents = documents(root).expect("reading the docs");
    let commands: Vec<_> = documents
        .iter()
        .flat_map(|(name, text)| quoted(name, text))
        .filter(|q| q.program == program)
        .collect();
    let problems = commands.iter().flat_map(|q| check(q, help)).collect();
    (commands.len(), problems)
}

/// `binary PATH... --help`: its text, or what it printed on failure. The
/// agent's socket variable is cleared so that no environment changes a
/// default the help prints.
pub fn help(binary: &Path, path: &[String]) -> Result<String, String> {
    let out = std::process::Command::new(binary)
        .args(path)
        .arg("--help")
        .env_remove("HEALTH_AGENT_SOCK")
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        String::from_utf8(out.stdout).map_err(|e| e.to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS_HELP: &str = "\
Prints the cluster's health

Usage: health-agent status [OPTIONS]

Options:
  -v, --verbose
          Per path
      --probe
          A fresh round first
  -o, --output <FORMAT>
          text or json

          - json: one object
  -h, --help
          Print help
";

    const TOP_HELP: &str = "\
Usage: health-agent <COMMAND>

Commands:
  daemon     Run the agent
  status     Print the status
  responder  The echo responder alone
  help       Print this message

Options:
  -h, --help     Print help
  -V, --version  Print version
";

    fn fake(path: &[String]) -> Result<String, String> {
        match path.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            [] => Ok(TOP_HELP.to_owned()),
            ["status"] => Ok(STATUS_HELP.to_owned()),
            ["daemon"] => Ok("Options:\n      --probe-interval <D>\n".to_owned()),
            ["responder"] => Ok("Commands:\n  run  Run\n  stats  Counters\n".to_owned()),
            ["responder", "run"] => Ok("Options:\n      --iface <IFACE>\n".to_owned()),
            ["responder", "stats"] => Ok("Options:\n  -o, --output <F>\n".to_owned()),
            _ => Err(format!("no such command: {path:?}")),
        }
    }

    fn problems(doc: &str) -> Vec<Problem> {
        quoted("doc.md", doc)
            .iter()
            .flat_map(|q| check(q, &mut fake))
            .collect()
    }

    #[test]
    fn help_lists_options_and_subcommands_not_descriptions() {
        let h = Help::parse(STATUS_HELP);
        let want = [
            "--help",
            "--output",
            "--probe",
            "--verbose",
            "-h",
            "-o",
            "-v",
        ];
        assert_eq!(h.options, want.iter().map(|s| (*s).to_owned()).collect());
        let top = Help::parse(TOP_HELP);
        assert!(top.subcommands.contains("responder"));
        assert!(top.options.contains("--version"));
    }

    #[test]
    fn commands_in_blocks_and_spans_are_found_with_their_lines() {
        let doc = "# Title\n\nRun `health-agent status\n--verbose` or:\n\n```sh\n\
                   $ sudo health-agent status --probe \\\n    -o json   # fresh\n\
                   HEALTH_X=1 cargo xtask test --kernel 6.1 -- --exact foo\n\
                   systemctl enable --now health-agent\n```\n";
        let q = quoted("doc.md", doc);
        let shown: Vec<String> = q.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "doc.md:3: `health-agent status --verbose`",
                "doc.md:8: `health-agent status --probe -o json`",
                "doc.md:9: `cargo xtask test --kernel 6.1`",
            ]
        );
    }

    #[test]
    fn existing_flags_pass() {
        let doc = "`health-agent status [--verbose] [--probe] [-o json]`, \
                   `health-agent responder run|stats`, `health-agent responder run --iface eth0`";
        assert_eq!(problems(doc), Vec::<Problem>::new());
    }

    #[test]
    fn a_flag_that_does_not_exist_fails_naming_it() {
        let p = problems("```\nhealth-agent status --verbose --bogus\n```\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("doc.md:2: `health-agent status --verbose --bogus`: `--bogus` is not an option of `health-agent status`"),
            "{}",
            p[0]
        );
        // A flag of another subcommand is not enough.
        let p = problems("`health-agent responder stats --iface eth0`");
        assert_eq!(p.len(), 1, "{p:?}");
        // Nor in one branch of alternatives.
        let p = problems("`health-agent responder run|stats -o json`");
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("of `health-agent responder run`"), "{}", p[0]);
    }

    #[test]
    fn options_quoted_alone_are_found_outside_blocks() {
        let doc = "Set `--probe-interval 10s` or `--attach auto|tcx|tc`;\n\
                   `--ct-lifetime-*` and `-o` and `health-agent status`.\n\
                   ```\n`--not-this`\n```\n`--bogus-flag`\n";
        let found: Vec<String> = bare_options("doc.md", doc)
            .into_iter()
            .map(|(place, o)| format!("{place} {o}"))
            .collect();
        assert_eq!(
            found,
            [
                "doc.md:1 --probe-interval",
                "doc.md:1 --attach",
                "doc.md:2 --ct-lifetime-*",
                "doc.md:6 --bogus-flag",
            ]
        );
        let options = every_option(&mut fake).expect("every help answers");
        assert!(options.contains("--iface") && options.contains("--probe"));
        assert!(names_one_of("--verb*", &options));
        assert!(names_one_of("--iface", &options));
        // The one a doc made up is not among them.
        assert!(!names_one_of("--bogus-flag", &options));
        assert!(!names_one_of("--bog*", &options));
    }

    #[test]
    fn yaml_blocks_are_found_with_their_fence_line() {
        let doc =
            "text\n```yaml\nprobe-interval: 3s\n```\n```sh\nls\n```\n```yaml\nnodes: []\n```\n";
        let blocks = yaml_blocks("doc.md", doc);
        assert_eq!(
            blocks,
            [
                ("doc.md:2".to_owned(), "probe-interval: 3s\n".to_owned()),
                ("doc.md:8".to_owned(), "nodes: []\n".to_owned()),
            ]
        );
    }

    #[test]
    fn a_word_that_is_no_subcommand_is_an_argument() {
        // `foo` is taken as an argument of the top level: its flags are
        // checked there.
        assert_eq!(
            problems("`health-agent foo --version`"),
            Vec::<Problem>::new()
        );
        assert_eq!(problems("`health-agent foo --verbose`").len(), 1);
    }
}
