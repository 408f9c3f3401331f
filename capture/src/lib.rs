//! Capture: the iptables rules that send a pod's TCP through Remora, written by
//! `remora capture`, a drop-in for Istio's `istio-iptables`.
//!
//! The parts, in the order a run uses them:
//! - [`flags`]: the command line ([`CaptureArgs`]) and the environment snapshot
//!   ([`Environment`]) that stands in for unset flags;
//! - [`model`]: resolution into a validated [`CaptureConfig`], with the facts learnt from the
//!   pod ([`pod_network`]: IPv4 or IPv6, nameservers) injected through a trait;
//! - [`generate`]: the pure generator, [`CaptureConfig`] to [`CaptureRules`], rendered as
//!   `iptables-restore` input by [`rules`]; its output matches istio-iptables byte for byte;
//! - [`apply`]: installation and removal through a [`Runner`] ([`runner`]), reading the
//!   installed state with `iptables-save` ([`saved`]); [`host_net`] adds the addresses and
//!   routes IPv6 and TPROXY need.
//!
//! With `--dry-run` only the first three run and the restore inputs go to stdout.

pub mod apply;
pub mod cidr;
pub mod error;
pub mod flags;
pub mod generate;
pub mod host_net;
pub mod model;
pub mod pod_network;
pub mod rules;
pub mod runner;
pub mod saved;

use std::io::Write;

pub use error::{CaptureError, CommandError, CommandFailure, FlagError};
pub use flags::{Action, CaptureArgs, Environment};
pub use generate::{generate, CaptureRules};
pub use model::CaptureConfig;
pub use pod_network::{PodNetwork, SystemPodNetwork};
pub use runner::{Runner, SystemRunner};

/// Runs `remora capture`: resolves the flags against this process's environment and this
/// machine, then prints, installs or removes the rules.
pub fn run(args: &CaptureArgs) -> Result<(), CaptureError> {
    let env = Environment::from_process();
    let action = args.action(&env);
    let config = CaptureConfig::resolve(args, &env, &SystemPodNetwork)?;
    tracing::info!(?config, "capture configuration");
    let rules = generate(&config);
    let runner = SystemRunner::new();
    match action {
        Action::DryRun { cleanup_only: true } => {
            tracing::info!("dry run with --cleanup-only: nothing would be installed");
        }
        Action::DryRun {
            cleanup_only: false,
        } => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(rules.dry_run_output().as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(CaptureError::Stdout)?;
        }
        Action::Apply => {
            apply::install(&rules, &runner)?;
            host_net::configure(&config, &runner)?;
        }
        Action::CleanupOnly => apply::cleanup(&rules, &runner)?,
    }
    Ok(())
}
