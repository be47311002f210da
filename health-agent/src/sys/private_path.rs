//! Whether a file or directory the agent trusts (its state directory, its
//! pins, the records in them) is the agent's alone: owned by the user it
//! runs as and writable by no one else. Anyone else able to write there
//! could make it adopt, or remove, what it did not make.

use std::{
    fs::{File, Metadata, OpenOptions},
    io,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::Path,
};

/// Why `meta` is not the agent's alone, if it is not.
#[must_use]
pub fn not_private(meta: &Metadata) -> Option<String> {
    let (uid, own) = (meta.uid(), nix::unistd::geteuid().as_raw());
    let mode = meta.mode() & 0o7777;
    if meta.file_type().is_symlink() {
        Some("it is a symbolic link".to_owned())
    } else if uid != own {
        Some(format!(
            "it is owned by uid {uid}, not by the agent's ({own})"
        ))
    } else if mode & 0o022 != 0 {
        Some(format!(
            "it is writable by its group or others (mode {mode:04o}; chmod go-w)"
        ))
    } else {
        None
    }
}

/// Creates (or truncates) `path` for writing, never through a symbolic
/// link at it (`O_NOFOLLOW`), writable by the agent alone.
pub fn create(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn only_what_the_agent_alone_may_write_is_private() {
        let dir = std::env::temp_dir().join(format!("private-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("record");
        create(&file).expect("created");
        let meta = |p: &Path| std::fs::symlink_metadata(p).expect("meta");
        assert_eq!(not_private(&meta(&file)), None);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o664)).expect("chmod");
        assert_eq!(
            not_private(&meta(&file)).as_deref(),
            Some("it is writable by its group or others (mode 0664; chmod go-w)")
        );
        let link = dir.join("link");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        assert_eq!(
            not_private(&meta(&link)).as_deref(),
            Some("it is a symbolic link")
        );
        let err = create(&link).expect_err("not through a link");
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
        std::fs::remove_dir_all(&dir).expect("cleaned up");
    }
}
