//! Capture: the iptables rules that send a pod's TCP through Remora.
//!
//! Placeholder; the generator and installer land here.

use clap::Args;

/// Flags of `remora capture`, compatible with `istio-iptables`.
#[derive(Debug, Clone, Args)]
pub struct CaptureArgs {
    /// Print the restore input instead of applying it.
    #[arg(short = 'n', long = "dry-run")]
    pub dry_run: bool,
}

/// Errors from generating or installing capture rules.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Not implemented yet.
    #[error("capture is not implemented yet")]
    Unimplemented,
}

/// Generate and (unless dry-run) apply the rules.
pub fn run(_args: &CaptureArgs) -> Result<(), CaptureError> {
    Err(CaptureError::Unimplemented)
}
