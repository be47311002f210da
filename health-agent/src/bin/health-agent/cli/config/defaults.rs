//! `health-agent config print-defaults`: a complete configuration file,
//! every key commented at its default, made from the flags' definitions.

use std::fmt::Write as _;

use serde_yaml_ng::Value;

use super::{
    file::{is_flag, keys, long},
    reloadable,
};

/// A YAML scalar for `s`: plain when YAML reads it back as the same text.
fn scalar(s: &str) -> String {
    let plain_ok = match serde_yaml_ng::from_str::<Value>(s) {
        Ok(Value::String(v)) => v == s,
        Ok(Value::Number(n)) => n.to_string() == s,
        Ok(Value::Bool(b)) => b.to_string() == s,
        _ => false,
    };
    if plain_ok {
        s.to_owned()
    } else {
        serde_json::to_string(s).unwrap_or_default()
    }
}

fn comment(out: &mut String, text: &str) {
    for paragraph in text.lines() {
        let mut line = String::from("#");
        for word in paragraph.split_whitespace() {
            if line.len() + 1 + word.len() > 78 && line.len() > 1 {
                out.push_str(&line);
                out.push('\n');
                line = String::from("#");
            }
            line.push(' ');
            line.push_str(word);
        }
        out.push_str(&line);
        out.push('\n');
    }
}

/// A complete configuration file: every key, commented, at its default
/// (keys without one commented out).
pub(crate) fn defaults() -> String {
    let mut out = String::new();
    comment(
        &mut out,
        "health-agent daemon configuration: `health-agent daemon --config FILE`.",
    );
    comment(
        &mut out,
        &format!(
            "Every key is the `daemon` flag of the same name; a flag on the command line, \
             or its environment variable, overrides the file. On SIGHUP the agent reads the \
             file again: {} apply at once, other changes need a restart.",
            reloadable().join(", ")
        ),
    );
    for arg in keys() {
        let key = long(&arg);
        out.push('\n');
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        if !help.is_empty() {
            comment(&mut out, &help.replace("\n\n", "\n"));
        }
        let possible: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|p| !p.is_hide_set())
            .map(|p| p.get_name().to_owned())
            .collect();
        if !possible.is_empty() && !is_flag(&arg) {
            comment(&mut out, &format!("One of: {}.", possible.join(", ")));
        }
        if let Some(env) = arg.get_env() {
            comment(
                &mut out,
                &format!(
                    "Environment: {} (overrides the file).",
                    env.to_string_lossy()
                ),
            );
        }
        let default = arg.get_default_values().first();
        match default {
            Some(d) => {
                let _ = writeln!(out, "{key}: {}", scalar(&d.to_string_lossy()));
            }
            None if arg.is_required_set() => {
                comment(&mut out, "Required (here or on the command line).");
                let _ = writeln!(out, "# {key}:");
            }
            None => {
                let _ = writeln!(out, "# {key}:");
            }
        }
    }
    out
}
