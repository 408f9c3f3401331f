//! `remora xds`: Remora's xDS conversion run offline over files, as `envoy --mode validate`.

use std::path::PathBuf;
use std::process::ExitCode;

/// `remora xds …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum XdsCommand {
    /// Check xDS resources as Remora would apply them, as `envoy --mode validate` does: one
    /// line per resource, `accepted <type> <name>` or `refused <type> <name>: <reason>`; exits
    /// non-zero if any is refused.
    Validate {
        /// A directory of `listeners.json`, `clusters.json`, `routes.json`, `endpoints.json`,
        /// `secrets.json`, `extension_configs.json` (JSON arrays), or an Envoy config dump.
        path: PathBuf,
    },
}

/// `remora xds`.
pub fn xds(command: &XdsCommand) -> ExitCode {
    match command {
        XdsCommand::Validate { path } => match remora_xds::validate::validate_path(path) {
            Ok(verdicts) => {
                for v in &verdicts {
                    println!("{v}");
                }
                if verdicts.iter().any(|v| v.refusal.is_some()) {
                    ExitCode::FAILURE
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => {
                eprintln!("remora: {e}");
                ExitCode::from(2)
            }
        },
    }
}
