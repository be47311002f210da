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
    let mut found = Vec::new();
    let mut fence: Option<String> = None;
    let mut prose = String::new();
    let mut prose_start = 1;
    let mut pending = String::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        let trimmed = line.trim_start();
        if let Some(marker) = &fence {
            if trimmed.starts_with(marker.as_str()) {
                fence = None;
                continue;
            }
            // Shell lines continued with a backslash are one command.
            if let Some(head) = line.trim_end().strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            pending.push_str(line);
            found.extend(command(file, n, &pending));
            pending.clear();
        } else if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            found.extend(spans(file, prose_start, &prose));
            prose.clear();
            prose_start = n + 1;
            fence = Some(trimmed[..3].to_owned());
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    found.extend(spans(file, prose_start, &prose));
    found
}

/// The commands in the inline code spans of `prose`, which starts at line
/// `first` (a span may go on over a line break).
fn spans(file: &str, first: usize, prose: &str) -> Vec<Quoted> {
    let mut found = Vec::new();
    let mut rest = prose;
    let mut line = first;
    while let Some(open) = rest.find('`') {
        line += rest[..open].matches('\n').count();
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else { break };
        let span = &after[..close];
        // A blank line ends a paragraph, and a span with it.
        if !span.contains("\n\n") {
            found.extend(command(file, line, &span.replace('\n', " ")));
        }
        line += span.matches('\n').count();
        rest = &after[close + 1..];
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
