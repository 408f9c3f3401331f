//! What the filter-chain drain tests (`xds_chain_drain.rs` outbound, `xds_inbound_drain.rs`
//! inbound) share: the drain time both proxies are given, a line echo to hold a connection
//! open on, and how a held connection is watched (still echoing, then closed, and how) and
//! what the proxies logged for it.

use remora_e2e::peer::Server;
use remora_e2e::Netns;
use serde_json::{json, Value};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub const DRAIN_TIME: Duration = Duration::from_secs(2);
/// When the connections of retired chains are checked to be still open, after the update was
/// written: before the drain time could have run out, however soon the update was seen.
pub const STILL_OPEN_AT: Duration = Duration::from_millis(1500);
/// Bound on the close after the update was written: the drain time, Remora's one-second poll
/// of its directory and its settling, and slack for a loaded machine.
pub const CLOSED_BY: Duration = Duration::from_secs(7);
/// Envoy's command-line flags for a drain time of `drain_time`, as pilot-agent starts it.
pub fn envoy_drain_args(drain_time: Duration) -> [String; 4] {
    [
        "--drain-time-s".into(),
        drain_time.as_secs().to_string(),
        "--drain-strategy".into(),
        "immediate".into(),
    ]
}

/// Remora's config for the same drain time.
pub fn remora_drain_config(drain_time: Duration) -> String {
    format!("drain:\n  drain_time: {}s\n", drain_time.as_secs())
}

/// A file access log to Envoy's (and Remora's) stdout in `format`, for a `tcp_proxy`.
pub fn stdout_access_log(format: &str) -> Value {
    json!([{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
        "path": "/dev/stdout",
        "log_format": {"text_format_source": {"inline_string": format}}}}])
}

/// An echo of lines on `addr` in `ns` that keeps its connection open until the client closes
/// it.
pub fn line_echo(ns: &Netns, addr: SocketAddr) -> Server {
    Server::start(ns, addr, |stream| {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut stream = stream;
        // Bounded: a test sends a handful of lines.
        for _ in 0..1000 {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            stream.write_all(line.as_bytes())?;
        }
        Ok(())
    })
}

/// Whether `line` comes back over `stream`.
pub fn echoes(stream: &mut TcpStream, line: &str) -> io::Result<()> {
    stream.write_all(format!("{line}\n").as_bytes())?;
    let mut got = vec![0u8; line.len() + 1];
    stream.read_exact(&mut got)?;
    match got == format!("{line}\n").as_bytes() {
        true => Ok(()),
        false => Err(io::Error::other(format!("echoed {got:?}"))),
    }
}

/// How the proxy closed a connection: with an end of stream, or a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    End,
    Reset,
}

/// Wait, up to `until` after `written`, for the proxy to close `stream`; how long after
/// `written` it did, and how, or `None`.
pub fn closed_after(
    stream: &mut TcpStream,
    written: Instant,
    until: Duration,
) -> Option<(Duration, Close)> {
    loop {
        let left = until.checked_sub(written.elapsed())?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(10))))
            .ok()?;
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => return Some((written.elapsed(), Close::End)),
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if written.elapsed() >= until {
                    return None;
                }
            }
            Err(_) => return Some((written.elapsed(), Close::Reset)),
        }
    }
}

/// The access-log lines from `marker` on, sorted, once `count` are written (the logs are
/// flushed a little after the connections end), or as they are after a few seconds.
pub fn log_lines(marker: &str, count: usize, logs: impl Fn() -> String) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let mut lines: Vec<String> = logs()
            .lines()
            .filter_map(|l| l.find(marker).map(|at| l[at..].to_string()))
            .collect();
        lines.sort();
        if lines.len() >= count || Instant::now() >= deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
