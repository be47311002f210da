//! The lease a previous run kept in the state directory: read back, asked
//! of etcd before it is taken over, and written for the next run.
//!
//! The file is hostile until etcd confirms it: a state directory copied
//! with a machine's image names the original node's lease, and an agent
//! that took it over would keep that node's keys alive after it died and
//! delete them when it leaves (a leave revokes the lease). A kept lease is
//! taken over only when it was kept in this boot (the file names the
//! kernel's boot ID: a machine or VM cloned with its node name and state
//! directory boots with another, so the clone does not take the lease;
//! copies within one boot, such as containers on one host, share the ID
//! and are told apart by the keys alone), while it is alive, asked for with the TTL configured now (the
//! file keeps that TTL beside the ID), and holding keys, every one of them
//! this node's; otherwise it is left alone (never revoked) and a new lease
//! is granted.

use std::path::Path;

use etcd_client::{LeaseClient, LeaseTimeToLiveOptions};
use tracing::{info, warn};

use super::{KvError, LeaseFile, REQUEST_TIMEOUT, call_error};

/// What etcd's answer makes of a kept lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Alive, with the configured TTL, holding only this node's keys.
    Adopt,
    /// Kept in another boot than this one (`kept`: the boot the file
    /// names; `None` when it names none, or this boot's ID cannot be
    /// read): not asked of etcd at all.
    OtherBoot { kept: Option<Box<str>> },
    /// Ended: etcd no longer has it.
    Ended,
    /// Alive and holding no key: nothing to keep, and nothing says whose.
    Empty,
    /// Asked for (or, kept by an older agent without it, granted) with
    /// another TTL than the one configured now.
    OtherTtl { was: i64 },
    /// Holding a key that is not this node's (the first, as text), among
    /// `keys` keys.
    Foreign { key: String, keys: usize },
    /// etcd would not say which keys it holds: this node's user may not
    /// read them, so they are not its own.
    Unreadable { detail: String },
    /// etcd refused the question for another reason than being away (a
    /// store without `LeaseTimeToLive`): what is not confirmed is not
    /// taken over.
    Unanswered { detail: String },
}

/// A lease ID kept in the lease file, the TTL it was asked for and the
/// boot it was kept in (neither written by older agents).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Kept {
    pub(super) id: i64,
    pub(super) ttl: Option<i64>,
    /// The kernel's boot ID when the lease was kept (`None`: the file
    /// named none, or it could not be read then).
    pub(super) boot: Option<Box<str>>,
}

impl Kept {
    /// Whether it was kept in the boot `this` (`None`: this boot's ID
    /// cannot be read): only then may it be this agent's. A lease kept in
    /// another boot, or in no boot the file names, is another machine's
    /// (a clone of this one, under its name) as far as anyone can tell.
    pub(super) fn of_boot(&self, this: Option<&str>) -> bool {
        this.is_some_and(|b| self.boot.as_deref() == Some(b))
    }
}

/// Judges a lease from etcd's answer (its remaining and granted TTL, s;
/// its keys), against this node's keys and the TTL configured now. The
/// TTL compared is the one the lease was asked for, when the file kept
/// it: etcd raises a TTL below its minimum, so the granted one can differ
/// from what was asked.
pub(super) fn judge(
    (ttl, granted): (i64, i64),
    keys: &[Vec<u8>],
    own: &[Vec<u8>],
    (asked, want_ttl): (Option<i64>, i64),
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
    let was = asked.unwrap_or(granted);
    if was != want_ttl {
        return Verdict::OtherTtl { was };
    }
    Verdict::Adopt
}

/// Asks etcd about the lease kept in `file`, when it was kept in this
/// boot (`this_boot`). An error is etcd not answering or away (asked
/// again when the lease session is retried); any other refusal is a
/// verdict: the lease is not taken over.
pub(super) async fn check(
    leases: &mut LeaseClient,
    kept: Kept,
    file: &LeaseFile,
    (want_ttl, this_boot): (i64, Option<&str>),
) -> Result<Verdict, KvError> {
    const OP: &str = "checking the lease the last run kept";
    if !kept.of_boot(this_boot) {
        // Another boot's only when this one's is known.
        let kept = this_boot.and(kept.boot);
        return Ok(Verdict::OtherBoot { kept });
    }
    let asked = leases.time_to_live(kept.id, Some(LeaseTimeToLiveOptions::new().with_keys()));
    let status = match tokio::time::timeout(REQUEST_TIMEOUT, asked).await {
        Err(_) => {
            return Err(KvError::Timeout {
                op: OP.into(),
                timeout: REQUEST_TIMEOUT,
            });
        }
        Ok(Ok(r)) => {
            return Ok(judge(
                (r.ttl(), r.granted_ttl()),
                r.keys(),
                &file.own_keys,
                (kept.ttl, want_ttl),
            ));
        }
        Ok(Err(etcd_client::Error::GRpcStatus(s))) => s,
        Ok(Err(e)) => return Err(call_error(OP)(e)),
    };
    let detail = || status.message().to_owned();
    match status.code() {
        tonic::Code::NotFound => Ok(Verdict::Ended),
        tonic::Code::PermissionDenied => Ok(Verdict::Unreadable { detail: detail() }),
        tonic::Code::Unavailable
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Cancelled
        | tonic::Code::Unknown
        | tonic::Code::Aborted
        | tonic::Code::ResourceExhausted
        | tonic::Code::Unauthenticated => {
            Err(call_error(OP)(etcd_client::Error::GRpcStatus(status)))
        }
        _ => Ok(Verdict::Unanswered { detail: detail() }),
    }
}

/// Logs what became of lease `id`, named by `path`.
pub(super) fn report(verdict: &Verdict, id: i64, path: &Path) {
    let path = path.display();
    match verdict {
        Verdict::Adopt => {
            info!(lease = %format!("{id:x}"), %path, "taking over the lease the last run kept: it holds this node's keys alone");
        }
        Verdict::OtherBoot { kept: Some(boot) } => warn!(
            lease = %format!("{id:x}"), %path, %boot,
            "{path} names etcd lease {id:x}, kept in another boot ({boot}; a machine cloned with this node's name and state directory?): it is left alone and a new lease granted"
        ),
        Verdict::OtherBoot { kept: None } => info!(
            lease = %format!("{id:x}"), %path,
            "{path} names etcd lease {id:x} but not the boot it was kept in (as older agents wrote it), or this boot's ID cannot be read: it is left alone and a new lease granted"
        ),
        Verdict::Ended => {}
        Verdict::Empty => {
            info!(lease = %format!("{id:x}"), %path, "the lease the last run kept holds no key: a new one is granted");
        }
        Verdict::OtherTtl { was } => info!(
            lease = %format!("{id:x}"), %path, ttl_s = was,
            "the lease the last run kept has another TTL than configured: a new one is granted, the old one ends by its TTL"
        ),
        Verdict::Foreign { key, keys } => warn!(
            lease = %format!("{id:x}"), %path, keys,
            "{path} names etcd lease {id:x}, which holds {key:?}, not this node's key (a state directory copied from another node?): it is left alone and a new lease granted"
        ),
        Verdict::Unreadable { detail } => warn!(
            lease = %format!("{id:x}"), %path,
            "{path} names etcd lease {id:x}, whose keys this node may not read ({detail}): it is left alone and a new lease granted"
        ),
        Verdict::Unanswered { detail } => warn!(
            lease = %format!("{id:x}"), %path,
            "etcd would not say what lease {id:x}, named in {path}, holds ({detail}): it is left alone and a new lease granted"
        ),
    }
}

/// The lease a previous run kept in `path`: its ID in hexadecimal,
/// positive, then the TTL it asked for in seconds and the boot ID it was
/// kept in (older agents wrote the ID alone, or the ID and the TTL);
/// anything else (a missing or damaged file) is ignored and a new lease
/// granted.
pub(super) fn read(path: &Path) -> Option<Kept> {
    let text = std::fs::read(path).ok()?;
    if text.len() > 128 {
        return None;
    }
    let mut words = std::str::from_utf8(&text).ok()?.split_ascii_whitespace();
    let id = i64::from_str_radix(words.next()?, 16).ok()?;
    let ttl = match words.next() {
        Some(t) => Some(t.parse::<i64>().ok().filter(|t| *t > 0)?),
        None => None,
    };
    let boot = match words.next() {
        Some(b) if is_boot_id(b) => Some(b.into()),
        Some(_) => return None,
        None => None,
    };
    (id > 0 && words.next().is_none()).then_some(Kept { id, ttl, boot })
}

/// A boot ID as the kernel writes it: a UUID, 36 characters of hex
/// digits and dashes.
fn is_boot_id(word: &str) -> bool {
    word.len() == 36 && word.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Keeps `lease` in `path` (removes the file with `None`), for the next
/// run to take over; a failure is logged, not fatal.
pub(super) fn save(path: &Path, lease: Option<Kept>) {
    let result = match lease {
        Some(Kept { id, ttl, boot }) => path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                let tmp = path.with_extension("tmp");
                let line = match (ttl, boot) {
                    (Some(t), Some(b)) => format!("{id:x} {t} {b}\n"),
                    (Some(t), None) => format!("{id:x} {t}\n"),
                    (None, _) => format!("{id:x}\n"),
                };
                std::fs::write(&tmp, line)?;
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
    use super::{Kept, Verdict, judge, read, save};

    fn keys(names: &[&str]) -> Vec<Vec<u8>> {
        names.iter().map(|n| n.as_bytes().to_vec()).collect()
    }

    #[test]
    fn a_kept_lease_is_taken_over_only_holding_this_nodes_keys_alone() {
        let own = keys(&["/h/nodes/a", "/h/summaries/a"]);
        let judged =
            |ttl, granted, held: &[&str]| judge((ttl, granted), &keys(held), &own, (None, 900));
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
            Verdict::OtherTtl { was: 15 }
        );
        // etcd raised the TTL asked for to its minimum: the TTL asked for
        // is what counts.
        let raised = |asked, want| judge((5, 8), &keys(&["/h/nodes/a"]), &own, (asked, want));
        assert_eq!(raised(Some(3), 3), Verdict::Adopt);
        assert_eq!(raised(Some(3), 4), Verdict::OtherTtl { was: 3 });
        assert_eq!(raised(None, 3), Verdict::OtherTtl { was: 8 });
        // Ended first: etcd answers -1 for a lease it no longer has.
        assert_eq!(judged(-1, 0, &[]), Verdict::Ended);
        assert_eq!(judged(0, 900, &["/h/nodes/b"]), Verdict::Ended);
    }

    const BOOT: &str = "0b6a9c4e-5d8f-4e1a-9c2b-7f3e8d1a6b54";

    #[test]
    fn a_kept_lease_is_read_back_and_junk_ignored() {
        let dir = std::env::temp_dir().join(format!("kvstore-lease-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("etcd-lease");
        let kept = |id, ttl, boot: Option<&str>| {
            Some(Kept {
                id,
                ttl,
                boot: boot.map(Into::into),
            })
        };
        let with_boot = format!("694d8b1e2f3a 900 {BOOT}\n");
        for (content, want) in [
            (&b"694d8b1e2f3a\n"[..], kept(0x694d_8b1e_2f3a, None, None)),
            (
                b"694d8b1e2f3a 900\n",
                kept(0x694d_8b1e_2f3a, Some(900), None),
            ),
            (
                with_boot.as_bytes(),
                kept(0x694d_8b1e_2f3a, Some(900), Some(BOOT)),
            ),
            (b"694d8b1e2f3a 900 1\n", None),
            (
                b"694d8b1e2f3a 900 0b6a9c4e-5d8f-4e1a-9c2b-7f3e8d1a6b5z\n",
                None,
            ),
            (b"694d8b1e2f3a 900 0b6a9c4e 5d8f\n", None),
            (b"694d8b1e2f3a -900\n", None),
            (b"694d8b1e2f3a ttl\n", None),
            (b"0\n", None),
            (b"-5", None),
            (b"not hex", None),
            (&[b'1'; 130][..], None),
        ] {
            std::fs::write(&file, content).expect("write");
            assert_eq!(read(&file), want, "{content:?}");
        }
        assert_eq!(read(&dir.join("absent")), None);
        save(&file, kept(0x1234, Some(15), Some(BOOT)));
        assert_eq!(read(&file), kept(0x1234, Some(15), Some(BOOT)));
        save(&file, kept(0x1234, Some(15), None));
        assert_eq!(read(&file), kept(0x1234, Some(15), None));
        save(&file, None);
        assert!(!file.exists(), "removed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A lease is this agent's to take over only when it was kept in this
    /// very boot: a machine cloned with the node's name and its state
    /// directory boots with another ID, and one that cannot read its own
    /// takes over nothing.
    #[test]
    fn a_kept_lease_is_taken_over_only_in_the_boot_it_was_kept_in() {
        let kept = |boot: Option<&str>| Kept {
            id: 0x1234,
            ttl: Some(15),
            boot: boot.map(Into::into),
        };
        assert!(kept(Some(BOOT)).of_boot(Some(BOOT)));
        let other = "4c1f2a7e-0d3b-4b8e-8a6f-2e9d5c7b1a03";
        assert!(!kept(Some(BOOT)).of_boot(Some(other)));
        assert!(!kept(None).of_boot(Some(BOOT)), "kept by an older agent");
        assert!(!kept(Some(BOOT)).of_boot(None), "this boot unknown");
        assert!(!kept(None).of_boot(None));
    }
}
