//! Capture: the rules that send a pod's TCP through Remora, written by `remora capture`, a
//! drop-in for Istio's `istio-iptables` (its flags, environment variables, rules and exit
//! codes), with iptables or, with `--native-nftables`, nftables.
//!
//! The parts, in the order a run uses them:
//! - [`flags`] and [`environment`]: the command line ([`CaptureArgs`]) and the snapshot of
//!   the environment variables that stand in for unset flags ([`Environment`]);
//! - [`model`] resolves what the rules depend on into a [`CaptureConfig`], with the facts
//!   learnt from the pod ([`pod_network`]) injected through a trait; [`options`] resolves how
//!   the run goes ([`RunOptions`]: backend, reconcile, namespace, validation);
//! - the pure generators: [`mod@generate`] (iptables, rendered by [`rules`]) and [`nft`] (one
//!   `nft -f` program); both match Istio's output byte for byte;
//! - installation: [`apply`] for iptables, with the binaries [`iptables_binaries`] detects,
//!   reading the installed state back with `*-save` ([`saved`]); [`nft::apply`] for nftables;
//!   [`host_net`] adds the addresses and routes IPv6 and TPROXY need. Every external command
//!   goes through a [`Runner`] ([`runner`]), which can enter another network namespace;
//!   [`netns`] does the same for this process's own sockets;
//! - [`validation`] proves the redirect works (`--run-validation`, exit status 126 if not);
//! - [`explain`] traces a connection through installed or given rules, or compares them with
//!   what flags would install.
//!
//! With `--dry-run` only the resolution and the generators run, and the program goes to
//! stdout.

pub mod apply;
pub mod cidr;
pub mod environment;
pub mod error;
pub mod explain;
pub mod flags;
pub mod generate;
pub mod host_net;
pub mod iptables_binaries;
pub mod model;
pub mod netns;
pub mod nft;
pub mod options;
pub mod pod_network;
pub mod rules;
pub mod runner;
pub mod saved;
pub mod validation;

#[cfg(test)]
mod test_support;

use std::io::Write;

pub use error::{CaptureError, CommandError, CommandFailure, FlagError};
pub use flags::{Action, CaptureArgs, CaptureCommand, Environment};
pub use generate::{generate, CaptureRules};
pub use iptables_binaries::IptablesToolset;
pub use model::CaptureConfig;
pub use options::{Backend, RunOptions};
pub use pod_network::{PodNetwork, SystemPodNetwork};
pub use runner::{Runner, SystemRunner};

/// Runs `remora capture`: resolves the flags against this process's environment and the
/// pod's network, then prints, installs or removes the rules, and validates them if asked.
/// `remora capture explain` is dispatched from here too.
pub fn run(args: &CaptureArgs) -> Result<(), CaptureError> {
    let env = Environment::from_process();
    if let Some(CaptureCommand::Explain(explain)) = &args.command {
        return explain::run(explain, args, &env);
    }
    let options = RunOptions::resolve(args, &env)?;
    let netns = options.network_namespace.as_deref();
    let config = match netns {
        Some(path) => {
            let pod = pod_network::NetnsPodNetwork {
                path: path.to_owned(),
            };
            CaptureConfig::resolve(args, &env, &pod)?
        }
        None => CaptureConfig::resolve(args, &env, &SystemPodNetwork)?,
    };
    tracing::info!(?config, ?options, "capture configuration");
    if let Some(output) = dry_run_output(&config, &options) {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(output.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(CaptureError::Stdout)?;
    } else if options.skip_rule_apply {
        tracing::info!("--skip-rule-apply: leaving the rules as they are");
    } else {
        apply_rules(&config, &options, &system_runner(&options))?;
    }
    if options.run_validation {
        let probe = validation::ValidationProbe::new(&config, &options);
        validation::validate(&probe, netns)?;
    }
    Ok(())
}

/// The runner for this run: inside `--network-namespace` if given and, in CNI mode, with
/// legacy iptables' lock file moved to the namespace (unique per pod), as istio-iptables
/// does, so that pods do not wait on the node's lock.
pub fn system_runner(options: &RunOptions) -> SystemRunner {
    match &options.network_namespace {
        Some(path) => {
            let runner = SystemRunner::in_netns_path(path);
            if options.cni_mode {
                runner.with_env("XTABLES_LOCKFILE", &path.to_string_lossy())
            } else {
                runner
            }
        }
        None => SystemRunner::new(),
    }
}

/// Installs or removes the rules with the chosen backend (not for dry runs).
pub fn apply_rules(
    config: &CaptureConfig,
    options: &RunOptions,
    runner: &dyn Runner,
) -> Result<(), CaptureError> {
    let install = apply::InstallOptions {
        reconcile: options.reconcile,
        force_apply: options.force_apply,
    };
    match (options.backend, options.action) {
        (_, Action::DryRun { .. }) => {}
        (Backend::Iptables(forced), Action::Apply) => {
            let tools = IptablesToolset::detect(config.ipv6, forced, runner)?;
            apply::install_with(&generate(config), &tools, install, runner)?;
            host_net::configure(config, runner)?;
        }
        (Backend::Iptables(forced), Action::CleanupOnly) => {
            let tools = IptablesToolset::detect(config.ipv6, forced, runner)?;
            apply::cleanup_with(&generate(config), &tools, runner)?;
            if !config.ipv6 {
                // An earlier run with --dual-stack (or while the pod had an IPv6 address) left
                // ip6tables rules that are ours too. Best effort: a kernel without IPv6 has
                // nothing to remove.
                let both = CaptureConfig {
                    ipv6: true,
                    ..config.clone()
                };
                let removed = IptablesToolset::detect(true, forced, runner)
                    .and_then(|tools| apply::cleanup_with(&generate(&both), &tools, runner));
                if let Err(e) = removed {
                    tracing::debug!(error = %e, "no IPv6 capture rules removed");
                }
            }
        }
        (Backend::Nftables, Action::Apply) => {
            nft::apply::install(&nft::generate_nft(config), install, runner)?;
            host_net::configure(config, runner)?;
        }
        (Backend::Nftables, Action::CleanupOnly) => nft::apply::cleanup(runner)?,
    }
    Ok(())
}

/// What `--dry-run` prints, or `None` when this is not a dry run: the restore inputs (with
/// iptables) or the `nft -f` program (with `--native-nftables`). A dry run with
/// `--cleanup-only` prints nothing for iptables, whose removal depends on what is installed,
/// and the fixed removal program for nftables.
pub fn dry_run_output(config: &CaptureConfig, options: &RunOptions) -> Option<String> {
    let Action::DryRun { cleanup_only } = options.action else {
        return None;
    };
    Some(match (options.backend, cleanup_only) {
        (Backend::Iptables(_), true) => String::new(),
        (Backend::Iptables(_), false) => generate(config).dry_run_output(),
        (Backend::Nftables, true) => nft::program::cleanup_script(),
        (Backend::Nftables, false) => nft::generate_nft(config).script(),
    })
}
