//! `remora capture explain`: traces a connection through capture rules.

use clap::Args;

pub mod model;
pub mod nft;

/// Flags of `remora capture explain`.
#[derive(Debug, Clone, Default, Args)]
pub struct ExplainArgs {
    /// Rules to read instead of the installed ones: `iptables-save` output or an nft program
    /// or listing
    #[arg(long = "rules", value_name = "FILE")]
    pub rules: Option<std::path::PathBuf>,
}

/// Why `explain` could not answer.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ExplainError(pub String);

/// Runs `remora capture explain`.
pub fn run(args: &ExplainArgs, env: &crate::Environment) -> Result<(), crate::CaptureError> {
    let _ = (args, env);
    Err(ExplainError("not implemented yet".to_owned()).into())
}
