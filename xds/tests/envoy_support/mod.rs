//! The real Envoy the differential tests run: `$ENVOY_BIN`, or the binary
//! `scripts/install-envoy` caches (running it the first time). Without one a test is skipped
//! with its reason printed; under `CI=true` it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Bound on installing Envoy the first time.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(300);

pub fn envoy_binary() -> Option<PathBuf> {
    let found = match std::env::var_os("ENVOY_BIN") {
        Some(path) => Some(PathBuf::from(path))
            .filter(|p| p.is_file())
            .ok_or_else(|| "ENVOY_BIN is not a file".to_owned()),
        // Once per test process: two installs at once would race on the cache directory.
        None => {
            static INSTALLED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
            INSTALLED.get_or_init(install_envoy).clone()
        }
    };
    match found {
        Ok(path) => Some(path),
        Err(reason) => {
            let reason = format!("no Envoy binary: {reason}");
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{reason}");
            }
            println!("skipped: {reason}");
            None
        }
    }
}

/// The binary `scripts/install-envoy` caches (installing it the first time, bounded by
/// [`INSTALL_TIMEOUT`]): the last line of its output.
fn install_envoy() -> Result<PathBuf, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/install-envoy");
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    let file = |p: &Path| std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut child = Command::new(&script)
        .stdin(Stdio::null())
        .stdout(file(&out_path)?)
        .stderr(file(&err_path)?)
        .spawn()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    let deadline = Instant::now() + INSTALL_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} took over {INSTALL_TIMEOUT:?}",
                    script.display()
                ));
            }
            Err(e) => return Err(format!("{}: {e}", script.display())),
        }
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    match stdout.lines().last().map(PathBuf::from) {
        Some(path) if status.success() && path.is_file() => Ok(path),
        _ => Err(format!(
            "{} failed ({status}): {}",
            script.display(),
            std::fs::read_to_string(&err_path)
                .unwrap_or_default()
                .trim()
        )),
    }
}
