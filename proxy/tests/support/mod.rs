//! What the tests that run `remora` as a process share: free ports, a config on loopback, the
//! process with its stderr kept, and small HTTP and metrics readers.

// Test helpers fail loudly by design; each test file uses a different part of them.
#![allow(clippy::unwrap_used, dead_code)]

pub mod certs;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_remora");

/// A port free now and not handed to another test of this process: tests run in parallel, and
/// the kernel may give a just-released port out again.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

pub struct Ports {
    pub outbound: u16,
    pub inbound: u16,
    pub readiness: u16,
    pub metrics: u16,
    pub agent: u16,
    pub admin: u16,
}

impl Ports {
    pub fn new() -> Self {
        Ports {
            outbound: free_port(),
            inbound: free_port(),
            readiness: free_port(),
            metrics: free_port(),
            agent: free_port(),
            admin: free_port(),
        }
    }

    /// A config on loopback with these ports, plus `extra` YAML.
    pub fn config(&self, extra: &str) -> String {
        format!(
            "bind_addresses: [127.0.0.1]\noutbound:\n  port: {}\ninbound:\n  port: {}\nreadiness:\n  port: {}\nmetrics:\n  port: {}\nagent:\n  port: {}\nadmin:\n  address: 127.0.0.1:{}\nreload:\n  watch_interval: 100ms\n{extra}",
            self.outbound, self.inbound, self.readiness, self.metrics, self.agent, self.admin
        )
    }
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("remora-run-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Remora(pub Child);

impl Remora {
    /// Start `remora run --config FILE`; its stderr goes to `FILE.stderr` (never a pipe nobody
    /// reads, which would stall it once full).
    pub fn start(config: &Path) -> Self {
        let stderr = std::fs::File::create(config.with_extension("stderr")).unwrap();
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        Remora(child)
    }

    /// Wait for readiness; on failure say whether remora exited and what it printed.
    pub fn wait_ready(&mut self, config: &Path, readiness: u16) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if get(readiness, "/healthz/ready").is_ok_and(|(s, _)| s == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = self.0.try_wait().ok().flatten();
        let stderr = std::fs::read_to_string(config.with_extension("stderr")).unwrap_or_default();
        panic!("remora not ready within 10 s (exit status {status:?}); stderr:\n{stderr}");
    }
}

impl Drop for Remora {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A plain HTTP/1.1 GET; returns (status, body).
pub fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((status, body))
}

pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

pub fn metric(port: u16, line_prefix: &str) -> Option<u64> {
    let (_, body) = get(port, "/stats/prometheus").ok()?;
    body.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A Remora serving one explicit listener (`--listen` on a free port) forwarding to `upstream`
/// with `protocol`, ready; its side ports are free ones too.
pub struct Explicit {
    pub ports: Ports,
    pub listen: u16,
    _remora: Remora,
    _dir: TempDir,
}

impl Explicit {
    pub fn start(name: &str, upstream: std::net::SocketAddr, protocol: &str) -> Explicit {
        Explicit::start_with_env(name, upstream, protocol, &[])
    }

    /// The same, with `env` in Remora's environment.
    pub fn start_with_env(
        name: &str,
        upstream: std::net::SocketAddr,
        protocol: &str,
        env: &[(&str, &str)],
    ) -> Explicit {
        let dir = TempDir::new(name);
        let ports = Ports::new();
        let path = dir.0.join("remora.yaml");
        std::fs::write(&path, ports.config("")).unwrap();
        let listen = free_port();
        let child = std::process::Command::new(BIN)
            .args(["run", "--config"])
            .arg(&path)
            .args(["--listen", &format!("127.0.0.1:{listen}")])
            .args(["--upstream", &upstream.to_string(), "--protocol", protocol])
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let remora = Remora(child);
        wait_until("readiness", || {
            get(ports.readiness, "/healthz/ready").is_ok_and(|(s, _)| s == 200)
        });
        Explicit {
            ports,
            listen,
            _remora: remora,
            _dir: dir,
        }
    }
}
