//! nftables rules inside a node's namespace, for faults the tc programs of
//! [`crate::faults`] do not express (a share of the packets): one table of
//! a unique name, deleted on drop.

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use health_agent::sys::netns::Netns;

use crate::process::enter;

/// A table of rules in a namespace, removed on drop.
pub struct NftTable {
    ns: Netns,
    name: String,
}

fn nft(ns: &Netns, script: &str) -> Result<(), String> {
    let mut cmd = Command::new("nft");
    cmd.args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = enter(&mut cmd, ns)
        .spawn()
        .map_err(|e| format!("running nft (is nftables installed?): {e}"))?;
    child
        .stdin
        .take()
        .ok_or("nft's stdin")?
        .write_all(script.as_bytes())
        .map_err(|e| format!("writing to nft: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft failed ({}): {}\nscript:\n{script}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl NftTable {
    /// Adds table `netdev NAME` with `body` (chains and rules, in nft's
    /// syntax) in `ns`.
    ///
    /// # Errors
    /// nft's own message when it refuses the rules.
    pub fn netdev(ns: &Netns, body: &str) -> Result<Self, String> {
        let name = format!("health_test_{}", std::process::id());
        nft(ns, &format!("table netdev {name} {{\n{body}\n}}\n"))?;
        Ok(Self {
            ns: ns.clone(),
            name,
        })
    }
}

impl Drop for NftTable {
    fn drop(&mut self) {
        let _ = nft(&self.ns, &format!("delete table netdev {}\n", self.name));
    }
}
