//! `health-agent status --watch`: a row as each round ends, its counts and
//! the first nodes it could not reach. One request a round waits for the
//! next one (`?summary=true&after=SEQ`); the unreachable nodes' names are
//! asked for only when there are some. An agent that stops (a restart, an
//! upgrade) is waited for, said once on stderr, and followed again from
//! its next round.

use std::{fmt::Write as _, io::Write, time::Duration};

use health_agent::{
    api::client::{Client, ClientError},
    probe::status::StatusSummary,
    util::timefmt::rfc3339,
};

use super::super::{OutputFormat, out::StdoutError};

/// How long each request waits for the next round before asking again.
const WAIT: Duration = Duration::from_secs(60);
/// How often an agent that does not answer is asked again.
const RETRY: Duration = Duration::from_secs(1);
/// Unreachable nodes named in a row; the rest are counted.
const NAMED: usize = 5;

/// Follows the rounds, writing a row (or, as JSON, the summary) for each
/// to `out`, until `rounds` rounds have been written (for ever without).
pub(crate) async fn watch(
    client: &Client,
    output: OutputFormat,
    rounds: Option<u64>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    if output == OutputFormat::Table {
        writeln!(out, "{}", header()).map_err(StdoutError)?;
    }
    let mut written = 0;
    // The round asked past: `None` before the first answer, and after the
    // agent stopped answering (its next run numbers rounds from 1).
    let mut seen: Option<u64> = None;
    // The last round written, by number and start: a round is written once.
    let mut last: Option<(u64, u64)> = None;
    let mut answering = Answering::default();
    while rounds.is_none_or(|n| written < n) {
        let asked = match seen {
            None => client.status_summary().await,
            Some(seq) => client.status_summary_after(seq, WAIT).await,
        };
        let Some(summary) = answering.answer(asked).await? else {
            seen = None;
            continue;
        };
        answering.back(client);
        let Some(round) = summary.round.as_ref() else {
            seen = Some(0);
            continue;
        };
        seen = Some(round.seq);
        if last == Some((round.seq, round.started_ms)) {
            continue;
        }
        let failing = if summary.unreachable > 0 {
            let asked = client.status_filtered("state=failure").await;
            // Stopped since it answered: waited for as above.
            let Some(failing) = answering.answer(asked).await? else {
                seen = None;
                continue;
            };
            // `None` when a round ended in between: this one's names are
            // gone.
            (failing.round.as_ref().map(|r| r.seq) == Some(round.seq))
                .then(|| failing.nodes.into_iter().map(|n| n.name).collect())
        } else {
            Some(Vec::new())
        };
        let line = match (output, &failing) {
            (OutputFormat::Json, _) => serde_json::to_string(&JsonRow {
                summary: &summary,
                unreachable_nodes: failing.as_deref(),
            })?,
            (OutputFormat::Table, Some(failing)) => row(&summary, failing),
            // A row names the nodes: the next round's comes next.
            (OutputFormat::Table, None) => continue,
        };
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(StdoutError)?;
        last = Some((round.seq, round.started_ms));
        written += 1;
    }
    Ok(())
}

/// Whether `e` says the agent is not answering (stopped, restarting,
/// stuck), as opposed to refusing the request: the former is waited for
/// once the agent has answered.
const fn not_answering(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Unreachable { .. } | ClientError::Http { .. } | ClientError::Timeout { .. }
    )
}

/// Whether the agent was last found not answering: said once on stderr
/// as it stops answering, once as it answers again.
#[derive(Debug, Default)]
struct Answering {
    down: bool,
    /// The agent has answered: a socket found closed to this user since
    /// is an agent restarting (its socket made, its mode not yet set).
    answered: bool,
}

impl Answering {
    /// What `asked` answered; `None` once an agent that does not answer
    /// has been waited for ([`Self::lost`]); the error it refused with.
    async fn answer<T>(&mut self, asked: Result<T, ClientError>) -> Result<Option<T>, ClientError> {
        match asked {
            Ok(answer) => Ok(Some(answer)),
            Err(e) if self.waits_for(&e) => {
                self.lost(&e).await;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether `e` is waited for rather than reported: only once the agent
    /// has answered (then it is an agent restarting: its socket gone, or
    /// made and its mode not yet set). Before that, a socket that does not
    /// answer is a wrong `--socket` or a stopped agent: reported at once.
    fn waits_for(&self, e: &ClientError) -> bool {
        self.answered && (not_answering(e) || matches!(e, ClientError::Forbidden { .. }))
    }

    /// Says once that the agent does not answer (`e`), and waits
    /// [`RETRY`] before it is asked again.
    async fn lost(&mut self, e: &ClientError) {
        if !std::mem::replace(&mut self.down, true) {
            eprintln!(
                "{}; asking again every {}",
                health_agent::util::errors::chain(e),
                humantime::format_duration(RETRY)
            );
        }
        tokio::time::sleep(RETRY).await;
    }

    fn back(&mut self, client: &Client) {
        self.answered = true;
        if std::mem::take(&mut self.down) {
            eprintln!("the agent at {} answers again", client.socket().display());
        }
    }
}

/// The table's header.
fn header() -> String {
    format!(
        "{:<8} {:<20} {:>8} {:>7} {:>10} {:>12} {:>8}  NOT REACHABLE",
        "ROUND", "ENDED", "TOOK", "NODES", "REACHABLE", "UNREACHABLE", "UNKNOWN"
    )
}

/// A round's line of JSON: its summary and the names of its unreachable
/// nodes, all of them (`null` when a round ended before they were asked
/// for).
#[derive(serde::Serialize)]
struct JsonRow<'a> {
    #[serde(flatten)]
    summary: &'a StatusSummary,
    unreachable_nodes: Option<&'a [String]>,
}

/// A round's row: `failing` are the unreachable nodes' names, the first
/// [`NAMED`] shown.
fn row(s: &StatusSummary, failing: &[String]) -> String {
    let (seq, ended, took) = s.round.as_ref().map_or_else(
        || ("-".to_owned(), "-".to_owned(), "-".to_owned()),
        |r| {
            (
                r.seq.to_string(),
                rfc3339(r.started_ms.saturating_add(r.duration_ms)),
                format!("{}.{:02}s", r.duration_ms / 1000, r.duration_ms % 1000 / 10),
            )
        },
    );
    let mut line = format!(
        "{seq:<8} {ended:<20} {took:>8} {:>7} {:>10} {:>12} {:>8}  ",
        s.nodes, s.reachable, s.unreachable, s.unknown
    );
    line.push_str(&failing[..failing.len().min(NAMED)].join(", "));
    if failing.len() > NAMED {
        let _ = write!(line, " and {} more", failing.len() - NAMED);
    }
    line.trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use health_agent::probe::status::RoundInfo;

    use super::*;

    fn summary(seq: u64, unreachable: usize) -> StatusSummary {
        StatusSummary {
            local_node: None,
            round: Some(RoundInfo {
                seq,
                started_ms: 1_764_300_000_000,
                duration_ms: 1_060,
                probes: 40_004,
            }),
            encryption: None,
            nodes: 10_000,
            reachable: 10_000 - unreachable,
            unreachable,
            unknown: 0,
        }
    }

    #[test]
    fn a_row_names_the_first_unreachable_nodes_and_counts_the_rest() {
        let names: Vec<String> = (1..=8).map(|i| format!("node-{i}")).collect();
        let line = row(&summary(42, 8), &names);
        assert_eq!(
            line,
            "42       2025-11-28T03:20:01Z    1.06s   10000       9992            8        0  \
             node-1, node-2, node-3, node-4, node-5 and 3 more"
        );
        let header = header();
        assert_eq!(
            header.find("NOT REACHABLE"),
            line.find("node-1"),
            "{header}\n{line}"
        );
        assert!(!row(&summary(43, 0), &[]).ends_with(' '));
    }

    /// Answers one request on `listener` with `body` as JSON; with `gone`,
    /// the socket is removed before the answer is written, as an agent
    /// stopping right after it answered would leave it.
    async fn answer_one(
        listener: tokio::net::UnixListener,
        path: &std::path::Path,
        body: String,
        gone: bool,
    ) -> Option<tokio::net::UnixListener> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        let (mut conn, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut buf = [0_u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).await.expect("read");
            assert!(n > 0, "the request ended early");
            head.extend_from_slice(&buf[..n]);
        }
        let listener = if gone {
            drop(listener);
            std::fs::remove_file(path).expect("remove the socket");
            None
        } else {
            Some(listener)
        };
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(answer.as_bytes()).await.expect("write");
        listener
    }

    /// An agent that stops between a round's summary and the names of its
    /// unreachable nodes is waited for, not an error: its next round is
    /// written once it answers again.
    /// Removes a test socket's directory, even on a panic.
    struct Dir(std::path::PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A directory of its own for a test's socket (`name`), the socket's
    /// path and its listener.
    fn agent_socket(name: &str) -> (Dir, std::path::PathBuf, tokio::net::UnixListener) {
        let dir =
            Dir(std::env::temp_dir().join(format!("health-watch-{name}-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).expect("dir");
        let path = dir.0.join("agent.sock");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        (dir, path, listener)
    }

    #[tokio::test]
    async fn an_agent_stopping_between_the_two_questions_is_waited_for() {
        let (_dir, path, listener) = agent_socket("stops");
        let server = {
            let path = path.clone();
            tokio::spawn(async move {
                let first = serde_json::to_string(&summary(7, 1)).expect("json");
                answer_one(listener, &path, first, true).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                let listener = tokio::net::UnixListener::bind(&path).expect("bind again");
                let next = serde_json::to_string(&summary(1, 0)).expect("json");
                answer_one(listener, &path, next, false).await;
            })
        };
        let mut out = Vec::new();
        let watched = tokio::time::timeout(
            Duration::from_secs(10),
            watch(&Client::new(&path), OutputFormat::Table, Some(1), &mut out),
        )
        .await
        .expect("a row within 10 s");
        server.abort();
        watched.expect("waited for, not an error");
        let out = String::from_utf8(out).expect("utf-8");
        let rows: Vec<&str> = out.lines().skip(1).collect();
        assert_eq!(rows.len(), 1, "{out}");
        assert!(rows[0].starts_with("1 "), "the next run's round: {out}");
    }

    /// A line of JSON carries the round's counts and every unreachable
    /// node's name, as the table's row names the first of them.
    #[tokio::test]
    async fn a_json_line_names_every_unreachable_node() {
        use health_agent::probe::{
            path::PathState,
            status::{ClusterStatus, Connectivity, NodeStatus},
        };

        let (_dir, path, listener) = agent_socket("json");
        let failing = |name: &str| NodeStatus {
            name: name.to_owned(),
            host: Connectivity::new(
                std::net::Ipv4Addr::new(198, 18, 0, 3),
                PathState::default(),
                PathState::default(),
            ),
            endpoint: Connectivity::new(
                std::net::Ipv4Addr::new(198, 19, 0, 3),
                PathState::default(),
                PathState::default(),
            ),
            host_secondary: None,
            endpoint_secondary: None,
        };
        let round = summary(7, 6);
        let filtered = ClusterStatus {
            local_node: None,
            probe_interval_ms: 60_000,
            probe_timeout_ms: 1_000,
            round: round.round.clone(),
            encryption: None,
            nodes: (1..=6).map(|i| failing(&format!("node-{i}"))).collect(),
        };
        let socket = path.clone();
        let server = tokio::spawn(async move {
            let body = serde_json::to_string(&round).expect("json");
            let listener = answer_one(listener, &path, body, false).await;
            let body = serde_json::to_string(&filtered).expect("json");
            answer_one(listener.expect("listening"), &path, body, false).await;
        });
        let mut out = Vec::new();
        let client = Client::new(&socket);
        tokio::time::timeout(
            Duration::from_secs(10),
            watch(&client, OutputFormat::Json, Some(1), &mut out),
        )
        .await
        .expect("a line within 10 s")
        .expect("watched");
        server.await.expect("the fake agent answered both");
        let line: serde_json::Value = serde_json::from_slice(&out).expect("one line of JSON");
        assert_eq!(line["round"]["seq"], 7, "{line}");
        assert_eq!(line["unreachable"], 6, "{line}");
        let names: Vec<&str> = line["unreachable_nodes"]
            .as_array()
            .expect("names")
            .iter()
            .filter_map(|n| n.as_str())
            .collect();
        assert_eq!(
            names,
            ["node-1", "node-2", "node-3", "node-4", "node-5", "node-6"],
            "every one, not the first five: {line}"
        );
    }

    /// A socket closed to this user, or one nothing answers on, is
    /// reported at once, unless the agent has answered before: then it is
    /// an agent restarting, waited for.
    #[test]
    fn a_socket_is_waited_for_only_after_the_agent_answered() {
        let forbidden = || ClientError::Forbidden {
            path: "/run/health/agent.sock".into(),
            source: std::io::ErrorKind::PermissionDenied.into(),
        };
        let gone = ClientError::Unreachable {
            path: "/run/health/agent.sock".into(),
            source: std::io::ErrorKind::NotFound.into(),
        };
        let mut answering = Answering::default();
        assert!(!answering.waits_for(&gone), "never answered: reported");
        assert!(
            !answering.waits_for(&forbidden()),
            "never answered: reported"
        );
        answering.back(&Client::new("/run/health/agent.sock"));
        assert!(answering.waits_for(&gone), "answered before: waited for");
        assert!(
            answering.waits_for(&forbidden()),
            "answered before: waited for"
        );
    }
}
