//! `health-agent status --watch` run beside a test, its rows read as they
//! come.

use std::{
    io::{BufRead as _, BufReader, Read as _},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc::{Receiver, channel},
    time::{Duration, Instant},
};

/// A row of `status --watch`.
#[derive(Debug)]
pub struct WatchRow {
    pub seq: u64,
    /// When the round ended, RFC 3339 to the second (UTC): rows compare
    /// by it as strings.
    pub ended: String,
    pub unreachable: usize,
    /// The nodes not reachable, as the row names them.
    pub names: String,
}

/// `health-agent status --watch` on an agent's socket, killed when dropped.
pub struct Watching {
    child: Child,
    lines: Receiver<String>,
    /// Where the names' column starts.
    names_at: usize,
    rows: Vec<WatchRow>,
}

impl Watching {
    /// Starts it on `socket`, and waits for its header and its first row
    /// (the round published now).
    #[must_use]
    pub fn start(socket: &Path) -> Self {
        let mut child = Command::new(crate::agent::agent_binary())
            .args(["status", "--watch", "--socket"])
            .arg(socket)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("status --watch");
        let out = child.stdout.take().expect("its output");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut watching = Self {
            child,
            lines,
            names_at: 0,
            rows: Vec::new(),
        };
        let header = watching.line("its header");
        assert!(header.starts_with("ROUND"), "{header}");
        watching.names_at = header.find("NOT REACHABLE").expect("the names' column");
        watching.next_row();
        watching
    }

    /// The next line, within 15 s.
    fn line(&self, what: &str) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(15))
            .unwrap_or_else(|e| panic!("no line for {what} ({e}): {:#?}", self.rows))
    }

    /// Reads the next row.
    fn next_row(&mut self) {
        let line = self.line("a row");
        let cells: Vec<&str> = line.split_whitespace().collect();
        self.rows.push(WatchRow {
            seq: cells[0].parse().expect("a round number"),
            ended: cells[1].to_owned(),
            unreachable: cells[5].parse().expect("a count"),
            names: line
                .get(self.names_at..)
                .unwrap_or_default()
                .trim()
                .to_owned(),
        });
    }

    /// Reads rows until `enough` says the rows so far are (within 30 s):
    /// those rows.
    pub fn rows_until(&mut self, enough: impl Fn(&[WatchRow]) -> bool) -> &[WatchRow] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !enough(&self.rows) {
            assert!(
                Instant::now() < deadline,
                "not the rows awaited within 30 s: {:#?}",
                self.rows
            );
            self.next_row();
        }
        &self.rows
    }

    /// Stops it: what it wrote on stderr.
    #[must_use]
    pub fn stop(mut self) -> String {
        let _ = self.child.kill();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
