//! Reading what crosses the wire: `tcpdump` on an interface inside a namespace, writing every
//! packet whole to a file, so a test can show that a payload crossed encrypted (its bytes are
//! not in the capture) and how (the ClientHello's cleartext ALPN is).

use crate::netns::Netns;
use crate::process::spawn;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Bound on tcpdump starting to capture and on it finishing its file.
const TCPDUMP_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

/// A running packet capture.
#[derive(Debug)]
pub struct Sniffer {
    child: Child,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Sniffer {
    /// Capture whole packets on `iface` in `ns` that match the pcap `filter`; returns once
    /// tcpdump is capturing.
    pub fn start(ns: &Netns, iface: &str, filter: &str) -> Sniffer {
        let dir = tempfile::tempdir().expect("a directory for the capture");
        let file = dir.path().join("capture.pcap");
        let stderr = dir.path().join("tcpdump.stderr");
        let mut cmd = ns.command("tcpdump");
        // Immediate mode: otherwise packets wait in the kernel's ring for a block to fill or
        // time out, and a short capture stopped with SIGINT can lose all of them.
        cmd.args(["-i", iface, "-n", "-U", "--immediate-mode", "-s", "0", "-w"])
            .arg(&file)
            .arg(filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("tcpdump's stderr file"));
        let child = spawn(&mut cmd).expect("spawn tcpdump");
        let deadline = Instant::now() + TCPDUMP_TIMEOUT;
        // tcpdump says "listening on IFACE" once the capture is open.
        while !std::fs::read_to_string(&stderr)
            .unwrap_or_default()
            .contains("listening on")
        {
            assert!(
                Instant::now() < deadline,
                "tcpdump did not start: {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
            std::thread::sleep(POLL);
        }
        Sniffer {
            child,
            file,
            _dir: dir,
        }
    }

    /// Stop capturing and return the capture file's bytes (pcap: headers and whole packets).
    pub fn stop(mut self) -> Vec<u8> {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("a PID fits i32"));
        let _ = kill(pid, Signal::SIGINT);
        let deadline = Instant::now() + TCPDUMP_TIMEOUT;
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(POLL);
        }
        let _ = self.child.wait();
        std::fs::read(&self.file).expect("read the capture")
    }
}

impl Drop for Sniffer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
