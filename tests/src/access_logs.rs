//! Access-log files for the differential tests: Envoy's file logger as both proxies are given
//! it, a file the proxy (UID 1337) may append to, and waiting for it to hold a number of lines.

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

/// A new, empty file named `name` (in a directory of its own) that UID 1337 may append to.
pub fn log_file(net: &PodNet, name: &str) -> PathBuf {
    let logs = net.binary().make_dir("logs");
    std::os::unix::fs::chown(&logs, Some(crate::PROXY_UID), Some(crate::PROXY_UID)).expect("chown");
    let log = logs.join(name);
    std::fs::write(&log, "").expect("write");
    std::os::unix::fs::chown(&log, Some(crate::PROXY_UID), Some(crate::PROXY_UID)).expect("chown");
    log
}

/// The file's content, empty when it does not exist.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The file's lines.
pub fn lines(path: &Path) -> Vec<String> {
    read(path).lines().map(str::to_string).collect()
}

/// Wait (up to 5 s) for `path` to hold `n` lines; its lines. `output` (the proxy's own
/// output) is printed if they do not come.
pub fn wait_for_lines(path: &Path, n: usize, output: &dyn Fn() -> String) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let lines = lines(path);
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} lines in {}:\n{}\n{}",
            lines.len(),
            path.display(),
            read(path),
            output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
