//! Reads `ebpf-toolchain.toml`, the one place that pins the kernel-side build.
//!
//! Shared by xtask and by `health-agent/build.rs` (the xtask library), and
//! written with std alone. The file is a flat list of `key = "value"`
//! lines; anything else is an error naming the line.

use std::{fmt, fs, path::Path};

pub const FILE_NAME: &str = "ebpf-toolchain.toml";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbpfPin {
    /// rustup toolchain that builds health-ebpf, e.g. `nightly-2026-06-20`.
    pub nightly: String,
    /// bpf-linker version installed with `cargo install`.
    pub bpf_linker: String,
    /// LLVM major both of them use, e.g. `22`.
    pub llvm_major: String,
}

#[derive(Debug)]
pub struct PinError(String);

impl fmt::Display for PinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PinError {}

impl EbpfPin {
    pub fn read(workspace_root: &Path) -> Result<Self, PinError> {
        let path = workspace_root.join(FILE_NAME);
        let text = fs::read_to_string(&path)
            .map_err(|e| PinError(format!("reading {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| PinError(format!("{}: {e}", path.display())))
    }

    pub fn parse(text: &str) -> Result<Self, PinError> {
        let (mut nightly, mut bpf_linker, mut llvm_major) = (None, None, None);
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| PinError(format!("line {}: {why}: {raw:?}", n + 1));
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| bad("expected key = \"value\""))?;
            let value = value
                .trim()
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .filter(|v| !v.is_empty() && !v.contains('"'))
                .ok_or_else(|| bad("value must be a non-empty quoted string"))?
                .to_owned();
            let slot = match key.trim() {
                "nightly" => &mut nightly,
                "bpf-linker" => &mut bpf_linker,
                "llvm-major" => &mut llvm_major,
                _ => return Err(bad("unknown key")),
            };
            if slot.replace(value).is_some() {
                return Err(bad("duplicate key"));
            }
        }
        let missing = |k: &str| PinError(format!("missing key {k:?}"));
        Ok(Self {
            nightly: nightly.ok_or_else(|| missing("nightly"))?,
            bpf_linker: bpf_linker.ok_or_else(|| missing("bpf-linker"))?,
            llvm_major: llvm_major.ok_or_else(|| missing("llvm-major"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_committed_pin_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root");
        let pin = EbpfPin::read(root).expect("pin file parses");
        assert!(pin.nightly.starts_with("nightly-"), "{pin:?}");
        assert!(pin.llvm_major.parse::<u32>().is_ok(), "{pin:?}");
    }

    #[test]
    fn rejects_bad_files_naming_the_line() {
        for (text, needle) in [
            ("nightly = nightly-1", "line 1"),
            ("nightly = \"a\"\nnightly = \"b\"", "line 2: duplicate"),
            ("colour = \"red\"", "unknown key"),
            ("nightly = \"a\"\nbpf-linker = \"1\"", "llvm-major"),
        ] {
            let err = EbpfPin::parse(text).expect_err(text).to_string();
            assert!(err.contains(needle), "{err:?} lacks {needle:?}");
        }
    }
}
