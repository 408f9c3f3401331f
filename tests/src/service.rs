//! Long-running peer programs (a Python HTTP or gRPC server, a database) started inside a
//! namespace for the length of a test, and killed by PID on drop.

use crate::netns::Netns;
use crate::process::spawn;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Bound on a peer program starting to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// A program running in a namespace until dropped.
#[derive(Debug)]
pub struct Service {
    child: Child,
    what: String,
}

impl Service {
    /// Run `program ARGS` in `ns` and wait until `ready` accepts a TCP connection from inside
    /// `ns`; panics (after killing it) if it exits first or is not ready in time.
    pub fn start(ns: &Netns, program: &str, args: &[&str], ready: SocketAddr) -> Service {
        let mut cmd = ns.command(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = spawn(&mut cmd).unwrap_or_else(|e| panic!("spawn {program} {args:?}: {e}"));
        let mut service = Service {
            child,
            what: format!("{program} {args:?}"),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = service.child.try_wait() {
                panic!(
                    "{} exited ({status}) before accepting connections",
                    service.what
                );
            }
            if ns.connect(ready, Duration::from_secs(1)).is_ok() {
                return service;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not accept connections on {ready} within {START_TIMEOUT:?}",
                service.what
            );
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Python HTTP/1.1 origin (tests/peers/http_server.py) listening on `addr` inside `ns`.
pub fn http_origin(ns: &Netns, addr: SocketAddr) -> Service {
    let script = peer_program("http_server.py");
    let port = addr.port().to_string();
    let script = script.to_string_lossy().into_owned();
    Service::start(ns, "python3", &[&script, &port], addr)
}

/// A file shipped with the tests (`tests/peers/NAME`).
pub fn peer_program(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("peers")
        .join(name)
}

/// Whether `python3 -c "import MODULE"` works: the gRPC tests need `grpcio`.
pub fn python_has(module: &str) -> bool {
    std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
