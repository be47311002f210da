//! `health-agent daemon`.

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::{PinArgs, SocketArgs};
use crate::{
    daemon::{DaemonConfig, run},
    endpoint::EndpointConfig,
    ipam::Ipv4Cidr,
    netns::Netns,
    responder::AttachMode,
};

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The node's share of the pod range; the endpoint's address comes from it.
    #[arg(long, value_name = "CIDR")]
    pub health_cidr: Ipv4Cidr,
    /// Name of the endpoint's network namespace (under /run/netns).
    #[arg(long, default_value = "health", value_parser = validate_netns_name)]
    pub endpoint_netns: String,
    /// Host side of the endpoint's veth.
    #[arg(long, default_value = "lxc_health")]
    pub host_iface: String,
    /// Endpoint side of the veth, inside its namespace.
    #[arg(long, default_value = "eth0")]
    pub endpoint_iface: String,
    /// Where the endpoint record (IP, endpoint ID) is kept across restarts.
    #[arg(long, default_value = "/var/lib/health-agent")]
    pub state_dir: PathBuf,
    #[arg(long, default_value = "/var/run/health-agent/health-agent.pid")]
    pub pidfile: PathBuf,
    /// How often the controller verifies the endpoint (it also runs on link events).
    #[arg(long, default_value = "60s", value_parser = super::duration::parse)]
    pub controller_interval: Duration,
    /// Attach mode of the echo responder.
    #[arg(long, value_enum, default_value_t = super::responder::DEFAULT_MODE)]
    pub mode: AttachMode,
    /// On shutdown, leave the namespace, veth, pins and record for the next agent.
    #[arg(long)]
    pub keep_endpoint: bool,
    #[command(flatten)]
    pub pins: PinArgs,
    #[command(flatten)]
    pub socket: SocketArgs,
}

fn validate_netns_name(s: &str) -> Result<String, String> {
    Netns::named(s)
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

impl DaemonArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        run(DaemonConfig {
            endpoint: EndpointConfig {
                cidr: self.health_cidr,
                netns_name: self.endpoint_netns,
                host_iface: self.host_iface,
                ep_iface: self.endpoint_iface,
                state_dir: self.state_dir,
                pin_dir: self.pins.dir,
                mode: self.mode,
            },
            socket: self.socket.path,
            pidfile: self.pidfile,
            controller_interval: self.controller_interval,
            keep_endpoint: self.keep_endpoint,
        })
        .await
    }
}
