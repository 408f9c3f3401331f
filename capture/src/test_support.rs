//! Helpers shared by the crate's unit tests.

use clap::Parser;

use crate::error::CaptureError;
use crate::flags::{CaptureArgs, Environment};
use crate::model::CaptureConfig;
use crate::pod_network::PodNetwork;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: CaptureArgs,
}

/// Parses `remora capture` flags.
pub fn args(argv: &[&str]) -> CaptureArgs {
    let argv = std::iter::once("capture").chain(argv.iter().copied());
    Cli::try_parse_from(argv).expect("flags parse").args
}

/// An IPv4 pod (IPv6 with `--assume-ipv6`) without nameservers.
pub struct Ipv4Pod;

impl PodNetwork for Ipv4Pod {
    fn is_ipv6(&self, _: bool) -> Result<bool, CaptureError> {
        Ok(false)
    }
    fn nameservers(&self) -> Result<Vec<String>, CaptureError> {
        Ok(vec![])
    }
}

/// The config these flags resolve to, with an empty environment.
pub fn config(argv: &[&str]) -> CaptureConfig {
    CaptureConfig::resolve(&args(argv), &Environment::default(), &Ipv4Pod).expect("resolves")
}
