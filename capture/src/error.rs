//! Errors of `remora capture`. Their `Display` is what the user sees, so each names the flag,
//! file or command at fault.

use std::io;
use std::path::PathBuf;

/// Everything that can stop `remora capture`.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// A flag or environment input has a value we cannot turn into rules.
    #[error(transparent)]
    Flag(#[from] FlagError),
    /// The pod's nameservers could not be read.
    #[error("cannot read nameservers from {path}: {source}")]
    ResolvConf {
        /// The file we tried to read.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
    /// The pod's interface addresses could not be listed.
    #[error("cannot list the pod's interface addresses: {0}")]
    Interfaces(#[source] io::Error),
    /// An external command (iptables-restore, iptables-save, ip) failed.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// A chain we do not own jumps into one of ours, so ours cannot be removed.
    #[error(
        "cannot remove {table}/{target}: it is referenced from chain {chain}, which Remora did not \
         create; remove that reference first"
    )]
    ForeignReference {
        /// The table holding both chains.
        table: String,
        /// The foreign chain holding the jump.
        chain: String,
        /// The ISTIO_* chain it jumps to.
        target: String,
    },
    /// No iptables binary set can program the nat table.
    #[error("{}", no_usable_iptables(family, *forced, attempts))]
    NoUsableIptables {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The set was forced with `--force-iptables-binary`.
        forced: bool,
        /// Each binary tried, and why it cannot be used.
        attempts: Vec<(String, crate::iptables_binaries::Unusable)>,
    },
    /// Capture rules are installed but differ from the wanted ones, and `--reconcile` was not
    /// given.
    #[error(
        "{family} capture rules from an earlier run are installed and differ from the ones \
         these flags install; rerun with --reconcile to replace them, or with --cleanup-only to \
         remove them"
    )]
    Drift {
        /// `IPv4` or `IPv6`.
        family: &'static str,
    },
    /// `--native-nftables` is set but `nft` cannot be run.
    #[error(
        "--native-nftables is set, but the nft binary cannot be run (install the nftables \
         package): {0}"
    )]
    NftMissing(#[source] io::Error),
    /// `--run-validation` found that connections are not redirected.
    #[error(transparent)]
    Validation(#[from] crate::validation::ValidationError),
    /// A network namespace could not be entered.
    #[error("cannot enter network namespace {path}: {source}")]
    Netns {
        /// The namespace's path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// `remora capture explain` could not do its work.
    #[error(transparent)]
    Explain(#[from] crate::explain::ExplainError),
    /// Writing the dry-run output failed.
    #[error("cannot write the dry-run output: {0}")]
    Stdout(#[source] io::Error),
}

impl CaptureError {
    /// The process exit status for this error: 126 when validation failed (what
    /// istio-iptables exits with, and what Istio's CNI repair controller looks for), else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            CaptureError::Validation(_) => crate::validation::EXIT_CODE,
            _ => 1,
        }
    }
}

fn no_usable_iptables(
    family: &str,
    forced: bool,
    attempts: &[(String, crate::iptables_binaries::Unusable)],
) -> String {
    use crate::iptables_binaries::Unusable;
    let cause = if attempts
        .iter()
        .all(|(_, why)| matches!(why, Unusable::NotInstalled(_)))
    {
        "no iptables binaries are installed (install the iptables package)"
    } else if attempts
        .iter()
        .any(|(_, why)| matches!(why, Unusable::NoNatTable(_)))
    {
        "the kernel offers no usable nat table (load iptable_nat for legacy or nft_chain_nat \
         for nf_tables), or this process lacks NET_ADMIN"
    } else {
        "every iptables binary set failed"
    };
    let tried: Vec<String> = attempts
        .iter()
        .map(|(binary, why)| format!("{binary}: {why}"))
        .collect();
    let forced = if forced {
        " (forced with --force-iptables-binary)"
    } else {
        ""
    };
    format!(
        "cannot install {family} capture rules{forced}: {cause}; tried {}",
        tried.join("; ")
    )
}

/// A flag (or the environment variable standing in for it) has an unusable value.
#[derive(Debug, thiserror::Error)]
#[error("invalid value {value:?} for {flag}: {reason}")]
pub struct FlagError {
    /// The flag as the user knows it, e.g. `--istio-service-cidr` or `ISTIO_OUTBOUND_OWNER_GROUPS`.
    pub flag: &'static str,
    /// The offending value (one list item when the flag takes a list).
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FlagError {
    pub(crate) fn new(flag: &'static str, value: &str, reason: impl Into<String>) -> Self {
        FlagError {
            flag,
            value: value.to_owned(),
            reason: reason.into(),
        }
    }
}

/// An external command could not be started, did not finish in time, or exited non-zero.
#[derive(Debug, thiserror::Error)]
#[error("`{command}` {failure}")]
pub struct CommandError {
    /// The command line, including any prefix such as `ip netns exec NS`.
    pub command: String,
    /// What went wrong.
    pub failure: CommandFailure,
}

/// How an external command failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandFailure {
    /// The process could not be started (e.g. the binary is not installed).
    #[error("could not be started: {0}")]
    Spawn(#[source] io::Error),
    /// Talking to the process (stdin/stdout) failed.
    #[error("i/o with the process failed: {0}")]
    Io(#[source] io::Error),
    /// The process ran longer than its bound and was killed.
    #[error("did not finish within {0:?} and was killed")]
    Timeout(std::time::Duration),
    /// The process exited unsuccessfully.
    #[error("failed ({status}): {stderr}")]
    Exit {
        /// The exit status as the OS reports it.
        status: std::process::ExitStatus,
        /// Its standard error, trimmed.
        stderr: String,
    },
}

impl CommandError {
    /// The command's standard error when it ran and failed.
    pub fn stderr(&self) -> Option<&str> {
        match &self.failure {
            CommandFailure::Exit { stderr, .. } => Some(stderr),
            _ => None,
        }
    }
}
