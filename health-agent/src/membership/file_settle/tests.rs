use std::{io::Write as _, path::PathBuf};

use super::*;

/// A rename into place seen.
const RENAMED: Look = Look {
    renamed: true,
    closed: None,
};

/// A directory of its own for a test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("settle-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn an_in_place_change_is_taken_once_it_stayed_the_same_for_the_quiet_time() {
    let dir = Scratch::new("quiet");
    let path = dir.0.join("nodes.yaml");
    std::fs::write(&path, "nodes: []\n").expect("write");
    let (_, v) = FileVersion::read(&path).expect("read");
    let (t0, wall) = (Instant::now(), SystemTime::now());
    let mut s = Settling::default();
    assert!(!s.offer(v, Look::UNWATCHED, t0, wall), "just written");
    assert_eq!(s.pending(), Some(v));
    assert!(!s.offer(v, Look::UNWATCHED, t0 + QUIET / 2, wall));
    assert!(
        s.offer(v, Look::UNWATCHED, t0 + QUIET, wall),
        "unchanged for QUIET"
    );
    assert_eq!(s.pending(), None);
    // Changed meanwhile: the quiet time starts again.
    let mut s = Settling::default();
    assert!(!s.offer(v, Look::UNWATCHED, t0, wall));
    std::fs::write(&path, "nodes: [ ]\n").expect("write");
    let (_, w) = FileVersion::read(&path).expect("read");
    assert!(
        !s.offer(w, Look::UNWATCHED, t0 + QUIET, wall),
        "another version"
    );
    assert!(s.offer(w, Look::UNWATCHED, t0 + 2 * QUIET, wall));
    // A renamed file at once; an old one at once.
    assert!(Settling::default().offer(w, RENAMED, t0, wall));
    let later = SystemTime::now() + Duration::from_secs(2);
    assert!(Settling::default().offer(w, Look::UNWATCHED, t0, later));
}

#[test]
fn a_read_during_a_write_is_never_taken() {
    let dir = Scratch::new("torn");
    let path = dir.0.join("nodes.yaml");
    std::fs::write(&path, "nodes: []\n").expect("write");
    let (_, v) = FileVersion::read(&path).expect("read");
    // What a read looks like when the file changed under it.
    let torn = v.torn();
    let mut s = Settling::default();
    let later = SystemTime::now() + Duration::from_secs(60);
    assert!(
        !s.offer(torn, RENAMED, Instant::now(), later),
        "not even renamed or old"
    );
    assert_eq!(s.pending(), None);
}

#[test]
fn renames_into_place_are_seen_and_in_place_writes_are_not() {
    let dir = Scratch::new("renames");
    let path = dir.0.join("nodes.yaml");
    std::fs::write(&path, "nodes: []\n").expect("write");
    let renames = Renames::watch(&path).expect("inotify");
    assert!(!renames.renamed_in());
    std::fs::write(&path, "nodes: [ ]\n").expect("in place");
    assert!(!renames.renamed_in(), "written in place");
    let other = dir.0.join("other.yaml");
    std::fs::write(dir.0.join("tmp"), "x").expect("write");
    std::fs::rename(dir.0.join("tmp"), &other).expect("rename");
    assert!(!renames.renamed_in(), "another file");
    std::fs::write(dir.0.join("tmp"), "nodes: []\n").expect("write");
    std::fs::rename(dir.0.join("tmp"), &path).expect("rename");
    assert!(renames.renamed_in());
    assert!(!renames.renamed_in(), "drained");
}

#[test]
fn at_start_a_file_being_written_is_read_once_it_stopped_changing() {
    let dir = Scratch::new("start");
    let path = dir.0.join("nodes.yaml");
    let first = "nodes:\n  - name: node-1\n    node-ip: 198.18.0.11\n    health-ip: 198.18.64.2\n";
    let second = "  - name: node-2\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n";
    let mut f = std::fs::File::create(&path).expect("create");
    f.write_all(first.as_bytes()).expect("first half");
    f.flush().expect("flush");
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        f.write_all(second.as_bytes()).expect("second half");
    });
    let started = Instant::now();
    let (text, _) =
        read_settled(&path, Duration::from_millis(20), Duration::from_secs(10)).expect("read");
    writer.join().expect("writer");
    assert_eq!(
        text,
        format!("{first}{second}").into_bytes(),
        "never the first half alone"
    );
    assert!(started.elapsed() >= Duration::from_millis(400) + QUIET);
    // A file that keeps changing is refused, saying why.
    std::fs::write(&path, first).expect("rewrite");
    let e = read_settled(&path, Duration::from_millis(20), Duration::ZERO)
        .expect_err("just written: not settled within no time");
    assert!(e.to_string().contains("still being written"), "{e}");
}

/// The nodes' names in the published set.
fn names(nodes: &super::super::published::Nodes) -> Vec<String> {
    nodes.current().iter().map(|n| n.name.clone()).collect()
}

fn record(n: u8) -> String {
    format!(
        "  - name: node-{n}\n    node-ip: 198.18.0.{n}\n    health-ip: 198.18.{}.2\n",
        63 + n
    )
}

/// The watcher of `path` (its version read at start as `seen`) as
/// node-1's agent runs it, polling every `poll`: the set it publishes,
/// and how to stop it.
async fn watcher(
    path: &Path,
    poll: Duration,
) -> (
    super::super::published::Nodes,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    use super::super::{discovery::NodeSource, published::Nodes, record::LocalNode};
    let (_, seen) = read_settled(path, Duration::from_millis(20), Duration::from_secs(5))
        .expect("read at start");
    let nodes = Nodes::new("file".into());
    let source = NodeSource::File {
        path: path.to_owned(),
        poll,
        local: LocalNode {
            name: Some("node-1".into()),
            ..LocalNode::default()
        },
        seen: Some(seen),
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn({
        let (nodes, stop) = (nodes.clone(), stop.clone());
        async move { source.run(nodes, stop).await }
    });
    // Its directory watched before the test writes, as a running
    // agent's is.
    tokio::time::sleep(Duration::from_millis(50)).await;
    (nodes, stop, task)
}

/// The watcher over a real file (its first version seen at start, the
/// published set still empty): a writer that writes it in place in
/// two halves, pausing between them, never has its first half applied
/// (which parses, as node-1 and a node-4 without its health address,
/// and would list node-4 as rejected), nor any error or rejected record
/// shown meanwhile; the whole file is applied once it stopped
/// changing. A replacement renamed into place is applied at once.
#[tokio::test]
async fn the_watcher_applies_a_file_whole_once_stable_and_a_rename_at_once() {
    let dir = Scratch::new("watcher");
    let path = dir.0.join("nodes.yaml");
    std::fs::write(&path, format!("nodes:\n{}{}", record(1), record(2))).expect("write");
    let (nodes, stop, watcher) = watcher(&path, Duration::from_millis(20)).await;

    let first = format!(
        "nodes:\n{}  - name: node-4\n    node-ip: 198.18.0.4\n",
        record(1)
    );
    let second = "    health-ip: 198.18.67.2\n";
    let mut f = std::fs::File::create(&path).expect("truncate");
    f.write_all(first.as_bytes()).expect("first half");
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        f.write_all(second.as_bytes()).expect("second half");
    });
    let started = Instant::now();
    let whole = loop {
        let (now, status) = (names(&nodes), nodes.status());
        assert!(
            status.error.is_none() && status.rejected.is_empty(),
            "a half-written file is never judged: {status:?}"
        );
        if !now.is_empty() {
            break now;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never applied");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    writer.join().expect("writer");
    assert_eq!(whole, ["node-1", "node-4"], "the whole file, at once");
    assert!(
        started.elapsed() >= Duration::from_millis(500) + QUIET,
        "once it stopped changing: {:?}",
        started.elapsed()
    );
    assert_eq!(nodes.status().rejected_total, 0);

    // Replaced by a rename: applied within a few polls, well before
    // the quiet time.
    let tmp = dir.0.join("nodes.yaml.tmp");
    std::fs::write(&tmp, format!("nodes:\n{}{}", record(1), record(5))).expect("write");
    let renamed = Instant::now();
    std::fs::rename(&tmp, &path).expect("rename");
    while names(&nodes) != ["node-1", "node-5"] {
        assert!(renamed.elapsed() < Duration::from_secs(5), "never applied");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(renamed.elapsed() < QUIET / 2, "{:?}", renamed.elapsed());
    stop.cancel();
    watcher.await.expect("watcher");
}

/// An in-place edit first read when it is not two seconds old, and
/// found unchanged once it is, at the next poll: taken then, not left
/// waiting for good.
#[tokio::test]
async fn an_edit_read_young_is_taken_once_it_is_old_enough() {
    let dir = Scratch::new("young-edit");
    let path = dir.0.join("nodes.yaml");
    std::fs::write(&path, format!("nodes:\n{}", record(1))).expect("write");
    // Read 1.5 s after the edit (young: waiting), then at 3 s (old).
    let (nodes, stop, watcher) = watcher(&path, Duration::from_millis(1_500)).await;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("open");
    f.write_all(record(2).as_bytes()).expect("in place");
    drop(f);
    let edited = Instant::now();
    while names(&nodes) != ["node-1", "node-2"] {
        assert!(
            edited.elapsed() < Duration::from_secs(8),
            "never taken: {:?}",
            nodes.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    watcher.await.expect("watcher");
}

/// A file replaced by something the watcher must not read (a device
/// behind a symbolic link), cannot read as text (Latin-1), or whose
/// every record is rejected (a field misspelt in all) is refused once,
/// naming why and the file, and not read again while it stays; the set
/// in use stays. A good file renamed in afterwards is applied and the
/// error cleared.
#[tokio::test]
async fn a_file_that_cannot_be_read_keeps_the_set_and_is_reported_once() {
    let dir = Scratch::new("refused");
    let path = dir.0.join("nodes.yaml");
    std::fs::write(&path, format!("nodes:\n{}{}", record(1), record(2))).expect("write");
    let (nodes, stop, watcher) = watcher(&path, Duration::from_millis(20)).await;
    let wait_for = async |what: &str, done: &dyn Fn() -> bool| {
        let started = Instant::now();
        while !done() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never {what}: {:?}",
                nodes.status()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let swap = |write: &dyn Fn(&Path)| {
        let tmp = dir.0.join("next.yaml");
        write(&tmp);
        std::fs::rename(&tmp, &path).expect("rename");
    };
    // The version seen at start is not published again: a new one is.
    swap(&|tmp: &Path| {
        std::fs::write(tmp, format!("nodes:\n{}{}", record(2), record(1))).expect("write");
    });
    wait_for("applied", &|| names(&nodes) == ["node-1", "node-2"]).await;
    for (what, says) in [
        ("device", "a device, not a regular file"),
        (
            "latin-1",
            "nodes.yaml:2: not UTF-8 text: byte 20 of the file is not",
        ),
        (
            "all bad",
            "every record rejected, the set in use stays: 2 node records rejected",
        ),
    ] {
        let before = nodes.updates_rejected();
        swap(&|tmp: &Path| match what {
            "device" => std::os::unix::fs::symlink("/dev/zero", tmp).expect("symlink"),
            "latin-1" => std::fs::write(tmp, b"nodes:\n  - name: caf\xe9\n").expect("write"),
            _ => std::fs::write(
                tmp,
                format!("nodes:\n{}{}", record(1), record(2)).replace("node-ip", "nodeip"),
            )
            .expect("write"),
        });
        wait_for("refused", &|| nodes.status().error.is_some()).await;
        let error = nodes.status().error.expect("an error");
        assert!(
            error.contains(&*path.to_string_lossy()) && error.contains(says),
            "{what}: {error}"
        );
        // Many polls later: reported once, the set kept.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(nodes.updates_rejected(), before + 1, "{what}");
        assert_eq!(names(&nodes), ["node-1", "node-2"], "{what}");
        swap(&|tmp: &Path| {
            std::fs::write(tmp, format!("nodes:\n{}{}", record(1), record(3))).expect("write");
        });
        wait_for("recovered", &|| {
            names(&nodes) == ["node-1", "node-3"] && nodes.status().error.is_none()
        })
        .await;
        std::fs::write(
            dir.0.join("next.yaml"),
            format!("nodes:\n{}{}", record(1), record(2)),
        )
        .expect("write");
        std::fs::rename(dir.0.join("next.yaml"), &path).expect("rename");
        wait_for("restored", &|| names(&nodes) == ["node-1", "node-2"]).await;
    }
    stop.cancel();
    watcher.await.expect("watcher");
}

/// A rename of the file's own name, or of the link a Kubernetes
/// projected volume swaps, is a rename into place; another name's is
/// not. A directory removed and made again is watched again.
#[test]
fn renames_are_seen_through_a_projected_volume_and_a_directory_made_again() {
    let scratch = Scratch::new("renames");
    let dir = scratch.0.join("config");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("nodes.yaml");
    std::fs::write(&path, "nodes: []\n").expect("write");
    let renames = Renames::watch(&path).expect("a watch");
    let rename_in = |name: &str| {
        let tmp = dir.join(format!("{name}.tmp"));
        std::fs::write(&tmp, "nodes: []\n").expect("write");
        std::fs::rename(&tmp, dir.join(name)).expect("rename");
    };
    assert!(!renames.renamed_in(), "nothing yet");
    rename_in("other.yaml");
    assert!(!renames.renamed_in(), "another file's rename");
    rename_in("nodes.yaml");
    assert!(renames.renamed_in());
    rename_in(ATOMIC_WRITER_LINK);
    assert!(renames.renamed_in(), "a projected volume's swap");
    std::fs::remove_dir_all(&dir).expect("remove");
    assert!(!renames.renamed_in(), "the directory went");
    std::fs::create_dir_all(&dir).expect("again");
    // The next look watches it again; a rename after it is seen.
    assert!(!renames.renamed_in());
    rename_in("nodes.yaml");
    assert!(renames.renamed_in(), "watched again");
}

/// A writer that pauses part way through an in-place write for longer
/// than the quiet time and the file's settling (a slow copy) never
/// has its first part applied: the file is taken once it closes it. A
/// writer that keeps the file open has it taken after [`OPEN_QUIET`].
#[tokio::test]
async fn a_paused_writer_is_waited_for_until_it_closes_the_file() {
    let dir = Scratch::new("paused");
    let path = dir.0.join("nodes.yaml");
    std::fs::write(&path, format!("nodes:\n{}{}", record(1), record(2))).expect("write");
    let (nodes, stop, watcher) = watcher(&path, Duration::from_millis(20)).await;
    let first = format!("nodes:\n{}", record(1));
    let mut f = std::fs::File::create(&path).expect("truncate");
    f.write_all(first.as_bytes()).expect("first part");
    let pause = Duration::from_millis(3_000);
    let writer = std::thread::spawn(move || {
        std::thread::sleep(pause);
        f.write_all(record(3).as_bytes()).expect("the rest");
        // Closed here.
    });
    let started = Instant::now();
    while names(&nodes).is_empty() {
        assert!(started.elapsed() < Duration::from_secs(10), "never applied");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    writer.join().expect("writer");
    assert_eq!(
        names(&nodes),
        ["node-1", "node-3"],
        "the whole file, never its first part"
    );
    assert!(started.elapsed() >= pause, "{:?}", started.elapsed());
    // Written whole and kept open: taken once it stayed the same for
    // OPEN_QUIET.
    let mut f = std::fs::File::create(&path).expect("truncate");
    f.write_all(format!("nodes:\n{}{}", record(1), record(4)).as_bytes())
        .expect("write");
    let written = Instant::now();
    while names(&nodes) != ["node-1", "node-4"] {
        assert!(
            written.elapsed() < OPEN_QUIET + Duration::from_secs(5),
            "never taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(written.elapsed() >= OPEN_QUIET, "{:?}", written.elapsed());
    drop(f);
    stop.cancel();
    watcher.await.expect("watcher");
}

/// The events say what the file's writer did last, in order: a write
/// closed, or a write after a close (`>` then `>>`: at work again);
/// another file's writes say nothing.
#[test]
fn the_last_write_seen_says_whether_the_writer_closed_the_file() {
    use std::io::Write as _;
    let scratch = Scratch::new("look");
    let path = scratch.0.join("nodes.yaml");
    std::fs::write(&path, "nodes: []\n").expect("write");
    let renames = Renames::watch(&path).expect("a watch");
    assert_eq!(renames.look(), Look::UNWATCHED, "nothing yet");
    std::fs::write(&path, "nodes:\n").expect("write and close");
    assert_eq!(renames.look().closed, Some(true));
    let mut more = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("append");
    more.write_all(b"  - name: a\n").expect("append");
    assert_eq!(renames.look().closed, Some(false), "at work again");
    std::fs::write(scratch.0.join("other.yaml"), "x").expect("another file");
    assert_eq!(renames.look().closed, None, "no news of this file");
    drop(more);
    assert_eq!(renames.look().closed, Some(true));
    // `>` then `>>` before a look: at work.
    std::fs::write(&path, "nodes:\n").expect("write and close");
    let mut again = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("append");
    again.write_all(b"  - name: a\n").expect("append");
    assert_eq!(renames.look().closed, Some(false));
}

/// What the writer was last seen doing decides the rule: written and
/// not closed, only [`OPEN_QUIET`] unchanged takes the file (its times
/// say nothing of a paused writer); closed, or nothing seen, the quiet
/// time or settled times. A change of metadata alone (a `chmod` after
/// the copy) keeps the quiet time and what was seen.
#[test]
fn a_write_not_closed_waits_the_open_quiet_time() {
    let dir = Scratch::new("open-quiet");
    let path = dir.0.join("nodes.yaml");
    std::fs::write(&path, "nodes: []\n").expect("write");
    let (_, v) = FileVersion::read(&path).expect("read");
    let (t0, wall) = (Instant::now(), SystemTime::now());
    let old = wall + Duration::from_secs(60);
    let look = |closed| Look {
        renamed: false,
        closed,
    };
    let mut s = Settling::default();
    assert!(!s.offer(v, look(Some(false)), t0, old), "not even old");
    assert!(!s.offer(v, Look::UNWATCHED, t0 + QUIET, old), "still open");
    assert!(s.offer(v, Look::UNWATCHED, t0 + OPEN_QUIET, old));
    let mut s = Settling::default();
    assert!(!s.offer(v, look(Some(false)), t0, wall));
    assert!(
        !s.offer(v, look(Some(true)), t0 + QUIET / 2, wall),
        "closed"
    );
    assert!(s.offer(v, Look::UNWATCHED, t0 + QUIET, wall));
    // Its mode changed after the close: the same content, the same
    // quiet time.
    let mut s = Settling::default();
    assert!(!s.offer(v, look(Some(true)), t0, wall));
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let (_, chmodded) = FileVersion::read(&path).expect("read");
    assert_ne!(chmodded, v, "a new stamp");
    assert!(s.offer(chmodded, Look::UNWATCHED, t0 + QUIET, wall));
}
