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
    /// Writing the dry-run output failed.
    #[error("cannot write the dry-run output: {0}")]
    Stdout(#[source] io::Error),
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
