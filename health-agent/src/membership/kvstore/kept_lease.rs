//! The lease a previous run kept in the state directory: read back, asked
//! of etcd before it is taken over, and written for the next run.
//!
//! The file is hostile until etcd confirms it: a state directory copied
//! with a machine's image names the original node's lease, and an agent
//! that took it over would keep that node's keys alive after it died and
//! delete them when it leaves (a leave revokes the lease). A kept lease is
//! taken over only while it is alive, granted with the TTL configured now,
//! and holding keys, every one of them this node's; otherwise it is left
//! alone (never revoked) and a new lease is granted.

use std::path::Path;

use etcd_client::{LeaseClient, LeaseTimeToLiveOptions};
use tracing::{info, warn};

use super::{KvError, LeaseFile, REQUEST_TIMEOUT, call_error};

/// What etcd's answer makes of a kept lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Alive, with the configured TTL, holding only this node's keys.
    Adopt,
    /// Ended: etcd no longer has it.
    Ended,
    /// Alive and holding no key: nothing to keep, and nothing says whose.
    Empty,
    /// Granted with another TTL than the one configured now.
    OtherTtl { granted: i64 },
    /// Holding a key that is not this node's (the first, as text), among
    /// `keys` keys.
    Foreign { key: String, keys: usize },
    /// etcd would not say which keys it holds: this node's user may not
    /// read them, so they are not its own.
    Unreadable { detail: String },
}

/// Judges a lease from etcd's answer: its remaining and granted TTL (s),
/// its keys; against this node's keys and the TTL configured now.
pub(super) fn judge(
    ttl: i64,
    granted: i64,
    keys: &[Vec<u8>],
    own: &[Vec<u8>],
    want_ttl: i64,
) -> Verdict {
    if ttl <= 0 {
        return Verdict::Ended;
    }
    if let Some(key) = keys.iter().find(|k| !own.contains(k)) {
        return Verdict::Foreign {
            key: String::from_utf8_lossy(key).into_owned(),
            keys: keys.len(),
        };
    }
    if keys.is_empty() {
        return Verdict::Empty;
    }
    if granted != want_ttl {
        return Verdict::OtherTtl { granted };
    }
    Verdict::Adopt
}

/// Asks etcd about lease `id`, kept in `file`. An error is etcd not
/// answering (asked again with the next session); a refusal to list the
/// lease's keys is a verdict.
pub(super) async fn check(
    leases: &mut LeaseClient,
    id: i64,
    file: &LeaseFile,
    want_ttl: i64,
) -> Result<Verdict, KvError> {
    const OP: &str = "checking the lease the last run kept";
    let asked = leases.time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()));
    match tokio::time::timeout(REQUEST_TIMEOUT, asked).await {
        Err(_) => Err(KvError::Timeout {
            op: OP.into(),
            timeout: REQUEST_TIMEOUT,
        }),
        Ok(Ok(r)) => Ok(judge(
            r.ttl(),
            r.granted_ttl(),
            r.keys(),
            &file.own_keys,
            want_ttl,
        )),
        Ok(Err(etcd_client::Error::GRpcStatus(s))) => match s.code() {
            tonic::Code::NotFound => Ok(Verdict::Ended),
            tonic::Code::PermissionDenied => Ok(Verdict::Unreadable {
                detail: s.message().to_owned(),
            }),
            _ => Err(call_error(OP)(etcd_client::Error::GRpcStatus(s))),
        },
        Ok(Err(e)) => Err(call_error(OP)(e)),
    }
}

/// Logs what became of lease `id`, named by `path`.
pub(super) fn report(verdict: &Verdict, id: i64, path: &Path) {
    let path = path.display();
    match verdict {
        Verdict::Adopt => {
            info!(lease = %format!("{id:x}"), %path, "taking over the lease the last run kept: it holds this node's keys alone");
        }
        Verdict::Ended => {}
        Verdict::Empty => {
            info!(lease = %format!("{id:x}"), %path, "the lease the last run kept holds no key: a new one is granted");
        }
        Verdict::OtherTtl { granted } => info!(
            lease = %format!("{id:x}"), %path, granted_ttl_s = granted,
            "the lease the last run kept was granted with another TTL than configured: a new one is granted, the old one ends by its TTL"
        ),
        Verdict::Foreign { key, keys } => warn!(
            lease = %format!("{id:x}"), %path, keys,
            "{path} names etcd lease {id:x}, which holds {key:?}, not this node's key (a state directory copied from another node?): it is left alone and a new lease granted"
        ),
        Verdict::Unreadable { detail } => warn!(
            lease = %format!("{id:x}"), %path,
            "{path} names etcd lease {id:x}, whose keys this node may not read ({detail}): it is left alone and a new lease granted"
        ),
    }
}

/// The lease ID a previous run kept in `path`: hexadecimal, positive;
/// anything else (a missing or damaged file) is ignored and a new lease
/// granted.
pub(super) fn read(path: &Path) -> Option<i64> {
    let text = std::fs::read(path).ok()?;
    if text.len() > 32 {
        return None;
    }
    let id = i64::from_str_radix(std::str::from_utf8(&text).ok()?.trim(), 16).ok()?;
    (id > 0).then_some(id)
}

/// Keeps `lease` in `path` (removes the file with `None`), for the next
/// run to take over; a failure is logged, not fatal.
pub(super) fn save(path: &Path, lease: Option<i64>) {
    let result = match lease {
        Some(id) => path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, format!("{id:x}\n"))?;
                std::fs::rename(&tmp, path)
            }),
        None => match std::fs::remove_file(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        },
    };
    if let Err(e) = result {
        warn!(path = %path.display(), "keeping the etcd lease's ID for the next run: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::{Verdict, judge, read, save};

    fn keys(names: &[&str]) -> Vec<Vec<u8>> {
        names.iter().map(|n| n.as_bytes().to_vec()).collect()
    }

    #[test]
    fn a_kept_lease_is_taken_over_only_holding_this_nodes_keys_alone() {
        let own = keys(&["/h/nodes/a", "/h/summaries/a"]);
        let judged = |ttl, granted, held: &[&str]| judge(ttl, granted, &keys(held), &own, 900);
        assert_eq!(judged(600, 900, &["/h/nodes/a"]), Verdict::Adopt);
        assert_eq!(
            judged(600, 900, &["/h/summaries/a", "/h/nodes/a"]),
            Verdict::Adopt
        );
        assert_eq!(
            judged(600, 900, &["/h/nodes/a", "/h/nodes/b"]),
            Verdict::Foreign {
                key: "/h/nodes/b".into(),
                keys: 2
            }
        );
        // A key that only begins like this node's is another's.
        assert_eq!(
            judged(600, 900, &["/h/nodes/ab"]),
            Verdict::Foreign {
                key: "/h/nodes/ab".into(),
                keys: 1
            }
        );
        assert_eq!(judged(600, 900, &[]), Verdict::Empty);
        assert_eq!(
            judged(600, 15, &["/h/nodes/a"]),
            Verdict::OtherTtl { granted: 15 }
        );
        // Ended first: etcd answers -1 for a lease it no longer has.
        assert_eq!(judged(-1, 0, &[]), Verdict::Ended);
        assert_eq!(judged(0, 900, &["/h/nodes/b"]), Verdict::Ended);
    }

    #[test]
    fn a_kept_lease_is_read_back_and_junk_ignored() {
        let dir = std::env::temp_dir().join(format!("kvstore-lease-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("etcd-lease");
        for (content, want) in [
            (&b"694d8b1e2f3a\n"[..], Some(0x694d_8b1e_2f3a)),
            (b"0\n", None),
            (b"-5", None),
            (b"not hex", None),
            (&[b'1'; 40][..], None),
        ] {
            std::fs::write(&file, content).expect("write");
            assert_eq!(read(&file), want, "{content:?}");
        }
        assert_eq!(read(&dir.join("absent")), None);
        save(&file, Some(0x1234));
        assert_eq!(read(&file), Some(0x1234));
        save(&file, None);
        assert!(!file.exists(), "removed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
