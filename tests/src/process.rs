//! Processes: bounded commands, the installed `remora` binary, and a running `remora run`.

use crate::metrics::Metrics;
use crate::netns::Netns;
use crate::peer::http_get;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::fs::{self, File, Permissions};
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::{Duration, Instant};

/// How often a bounded wait looks again.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Bound on `remora run` becoming ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one readiness or metrics request.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// Counter that makes config and log file names unique within one work directory.
static NEXT_FILE: AtomicU32 = AtomicU32::new(0);

/// Tests run in parallel threads. A child forked while another thread holds a freshly copied
/// executable open for writing inherits that descriptor until it execs, and exec of the copy
/// then fails with ETXTBSY ("Text file busy"). So every spawn here holds this lock shared and
/// every copy of an executable holds it exclusively.
static SPAWN_LOCK: RwLock<()> = RwLock::new(());

pub(crate) fn spawn(cmd: &mut Command) -> io::Result<Child> {
    let _shared = SPAWN_LOCK.read().unwrap_or_else(PoisonError::into_inner);
    cmd.spawn()
}

/// Run a command to completion, killing it if it outlives `timeout`.
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> io::Result<Output> {
    run_bounded_with_input(cmd, Stdio::null(), timeout)
}

/// [`run_bounded`], with `stdin` as the command's standard input.
pub fn run_bounded_with_input(
    cmd: &mut Command,
    stdin: Stdio,
    timeout: Duration,
) -> io::Result<Output> {
    let mut child = spawn(
        cmd.stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )?;
    // Drain both pipes on their own threads so a chatty child never blocks on a full pipe.
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);
    let status = match wait_bounded(&mut child, timeout)? {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{cmd:?} did not finish within {timeout:?}"),
            ));
        }
    };
    let collect = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
        h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
    };
    Ok(Output {
        status,
        stdout: collect(stdout),
        stderr: collect(stderr),
    })
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        buf
    })
}

/// Wait for `child` to exit, at most `timeout`. `None` if it is still running.
fn wait_bounded(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// A private copy of the `remora` binary in a fresh directory that UID 1337 can enter, read and
/// execute (the checkout may sit under a 0700 home). The directory also holds configs and logs.
#[derive(Debug)]
pub struct RemoraBinary {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl RemoraBinary {
    /// Copy the binary under test; panics with what to do if it has not been built.
    pub fn install() -> RemoraBinary {
        let source = locate_binary();
        let dir = tempfile::Builder::new()
            .prefix("remora-e2e-")
            .tempdir()
            .expect("create a temporary directory");
        fs::set_permissions(dir.path(), Permissions::from_mode(0o755))
            .expect("make the temporary directory world-readable");
        let path = dir.path().join("remora");
        {
            let _exclusive = SPAWN_LOCK.write().unwrap_or_else(PoisonError::into_inner);
            fs::copy(&source, &path)
                .unwrap_or_else(|e| panic!("copy {} to {}: {e}", source.display(), path.display()));
        }
        fs::set_permissions(&path, Permissions::from_mode(0o755))
            .expect("make the remora copy executable");
        RemoraBinary { dir, path }
    }

    /// The copied binary.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write a file (mode 0644) into the work directory under a unique name; returns its path.
    pub fn write_file(&self, stem: &str, contents: &str) -> PathBuf {
        let path = self.unique_path(stem);
        fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        fs::set_permissions(&path, Permissions::from_mode(0o644))
            .expect("make the file world-readable");
        path
    }

    /// A fresh directory (mode 0755) in the work directory, which UID 1337 can read.
    pub fn make_dir(&self, stem: &str) -> PathBuf {
        let path = self.unique_path(stem);
        fs::create_dir(&path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        fs::set_permissions(&path, Permissions::from_mode(0o755))
            .expect("make the directory world-readable");
        path
    }

    fn unique_path(&self, stem: &str) -> PathBuf {
        let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
        self.dir.path().join(format!("{n}-{stem}"))
    }
}

/// `target/<profile>/remora` next to this test's `deps/` directory, or `$REMORA_BIN`.
fn locate_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("REMORA_BIN") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "REMORA_BIN={} is not a file",
            path.display()
        );
        return path;
    }
    let exe = std::env::current_exe().expect("find the test executable");
    // target/<profile>/deps/<test-binary> -> target/<profile>/remora
    let candidate = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("remora"));
    match candidate {
        Some(path) if path.is_file() => path,
        _ => panic!(
            "the remora binary was not found next to {} (expected {}); run `cargo build -p remora` \
             first, or point REMORA_BIN at it",
            exe.display(),
            candidate.map_or_else(|| "?".into(), |p| p.display().to_string()),
        ),
    }
}

/// A `remora run` being configured; [`RemoraCommand::start`] runs it in the pod namespace as
/// UID/GID 1337 with its stdout and stderr going to files in the work directory.
#[derive(Debug)]
pub struct RemoraCommand<'a> {
    ns: &'a Netns,
    binary: &'a RemoraBinary,
    config: Option<String>,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    uid: u32,
    gid: u32,
}

impl<'a> RemoraCommand<'a> {
    pub(crate) fn new(ns: &'a Netns, binary: &'a RemoraBinary) -> Self {
        RemoraCommand {
            ns,
            binary,
            config: None,
            args: Vec::new(),
            envs: Vec::new(),
            uid: crate::PROXY_UID,
            gid: crate::PROXY_UID,
        }
    }

    /// Write `yaml` to a file and pass it as `--config FILE`.
    pub fn config(mut self, yaml: &str) -> Self {
        self.config = Some(yaml.to_string());
        self
    }

    /// An extra argument after `run`.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// An environment variable for the process.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Run as this UID and GID instead of 1337/1337 (Istio's TPROXY mode runs the proxy as
    /// UID 0, GID 1337). As UID 0 the process keeps root's capabilities (`NET_ADMIN`).
    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.uid = uid;
        self.gid = gid;
        self
    }

    /// Start the process without waiting for it to become ready.
    pub fn start(self) -> Remora<'a> {
        let (uid, gid) = (self.uid.to_string(), self.gid.to_string());
        let mut cmd = self.ns.command("setpriv");
        cmd.args(["--reuid", &uid, "--regid", &gid, "--clear-groups"])
            .arg(self.binary.path())
            .arg("run");
        if let Some(yaml) = &self.config {
            cmd.arg("--config")
                .arg(self.binary.write_file("remora.yaml", yaml));
        }
        cmd.args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)));
        let stdout_path = self.binary.unique_path("remora.stdout");
        let stderr_path = self.binary.unique_path("remora.stderr");
        let stdout = File::create(&stdout_path).expect("create the stdout log");
        let stderr = File::create(&stderr_path).expect("create the stderr log");
        // `ip netns exec` and `setpriv` both exec, so the child's PID is remora's own and a
        // signal sent to it reaches remora.
        let child = spawn(cmd.stdin(Stdio::null()).stdout(stdout).stderr(stderr))
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        Remora {
            ns: self.ns,
            child,
            status: None,
            stdout_path,
            stderr_path,
        }
    }

    /// Start the process and wait until `/healthz/ready` answers 200.
    pub fn start_ready(self) -> Remora<'a> {
        let mut remora = self.start();
        remora.wait_ready(READY_TIMEOUT);
        remora
    }
}

/// A running `remora run`, killed on drop.
#[derive(Debug)]
pub struct Remora<'a> {
    ns: &'a Netns,
    child: Child,
    status: Option<ExitStatus>,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
}

impl Remora<'_> {
    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything remora has written to stderr so far (its logs).
    pub fn stderr(&self) -> String {
        fs::read(&self.stderr_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| format!("(cannot read stderr log: {e})"))
    }

    /// Everything remora has written to stdout so far (its access log).
    pub fn stdout(&self) -> String {
        fs::read(&self.stdout_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| format!("(cannot read stdout log: {e})"))
    }

    /// Wait (up to 5 s) for a line containing `needle` in the access log (stdout); panics with
    /// both logs when none comes.
    pub fn wait_for_access_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = self.stdout();
            if out.contains(needle) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no access-log line with {needle:?}; stdout:\n{out}\nstderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status, if the process has exited.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("poll remora's status");
        }
        self.status
    }

    /// The status code of `GET /healthz/ready`, or `None` if it cannot be fetched.
    pub fn readiness(&self) -> Option<u16> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, crate::READINESS_PORT));
        http_get(self.ns, addr, "/healthz/ready", SCRAPE_TIMEOUT)
            .ok()
            .map(|r| r.status)
    }

    /// Wait until `/healthz/ready` answers 200; panics with remora's stderr if it exits first or
    /// is not ready within `timeout`.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            if let Some(status) = self.exit_status() {
                panic!(
                    "remora exited ({status}) before becoming ready; stderr:\n{}",
                    self.stderr()
                );
            }
            last = self.readiness();
            if last == Some(200) {
                return;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        panic!(
            "remora was not ready within {timeout:?} (last readiness status: {last:?}); \
             stderr:\n{}",
            self.stderr()
        );
    }

    /// Scrape `/stats/prometheus`; panics with remora's stderr if that fails.
    pub fn metrics(&self) -> Metrics {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, crate::METRICS_PORT));
        match http_get(self.ns, addr, "/stats/prometheus", SCRAPE_TIMEOUT) {
            Ok(r) if r.status == 200 => Metrics::parse(&r.body),
            Ok(r) => panic!(
                "/stats/prometheus answered {}: {}\nremora stderr:\n{}",
                r.status,
                r.body,
                self.stderr()
            ),
            Err(e) => panic!("/stats/prometheus: {e}\nremora stderr:\n{}", self.stderr()),
        }
    }

    /// Scrape until `ok` holds, at most `timeout`; panics naming `what`, with the last scrape
    /// and remora's stderr, if it never does. Counters move a little after the traffic does.
    pub fn wait_for_metrics(
        &self,
        what: &str,
        timeout: Duration,
        ok: impl Fn(&Metrics) -> bool,
    ) -> Metrics {
        self.metrics_until(timeout, ok).unwrap_or_else(|metrics| {
            panic!(
                "{what}: not seen within {timeout:?}; last scrape:\n{metrics}\nremora stderr:\n{}",
                self.stderr()
            )
        })
    }

    /// Scrape until `ok` holds, at most `timeout`: the scrape that held, or the last one, for
    /// a test to say in its own words what it missed.
    pub fn metrics_until(
        &self,
        timeout: Duration,
        ok: impl Fn(&Metrics) -> bool,
    ) -> Result<Metrics, Metrics> {
        let deadline = Instant::now() + timeout;
        loop {
            let metrics = self.metrics();
            if ok(&metrics) {
                return Ok(metrics);
            }
            if Instant::now() >= deadline {
                return Err(metrics);
            }
            std::thread::sleep(POLL_INTERVAL * 5);
        }
    }

    /// Send SIGTERM (the kubelet's stop signal).
    pub fn terminate(&self) {
        self.signal(Signal::SIGTERM);
    }

    /// SIGKILL the process and reap it.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(status) = self.exit_status() {
            return status;
        }
        self.signal(Signal::SIGKILL);
        let status = self.child.wait().expect("reap remora");
        self.status = Some(status);
        status
    }

    /// Wait for the process to exit, at most `timeout`; `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = wait_bounded(&mut self.child, timeout).expect("wait for remora");
        }
        self.status
    }

    fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.pid()).expect("PID fits in i32"));
        kill(pid, signal).unwrap_or_else(|e| panic!("send {signal} to remora: {e}"));
    }
}

impl Drop for Remora<'_> {
    fn drop(&mut self) {
        // No panics here: this may run while a failed test unwinds.
        if self.status.is_none() && !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
