//! The package's `copyright` file, in Debian's machine-readable format
//! (DEP-5), made from the workspace's own metadata: every crate compiled
//! into `health-agent` (its normal dependencies, and the kernel programs'
//! that it embeds; not build scripts' or procedural macros', which run at
//! build time only), grouped by license expression, with each crate's
//! authors; then the text of every license named, from
//! `packaging/licenses/` (Apache-2.0 from Debian's common licenses).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt::Write as _,
    fs, io,
    path::Path,
    process::Command,
};

use serde_json::Value;

/// The crates whose compiled code is in the package's binary.
const ROOTS: [&str; 2] = ["health-agent", "health-ebpf"];

/// Licenses whose text Debian ships in `/usr/share/common-licenses`.
const COMMON: [&str; 1] = ["Apache-2.0"];

fn fail(what: impl std::fmt::Display) -> io::Error {
    io::Error::other(what.to_string())
}

fn cargo(workspace: &Path, args: &[&str]) -> io::Result<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .current_dir(workspace)
        .args(args)
        .output()
        .map_err(|e| fail(format!("running {cargo} {}: {e}", args.join(" "))))?;
    if !out.status.success() {
        return Err(fail(format!(
            "{cargo} {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    String::from_utf8(out.stdout).map_err(|e| fail(format!("{cargo} {}: {e}", args.join(" "))))
}

/// `(name, version)` of every crate compiled into the binary.
fn compiled_in(workspace: &Path) -> io::Result<BTreeSet<(String, String)>> {
    let mut args = vec![
        "tree",
        "--edges",
        "normal,no-proc-macro",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ];
    for root in ROOTS {
        args.extend(["-p", root]);
    }
    let tree = cargo(workspace, &args)?;
    let mut crates = BTreeSet::new();
    for line in tree.lines().filter(|l| !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next()) else {
            return Err(fail(format!("cargo tree printed {line:?}")));
        };
        let version = version.strip_prefix('v').unwrap_or(version);
        crates.insert((name.to_owned(), version.to_owned()));
    }
    Ok(crates)
}

/// One crate's license expression and authors.
struct Crate {
    name: String,
    version: String,
    license: String,
    authors: Vec<String>,
}

fn describe(workspace: &Path, crates: &BTreeSet<(String, String)>) -> io::Result<Vec<Crate>> {
    let metadata = cargo(workspace, &["metadata", "--format-version", "1"])?;
    let metadata: Value = serde_json::from_str(&metadata)
        .map_err(|e| fail(format!("cargo metadata printed bad JSON: {e}")))?;
    let mut known = HashMap::new();
    for p in metadata["packages"].as_array().into_iter().flatten() {
        let key = (
            p["name"].as_str().unwrap_or_default().to_owned(),
            p["version"].as_str().unwrap_or_default().to_owned(),
        );
        known.insert(key, p);
    }
    crates
        .iter()
        .map(|key| {
            let p = known
                .get(key)
                .ok_or_else(|| fail(format!("{} {} not in cargo metadata", key.0, key.1)))?;
            let license = p["license"].as_str().ok_or_else(|| {
                fail(format!(
                    "{} {} declares no license expression (license-file only): \
                     its terms must be read and added by hand",
                    key.0, key.1
                ))
            })?;
            let authors = p["authors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect();
            Ok(Crate {
                name: key.0.clone(),
                version: key.1.clone(),
                license: normalise(license),
                authors,
            })
        })
        .collect()
}

/// An SPDX expression in one spelling: the old `/` is `OR`, and the
/// choices of a plain `A OR B OR C` are sorted (so `Apache-2.0 OR MIT` and
/// `MIT/Apache-2.0` are one group).
fn normalise(expression: &str) -> String {
    let spelled = expression
        .split('/')
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" OR ");
    let words: Vec<&str> = spelled
        .split_whitespace()
        .map(|w| match w {
            "or" => "OR",
            "and" => "AND",
            "with" => "WITH",
            other => other,
        })
        .collect();
    let plain_or = !words
        .iter()
        .any(|w| matches!(*w, "AND" | "WITH") || w.contains(['(', ')']));
    if !plain_or {
        return words.join(" ");
    }
    let mut choices: Vec<&str> = words.into_iter().filter(|w| *w != "OR").collect();
    choices.sort_unstable_by(|a, b| license_rank(a).cmp(&license_rank(b)).then(a.cmp(b)));
    choices.dedup();
    choices.join(" OR ")
}

/// The project's own licenses first, then the others by name.
fn license_rank(id: &str) -> u8 {
    match id {
        "MIT" => 0,
        "Apache-2.0" => 1,
        _ => 2,
    }
}

/// The license identifiers an expression names (exceptions included).
fn identifiers(expression: &str) -> impl Iterator<Item = &str> {
    expression
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter(|w| !w.is_empty() && !matches!(*w, "OR" | "AND" | "WITH"))
}

/// DEP-5 spells the operators in lower case.
fn dep5(expression: &str) -> String {
    expression
        .split(' ')
        .map(|w| match w {
            "OR" => "or",
            "AND" => "and",
            "WITH" => "with",
            other => other,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A field's value over several lines: each continuation line indented.
fn continued(out: &mut String, field: &str, lines: &[String]) {
    let _ = write!(out, "{field}:");
    for line in lines {
        let _ = writeln!(out, " {line}");
    }
}

/// A license's text as a DEP-5 paragraph body: indented, blank lines as ` .`.
fn body(out: &mut String, text: &str) {
    for line in text.trim_end().lines() {
        if line.trim().is_empty() {
            out.push_str(" .\n");
        } else {
            let _ = writeln!(out, " {}", line.trim_end());
        }
    }
}

/// The `copyright` file of the package built from `workspace`;
/// `maintainer` is the upstream contact.
pub fn copyright(workspace: &Path, maintainer: &str) -> io::Result<String> {
    let crates = describe(workspace, &compiled_in(workspace)?)?;
    let own: Vec<&Crate> = crates
        .iter()
        .filter(|c| ROOTS.contains(&c.name.as_str()) || c.name.starts_with("health-"))
        .collect();
    let project_license = own
        .first()
        .map(|c| c.license.clone())
        .ok_or_else(|| fail("health-agent is not in its own dependency tree"))?;

    let mut out = String::new();
    out.push_str("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n");
    out.push_str("Upstream-Name: health\n");
    let _ = writeln!(out, "Upstream-Contact: {maintainer}");
    out.push_str(
        "Comment: health-agent is one binary: the crates below are compiled into\n \
         it (the kernel programs it loads are embedded in it too), with the\n \
         Rust standard library (MIT or Apache-2.0). Each crate is named as\n \
         `cargo vendor --versioned-dirs` lays out its source.\n\n",
    );
    out.push_str("Files: *\n");
    let _ = writeln!(out, "Copyright: the health developers");
    let _ = writeln!(out, "License: {}", dep5(&project_license));
    let _ = writeln!(
        out,
        "Comment: {}; the kernel programs declare \"Dual MIT/GPL\" to the kernel.\n",
        own.iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let mut groups: BTreeMap<&str, Vec<&Crate>> = BTreeMap::new();
    for c in crates
        .iter()
        .filter(|c| !own.iter().any(|o| o.name == c.name))
    {
        groups.entry(c.license.as_str()).or_default().push(c);
    }
    let mut ids = BTreeSet::new();
    ids.extend(identifiers(&project_license).map(str::to_owned));
    for (license, members) in &groups {
        ids.extend(identifiers(license).map(str::to_owned));
        let files: Vec<String> = members
            .iter()
            .map(|c| format!("vendor/{}-{}/*", c.name, c.version))
            .collect();
        let holders: Vec<String> = members
            .iter()
            .map(|c| {
                if c.authors.is_empty() {
                    format!("the {} authors", c.name)
                } else {
                    format!("{}: {}", c.name, c.authors.join(", "))
                }
            })
            .collect();
        continued(&mut out, "Files", &files);
        continued(&mut out, "Copyright", &holders);
        let _ = writeln!(out, "License: {}\n", dep5(license));
    }

    let texts = workspace.join("packaging/licenses");
    for id in &ids {
        let _ = writeln!(out, "License: {id}");
        if COMMON.contains(&id.as_str()) {
            let _ = writeln!(
                out,
                " On Debian systems, the complete text of the {id} license can be\n \
                 found in /usr/share/common-licenses/{id}.\n"
            );
            continue;
        }
        let path = texts.join(id);
        let text = fs::read_to_string(&path).map_err(|e| {
            fail(format!(
                "a compiled-in crate is under {id}, whose text is not in {}: {e}",
                path.display()
            ))
        })?;
        body(&mut out, &text);
        out.push('\n');
    }
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    out.push('\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_are_grouped_in_one_spelling() {
        assert_eq!(normalise("MIT/Apache-2.0"), "MIT OR Apache-2.0");
        assert_eq!(normalise("Apache-2.0 / MIT"), "MIT OR Apache-2.0");
        assert_eq!(normalise("Apache-2.0 OR MIT"), "MIT OR Apache-2.0");
        assert_eq!(
            normalise("Apache-2.0 OR ISC OR MIT"),
            "MIT OR Apache-2.0 OR ISC"
        );
        assert_eq!(normalise("Apache-2.0 AND ISC"), "Apache-2.0 AND ISC");
        assert_eq!(normalise("MIT AND BSD-3-Clause"), "MIT AND BSD-3-Clause");
    }

    #[test]
    fn identifiers_and_dep5_spelling() {
        let ids: Vec<&str> = identifiers("(MIT OR Apache-2.0) AND Unicode-3.0").collect();
        assert_eq!(ids, ["MIT", "Apache-2.0", "Unicode-3.0"]);
        assert_eq!(dep5("Apache-2.0 AND ISC"), "Apache-2.0 and ISC");
    }

    #[test]
    fn license_text_blank_lines_become_dots() {
        let mut out = String::new();
        body(&mut out, "a\n\nb  \n");
        assert_eq!(out, " a\n .\n b\n");
    }
}
