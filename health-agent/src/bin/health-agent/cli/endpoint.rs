//! `health-agent endpoint list|get`, in the spirit of `cilium endpoint list`.

use std::fmt::Write as _;

use clap::Subcommand;

use super::{OutputFormat, SocketArgs};
use health_agent::{api::client::Client, endpoint::EndpointView, util::timefmt::rfc3339_millis};

#[derive(Debug, Subcommand)]
pub(crate) enum EndpointCommand {
    /// List the node's endpoints.
    List {
        #[arg(short, long, value_enum, default_value_t)]
        output: OutputFormat,
        #[command(flatten)]
        socket: SocketArgs,
    },
    /// Show one endpoint with its state history (default: the only one).
    Get {
        #[arg(allow_negative_numbers = true)]
        id: Option<u16>,
        #[arg(short, long, value_enum, default_value_t)]
        output: OutputFormat,
        #[command(flatten)]
        socket: SocketArgs,
    },
}

/// The node's one endpoint; with several, which to show is asked for.
fn only(mut eps: Vec<EndpointView>) -> anyhow::Result<EndpointView> {
    match eps.len() {
        0 => anyhow::bail!("the agent has no endpoint yet"),
        1 => Ok(eps.remove(0)),
        _ => {
            let ids: Vec<String> = eps.iter().map(|e| e.id.to_string()).collect();
            anyhow::bail!(
                "the agent has {} endpoints ({}): name one, `health-agent endpoint get ID`",
                eps.len(),
                ids.join(", ")
            )
        }
    }
}

impl EndpointCommand {
    pub(crate) async fn run(self) -> anyhow::Result<()> {
        match self {
            Self::List { output, socket } => {
                let eps = Client::new(socket.path).endpoints().await?;
                super::out::print_line(&render_list(&eps, output)?)?;
            }
            Self::Get { id, output, socket } => {
                let client = Client::new(socket.path);
                let ep: EndpointView = match id {
                    Some(id) => client.endpoint(&id.to_string()).await?,
                    None => only(client.endpoints().await?)?,
                };
                super::out::print_line(&render_one(&ep, output)?)?;
            }
        }
        Ok(())
    }
}

fn state(ep: &EndpointView) -> &'static str {
    ep.state.map_or("unknown", |s| s.as_str())
}

pub(crate) fn render_list(eps: &[EndpointView], output: OutputFormat) -> anyhow::Result<String> {
    if output == OutputFormat::Json {
        return Ok(serde_json::to_string_pretty(eps)?);
    }
    let mut out = format!(
        "{:<10} {:<10} {:<18} {:<16} {:<28} {:<12} {}\n",
        "ENDPOINT", "IDENTITY", "LABELS", "IPv4", "IPv6", "INTERFACE", "STATUS"
    );
    for ep in eps {
        let _ = writeln!(
            out,
            "{:<10} {:<10} {:<18} {:<16} {:<28} {:<12} {}",
            ep.id,
            ep.identity,
            ep.labels.join(","),
            ep.ipv4.map_or_else(|| "-".to_owned(), |a| a.to_string()),
            ep.ipv6.map_or_else(|| "-".to_owned(), |a| a.to_string()),
            ep.interface,
            state(ep)
        );
    }
    Ok(out.trim_end().to_owned())
}

pub(crate) fn render_one(ep: &EndpointView, output: OutputFormat) -> anyhow::Result<String> {
    if output == OutputFormat::Json {
        return Ok(serde_json::to_string_pretty(ep)?);
    }
    let mut out = render_list(std::slice::from_ref(ep), output)?;
    let _ = write!(
        out,
        "\n\nNetns: {}\nRepairs: {}\n\nSTATE HISTORY\n",
        ep.netns, ep.repairs
    );
    for t in &ep.history {
        let from = t.from.map_or("(new)", |s| s.as_str());
        let _ = writeln!(
            out,
            "{}  {from} -> {}: {}",
            rfc3339_millis(t.at_ms),
            t.to,
            t.reason
        );
    }
    Ok(out.trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_id_only_a_single_endpoint_is_shown() {
        let ep = |id: u16| EndpointView {
            id,
            identity: 4,
            labels: vec!["reserved:health".to_owned()],
            ipv4: Some(std::net::Ipv4Addr::new(198, 19, 0, 1)),
            ipv6: None,
            interface: "lxc_health".to_owned(),
            netns: "health-ep".to_owned(),
            state: None,
            repairs: 0,
            history: Vec::new(),
        };
        assert_eq!(only(vec![ep(7)]).expect("the one").id, 7);
        let none = only(Vec::new()).expect_err("none").to_string();
        assert!(none.contains("no endpoint yet"), "{none}");
        let two = only(vec![ep(7), ep(9)]).expect_err("two").to_string();
        assert!(
            two.contains("2 endpoints (7, 9)") && two.contains("endpoint get ID"),
            "{two}"
        );
    }
}
