//! What the agent persists about its endpoint, so a restarted agent keeps the
//! same IP and endpoint ID (`<state-dir>/endpoint.json`).

use std::{
    fs, io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    time::SystemTime,
};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use tracing::info;

use super::ownership::Owned;
use crate::{sys::boot::ThisBoot, util::cidr};

pub const FILE_NAME: &str = "endpoint.json";

/// Reserved identity of the health endpoint, as in Cilium.
pub const HEALTH_IDENTITY: u32 = 4;
pub const HEALTH_LABEL: &str = "reserved:health";

/// The endpoint's ID, namespace and addresses: IPv4 (from `cidr`), IPv6
/// (from `cidr6`) or both. A record of an agent from before IPv6 (`ipv4`
/// and `cidr` only) loads as an IPv4-only endpoint; a family the endpoint
/// does not have is left out of the file.
///
/// `owned` proves which namespace and interfaces the agent made
/// ([`super::ownership`]); this version always writes it (`{}` when it
/// owns nothing), so its absence marks a record of an earlier version.
/// Those proofs hold in the boot `boot` names only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointRecord {
    pub id: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<Ipv4Addr>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "cidr::strict"
    )]
    pub cidr: Option<Ipv4Net>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Addr>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "cidr::strict"
    )]
    pub cidr6: Option<Ipv6Net>,
    pub netns: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned: Option<Owned>,
    /// The boot `owned` was proven in (`/proc/sys/kernel/random/boot_id`).
    /// A reboot takes the namespace and the veth with it, and the kernel
    /// hands their indexes, inode and cookie out again, as like as not to
    /// the same names: another boot's proofs prove nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<String>,
}

impl EndpointRecord {
    /// The endpoint's addresses, for logs: `198.18.64.2, 2001:2:0:1::2`.
    #[must_use]
    pub fn addresses(&self) -> String {
        let v4 = self.ipv4.map(|a| a.to_string());
        let v6 = self.ipv6.map(|a| a.to_string());
        let all: Vec<String> = v4.into_iter().chain(v6).collect();
        if all.is_empty() {
            "no address".to_owned()
        } else {
            all.join(", ")
        }
    }

    /// The endpoint's addresses.
    #[must_use]
    pub fn address_list(&self) -> Vec<IpAddr> {
        let v4 = self.ipv4.map(IpAddr::V4);
        let v6 = self.ipv6.map(IpAddr::V6);
        v4.into_iter().chain(v6).collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{path} is not a valid endpoint record (fix or remove it)")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("the endpoint record {path} is not the agent's alone: {why} (fix or remove it)")]
    NotPrivate { path: PathBuf, why: String },
}

impl EndpointRecord {
    /// The record in `state_dir`, `None` when there is none. A record that
    /// cannot be parsed is an error, never silently replaced.
    pub fn load(state_dir: &Path) -> Result<Option<Self>, RecordError> {
        let path = state_dir.join(FILE_NAME);
        match fs::symlink_metadata(&path) {
            Ok(meta) => {
                if let Some(why) = crate::sys::private_path::not_private(&meta) {
                    return Err(RecordError::NotPrivate { path, why });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(_) => {}
        }
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(RecordError::Io {
                    op: "reading",
                    path,
                    source,
                });
            }
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| RecordError::Corrupt { path, source })
    }

    /// The record in `state_dir` as this boot sees it ([`Self::in_boot`]).
    pub fn load_in(state_dir: &Path, boot: &ThisBoot) -> Result<Option<Self>, RecordError> {
        let Some(record) = Self::load(state_dir)? else {
            return Ok(None);
        };
        let written = fs::metadata(state_dir.join(FILE_NAME))
            .and_then(|m| m.modified())
            .ok();
        Ok(Some(record.in_boot(boot, written)))
    }

    /// The record of this boot: its proofs kept when they were made in
    /// it, dropped when they were made in an earlier one (the record
    /// keeps its ID and addresses). A record without a boot, written
    /// before records named one, is judged by when it was last written
    /// (`written`): before this boot began, after now (a clock that ran
    /// ahead in the boot that wrote it) or unknown, it is an earlier
    /// boot's, and so is a record of an earlier version (no proofs: what
    /// its address would adopt). A wall clock stepped since the record
    /// was written (forward by more than the time from boot to the
    /// writing, or back by more than the time since) dates a record of
    /// this boot earlier: its endpoint is then refused, never taken.
    #[must_use]
    pub fn in_boot(mut self, boot: &ThisBoot, written: Option<SystemTime>) -> Self {
        let proves = self.owned.as_ref() != Some(&Owned::default());
        let earlier = match &self.boot {
            Some(id) => *id != boot.id,
            None => written.is_none_or(|w| w < boot.began || w > SystemTime::now()),
        };
        if proves && earlier {
            info!(
                netns = %self.netns,
                recorded_boot = self.boot.as_deref().unwrap_or("unnamed"),
                written = %written.map_or_else(|| "unknown".to_owned(), |w| humantime::format_rfc3339_seconds(w).to_string()),
                boot_began = %humantime::format_rfc3339_seconds(boot.began),
                "the endpoint record is from an earlier boot: the namespace and interfaces it \
                 names went with that boot, and nothing under their names now is taken as the \
                 agent's; its ID and addresses are kept"
            );
            self.owned = Some(Owned::default());
        }
        self.boot = Some(boot.id.clone());
        self
    }

    /// Writes the record atomically (temporary file, fsync, rename, fsync
    /// of the directory): a reader, or the next agent after a crash or a
    /// power loss, finds the old record or the new one, whole.
    pub fn save(&self, state_dir: &Path) -> Result<(), RecordError> {
        let io = |op, path: &Path| {
            let path = path.to_owned();
            move |source| RecordError::Io { op, path, source }
        };
        fs::create_dir_all(state_dir).map_err(io("creating", state_dir))?;
        let path = state_dir.join(FILE_NAME);
        let tmp = state_dir.join(format!(".{FILE_NAME}.tmp"));
        let json = serde_json::to_vec_pretty(self)
            .map_err(io::Error::other)
            .map_err(io("serializing", &path))?;
        {
            use io::Write as _;
            let mut f = crate::sys::private_path::create(&tmp).map_err(io("creating", &tmp))?;
            f.write_all(&json).map_err(io("writing", &tmp))?;
            f.sync_all().map_err(io("syncing", &tmp))?;
        }
        fs::rename(&tmp, &path).map_err(io("renaming into", &path))?;
        fs::File::open(state_dir)
            .and_then(|d| d.sync_all())
            .map_err(io("syncing", state_dir))
    }

    /// Removes the record (the endpoint was deleted for good).
    pub fn remove(state_dir: &Path) -> Result<(), RecordError> {
        let path = state_dir.join(FILE_NAME);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(RecordError::Io {
                op: "removing",
                path,
                source,
            }),
        }
    }
}

/// A random endpoint ID in 1..=4095 (Cilium's endpoint ID range) that is not
/// in `taken`.
#[must_use]
pub fn new_endpoint_id(taken: &[u16]) -> u16 {
    loop {
        let mut b = [0u8; 2];
        // SAFETY: writes at most 2 bytes into `b`. getrandom(2) does not fail
        // for requests this small once the pool is initialised; on the
        // impossible failure the zeroes still give a valid (retried) id.
        let _ = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        let id = u16::from_ne_bytes(b) % 4095 + 1;
        if !taken.contains(&id) {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("health-record-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn round_trips_and_is_absent_when_missing() {
        let dir = tmp_dir("rt");
        assert!(
            EndpointRecord::load(&dir)
                .expect("missing is fine")
                .is_none()
        );
        let r = EndpointRecord {
            id: 123,
            ipv4: Some(Ipv4Addr::new(198, 18, 64, 2)),
            cidr: Some("198.18.64.0/24".parse().expect("cidr")),
            ipv6: Some("2001:2:0:1::2".parse().expect("ipv6")),
            cidr6: Some("2001:2:0:1::/64".parse().expect("cidr6")),
            netns: "health".into(),
            owned: Some(Owned::default()),
            boot: Some("4f1c1ad6-5d1e-4d5e-9b7a-3c2e1f0a9b8c".into()),
        };
        r.save(&dir).expect("save");
        assert_eq!(EndpointRecord::load(&dir).expect("load"), Some(r.clone()));
        // IPv6 only: no IPv4 fields in the file, and it reads back.
        let v6 = EndpointRecord {
            ipv4: None,
            cidr: None,
            ..r
        };
        v6.save(&dir).expect("save");
        let text = fs::read_to_string(dir.join(FILE_NAME)).expect("read");
        assert!(
            !text.contains("ipv4") && text.contains("\"cidr6\": \"2001:2:0:1::/64\""),
            "{text}"
        );
        assert_eq!(EndpointRecord::load(&dir).expect("load"), Some(v6));
        EndpointRecord::remove(&dir).expect("remove");
        assert!(EndpointRecord::load(&dir).expect("load").is_none());
        let _ = fs::remove_dir_all(&dir);
    }

    /// What the agent made is in the file and reads back; a record without
    /// it (an earlier version's) is told apart from one that owns nothing.
    #[test]
    fn the_proof_of_what_the_agent_made_round_trips() {
        use super::super::ownership::{LinkProof, NetnsProof};
        let dir = tmp_dir("owned");
        let owned = Owned {
            netns: Some(NetnsProof {
                name: "health".into(),
                dev: 4,
                ino: 4_026_532_841,
                cookie: Some(4096),
            }),
            host: Some(LinkProof {
                name: "lxc_health".into(),
                ifindex: 12,
            }),
            peer: Some(LinkProof {
                name: "eth0".into(),
                ifindex: 2,
            }),
        };
        let r = EndpointRecord {
            id: 9,
            ipv4: Some(Ipv4Addr::new(198, 18, 64, 2)),
            cidr: Some("198.18.64.0/24".parse().expect("cidr")),
            ipv6: None,
            cidr6: None,
            netns: "health".into(),
            owned: Some(owned),
            boot: None,
        };
        r.save(&dir).expect("save");
        let text = fs::read_to_string(dir.join(FILE_NAME)).expect("read");
        assert!(
            text.contains("\"ino\": 4026532841") && text.contains("\"ifindex\": 12"),
            "{text}"
        );
        assert_eq!(EndpointRecord::load(&dir).expect("load"), Some(r.clone()));
        let nothing = EndpointRecord {
            owned: Some(Owned::default()),
            ..r
        };
        nothing.save(&dir).expect("save");
        let loaded = EndpointRecord::load(&dir).expect("load").expect("a record");
        assert_eq!(loaded.owned, Some(Owned::default()));
        let _ = fs::remove_dir_all(&dir);
    }

    /// A record written by an agent from before IPv6 loads as an
    /// IPv4-only endpoint.
    #[test]
    fn an_ipv4_only_record_of_an_older_agent_still_loads() {
        let dir = tmp_dir("old");
        fs::create_dir_all(&dir).expect("mkdir");
        fs::write(
            dir.join(FILE_NAME),
            br#"{"id": 77, "ipv4": "198.18.64.9", "cidr": "198.18.64.0/24", "netns": "health"}"#,
        )
        .expect("write");
        let r = EndpointRecord::load(&dir).expect("load").expect("a record");
        assert_eq!(
            r,
            EndpointRecord {
                id: 77,
                ipv4: Some(Ipv4Addr::new(198, 18, 64, 9)),
                cidr: Some("198.18.64.0/24".parse().expect("cidr")),
                ipv6: None,
                cidr6: None,
                netns: "health".into(),
                owned: None,
                boot: None,
            }
        );
        assert_eq!(r.addresses(), "198.18.64.9");
        // A malformed IPv6 field is refused, not dropped.
        fs::write(
            dir.join(FILE_NAME),
            br#"{"id": 77, "ipv6": "2001:2::zz", "cidr6": "2001:2::/64", "netns": "health"}"#,
        )
        .expect("write");
        let err = EndpointRecord::load(&dir)
            .expect_err("malformed")
            .to_string();
        assert!(err.contains("not a valid endpoint record"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_corrupt_record_is_an_error_naming_the_file() {
        let dir = tmp_dir("corrupt");
        fs::create_dir_all(&dir).expect("mkdir");
        fs::write(dir.join(FILE_NAME), b"{\"id\": 1, \"ipv4\": \"nope\"").expect("write");
        let err = EndpointRecord::load(&dir).expect_err("corrupt").to_string();
        assert!(
            err.contains("endpoint.json") && err.contains("not a valid endpoint record"),
            "{err}"
        );
        // The bad file is left for the operator, not overwritten.
        assert!(dir.join(FILE_NAME).exists());
        let _ = fs::remove_dir_all(&dir);
    }

    /// A record others may write, or a link in its place, is refused and
    /// left as it is: it could name what the agent did not make.
    #[test]
    fn a_record_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tmp_dir("private");
        fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join(FILE_NAME);
        fs::write(
            &path,
            br#"{"id": 7, "ipv4": "198.18.64.2", "netns": "health"}"#,
        )
        .expect("write");
        assert!(EndpointRecord::load(&dir).expect("load").is_some());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).expect("chmod");
        let err = EndpointRecord::load(&dir).expect_err("refused").to_string();
        assert!(
            err.contains("endpoint.json is not the agent's alone: it is writable by its group or others (mode 0666"),
            "{err}"
        );
        fs::rename(&path, dir.join("elsewhere")).expect("moved");
        std::os::unix::fs::symlink(dir.join("elsewhere"), &path).expect("link");
        let err = EndpointRecord::load(&dir).expect_err("refused").to_string();
        assert!(err.contains("it is a symbolic link"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn endpoint_ids_are_in_range_and_avoid_taken_ones() {
        let taken: Vec<u16> = (1..=4094).collect();
        for _ in 0..20 {
            assert_eq!(new_endpoint_id(&taken), 4095);
        }
        for _ in 0..1000 {
            let id = new_endpoint_id(&[]);
            assert!((1..=4095).contains(&id));
        }
    }

    /// A record proving an `lxc_health` of index 5, made in `boot`.
    fn proving_lxc_health(boot: Option<&str>) -> EndpointRecord {
        use super::super::ownership::LinkProof;
        EndpointRecord {
            id: 9,
            ipv4: Some(Ipv4Addr::new(198, 18, 64, 2)),
            cidr: Some("198.18.64.0/24".parse().expect("cidr")),
            ipv6: None,
            cidr6: None,
            netns: "health".into(),
            owned: Some(Owned {
                host: Some(LinkProof {
                    name: "lxc_health".into(),
                    ifindex: 5,
                }),
                ..Owned::default()
            }),
            boot: boot.map(str::to_owned),
        }
    }

    /// Proofs of an earlier boot prove nothing: dropped, the ID and
    /// addresses kept; those of this boot are kept. A record naming no
    /// boot is judged by when it was written.
    #[test]
    fn proofs_hold_in_their_own_boot_only() {
        use std::time::Duration;
        let began = SystemTime::now() - Duration::from_secs(3_600);
        let boot = ThisBoot {
            id: "this-boot".into(),
            began,
        };
        let proving = proving_lxc_health(Some("this-boot"));
        let kept = proving.clone().in_boot(&boot, None);
        assert_eq!(kept, proving, "this boot's proofs are kept");

        let earlier = EndpointRecord {
            boot: Some("another-boot".into()),
            ..proving.clone()
        };
        let judged = earlier.in_boot(&boot, Some(SystemTime::now()));
        assert_eq!(
            judged.owned,
            Some(Owned::default()),
            "another boot's dropped"
        );
        assert_eq!((judged.id, judged.ipv4), (proving.id, proving.ipv4));
        assert_eq!(judged.boot.as_deref(), Some("this-boot"));

        let unnamed = EndpointRecord {
            boot: None,
            ..proving.clone()
        };
        let after = unnamed
            .clone()
            .in_boot(&boot, Some(began + Duration::from_secs(1)));
        assert_eq!(after.owned, proving.owned, "written in this boot");
        let before = unnamed
            .clone()
            .in_boot(&boot, Some(began - Duration::from_secs(1)));
        assert_eq!(before.owned, Some(Owned::default()), "written before it");
        let unknown = unnamed.clone().in_boot(&boot, None);
        assert_eq!(
            unknown.owned,
            Some(Owned::default()),
            "when unknown, earlier"
        );

        let ahead = unnamed.in_boot(&boot, Some(SystemTime::now() + Duration::from_hours(1)));
        assert_eq!(ahead.owned, Some(Owned::default()), "dated ahead of now");

        // A record of an earlier version (no proofs: its address adopts)
        // adopts in the boot that wrote it only.
        let older = EndpointRecord {
            owned: None,
            boot: None,
            ..proving
        };
        let now = older
            .clone()
            .in_boot(&boot, Some(began + Duration::from_secs(1)));
        assert_eq!(now.owned, None, "this boot's: its address may adopt");
        let before = older.in_boot(&boot, Some(began - Duration::from_secs(1)));
        assert_eq!(before.owned, Some(Owned::default()), "an earlier boot's");
    }

    /// Loaded from the state directory, a record naming no boot is
    /// judged by its file's modification time.
    #[test]
    fn a_record_naming_no_boot_is_dated_by_its_file() {
        let dir = tmp_dir("dated");
        let boot = ThisBoot::read().expect("the boot");
        let r = proving_lxc_health(None);
        r.save(&dir).expect("save");
        let now = EndpointRecord::load_in(&dir, &boot)
            .expect("load")
            .expect("a record");
        assert_eq!(now.owned, r.owned, "written now: this boot's");
        assert_eq!(now.boot.as_ref(), Some(&boot.id));
        fs::File::options()
            .write(true)
            .open(dir.join(FILE_NAME))
            .and_then(|f| f.set_modified(boot.began - std::time::Duration::from_secs(60)))
            .expect("dated before the boot");
        let old = EndpointRecord::load_in(&dir, &boot)
            .expect("load")
            .expect("a record");
        assert_eq!(old.owned, Some(Owned::default()), "an earlier boot's");
        let _ = fs::remove_dir_all(&dir);
    }
}
