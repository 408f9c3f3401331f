//! An access-log file both proxies append to, as the differential tests give them one: the
//! file logger's JSON (an inline text format), a file the proxy's UID may write, and a bounded
//! wait for its lines.

use crate::PodNet;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Envoy's file logger writing `format` to `path`, as a listener's, connection manager's or
/// `tcp_proxy`'s `access_log`.
pub fn file_log(path: &Path, format: &str) -> Value {
    json!([{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
        "path": path.to_str().expect("utf-8 path"),
        "log_format": {"text_format_source": {"inline_string": format}}}}])
}

/// An empty file UID 1337 (the proxy) may append to.
pub fn log_file(net: &PodNet) -> PathBuf {
    let logs = net.binary().make_dir("logs");
    std::os::unix::fs::chown(&logs, Some(crate::PROXY_UID), Some(crate::PROXY_UID)).expect("chown");
    let log = logs.join("access.log");
    std::fs::write(&log, "").expect("write");
    std::os::unix::fs::chown(&log, Some(crate::PROXY_UID), Some(crate::PROXY_UID)).expect("chown");
    log
}

/// The file's text (empty when it cannot be read).
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Wait (up to 5 s) for `path` to hold `n` lines; the test fails with them and `output` (the
/// proxy's) otherwise.
pub fn wait_for_lines(path: &Path, n: usize, output: &dyn Fn() -> String) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = read(path);
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} lines in {}:\n{text}\n{}",
            lines.len(),
            path.display(),
            output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
