//! Running external commands (iptables-restore, iptables-save, ip).
//!
//! [`Runner`] is the seam between the installer and the machine: [`SystemRunner`] runs the
//! commands, optionally behind a prefix that enters a network namespace (`ip netns exec NS`
//! for a named one, `nsenter --net=PATH` for `--network-namespace`), which is also how tests
//! apply rules inside a namespace of their own instead of the machine's. Entering the
//! namespace in a child process keeps this crate free of `unsafe` and of thread-state tricks.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{CommandError, CommandFailure};

/// How long one command may run. iptables-restore takes milliseconds; legacy iptables may
/// wait for the xtables lock, and a pod's init container must fail rather than hang.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a running command is polled for exit.
const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Runs a command and returns its standard output.
pub trait Runner {
    /// Runs `program args`, feeding it `stdin` if given.
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, CommandError>;
}

/// Runs commands on this machine, optionally prefixed (e.g. `ip netns exec NS`).
#[derive(Debug, Clone, Default)]
pub struct SystemRunner {
    prefix: Vec<String>,
    env: Vec<(String, String)>,
    timeout: Option<Duration>,
}

impl SystemRunner {
    /// Runs commands as they are, in this process's network namespace.
    pub fn new() -> Self {
        SystemRunner::default()
    }

    /// Runs every command as `ip netns exec NAMESPACE command...`.
    pub fn in_netns(namespace: &str) -> Self {
        let prefix = ["ip", "netns", "exec", namespace];
        SystemRunner {
            prefix: prefix.map(str::to_owned).to_vec(),
            ..SystemRunner::default()
        }
    }

    /// Runs every command as `nsenter --net=PATH command...`, inside the network namespace
    /// that `path` (e.g. `/var/run/netns/NAME` or `/proc/PID/ns/net`) refers to.
    pub fn in_netns_path(path: &std::path::Path) -> Self {
        SystemRunner {
            prefix: vec!["nsenter".to_owned(), format!("--net={}", path.display())],
            ..SystemRunner::default()
        }
    }

    /// Sets an environment variable for every command (the process's own environment is
    /// left alone).
    pub fn with_env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The command line that would run, for logs and errors.
    fn command_line(&self, program: &str, args: &[&str]) -> Vec<String> {
        let own = std::iter::once(program).chain(args.iter().copied());
        self.prefix
            .iter()
            .cloned()
            .chain(own.map(str::to_owned))
            .collect()
    }
}

impl Runner for SystemRunner {
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, CommandError> {
        let argv = self.command_line(program, args);
        let command = argv.join(" ");
        let fail = |failure| CommandError {
            command: command.clone(),
            failure,
        };
        tracing::debug!(%command, "running");
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| fail(CommandFailure::Spawn(e)))?;

        // Feed stdin and drain stdout/stderr on their own threads so that no pipe can fill
        // up and block the child while we wait for it.
        let input = stdin.map(str::to_owned);
        let mut child_stdin = child.stdin.take();
        let mut child_stdout = child.stdout.take();
        let mut child_stderr = child.stderr.take();
        let timeout = self.timeout.unwrap_or(COMMAND_TIMEOUT);
        let (status, written, stdout, stderr) = std::thread::scope(|s| {
            // The pipe is dropped when this thread ends, which closes the child's stdin.
            let writer = s.spawn(move || match (child_stdin.as_mut(), input) {
                (Some(pipe), Some(text)) => pipe.write_all(text.as_bytes()),
                _ => Ok(()),
            });
            let out = s.spawn(move || read_all(child_stdout.as_mut()));
            let err = s.spawn(move || read_all(child_stderr.as_mut()));
            let status = wait_bounded(&mut child, timeout);
            let written = writer.join().unwrap_or(Ok(()));
            let stdout = out.join().unwrap_or_default();
            let stderr = err.join().unwrap_or_default();
            (status, written, stdout, stderr)
        });
        let status = status.map_err(fail)?;
        if !status.success() {
            let stderr = String::from_utf8_lossy(&stderr).trim().to_owned();
            return Err(fail(CommandFailure::Exit { status, stderr }));
        }
        // Checked after the exit status: a child that fails early also breaks the pipe, and
        // its own error says more.
        written.map_err(|e| fail(CommandFailure::Io(e)))?;
        Ok(String::from_utf8_lossy(&stdout).into_owned())
    }
}

fn read_all(pipe: Option<&mut impl Read>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(pipe) = pipe {
        // A read error only loses output we would show in an error message.
        let _ = pipe.read_to_end(&mut buf);
    }
    buf
}

fn wait_bounded(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Result<std::process::ExitStatus, CommandFailure> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL_INTERVAL),
            Ok(None) => {
                // Killing may race with a normal exit; either way, reap it.
                let _ = child.kill();
                let _ = child.wait();
                return Err(CommandFailure::Timeout(timeout));
            }
            Err(e) => return Err(CommandFailure::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_stdout_and_feeds_stdin() {
        let out = SystemRunner::new().run("cat", &[], Some("a\nb\n")).unwrap();
        assert_eq!(out, "a\nb\n");
    }

    #[test]
    fn failure_names_the_command_status_and_stderr() {
        let err = SystemRunner::new()
            .run("sh", &["-c", "echo oops >&2; exit 3"], None)
            .unwrap_err();
        assert_eq!(err.stderr(), Some("oops"));
        let message = err.to_string();
        assert!(
            message.contains("`sh -c echo oops >&2; exit 3`"),
            "{message}"
        );
        assert!(message.contains("exit status: 3"), "{message}");
    }

    #[test]
    fn missing_binary_is_a_spawn_error() {
        let err = SystemRunner::new()
            .run("remora-no-such-binary", &[], None)
            .unwrap_err();
        assert!(matches!(err.failure, CommandFailure::Spawn(_)), "{err}");
    }

    #[test]
    fn slow_commands_are_killed() {
        let runner = SystemRunner {
            timeout: Some(Duration::from_millis(100)),
            ..SystemRunner::new()
        };
        let err = runner.run("sleep", &["5"], None).unwrap_err();
        assert!(matches!(err.failure, CommandFailure::Timeout(_)), "{err}");
    }

    #[test]
    fn netns_prefix_is_prepended() {
        let runner = SystemRunner::in_netns("ns1");
        let argv = runner.command_line("iptables-save", &["-t", "nat"]);
        assert_eq!(argv.join(" "), "ip netns exec ns1 iptables-save -t nat");
        let runner = SystemRunner::in_netns_path(std::path::Path::new("/proc/7/ns/net"));
        let argv = runner.command_line("nft", &["-f", "-"]);
        assert_eq!(argv.join(" "), "nsenter --net=/proc/7/ns/net nft -f -");
    }

    #[test]
    fn environment_reaches_the_command_only() {
        let runner = SystemRunner::new().with_env("REMORA_RUNNER_TEST", "yes");
        let out = runner
            .run("sh", &["-c", "echo $REMORA_RUNNER_TEST"], None)
            .unwrap();
        assert_eq!(out, "yes\n");
        assert!(std::env::var_os("REMORA_RUNNER_TEST").is_none());
    }
}
