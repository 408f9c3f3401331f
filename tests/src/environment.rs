//! Can this machine run the namespace tests? A test that cannot run skips with a reason, except
//! under `CI=true`, where it must fail loudly instead of passing without having run.

use std::path::Path;

/// Commands the namespace tests run.
const REQUIRED_COMMANDS: &[&str] = &["ip", "iptables", "iptables-restore", "curl", "setpriv"];

/// Why the namespace tests cannot run here, or `None` when they can. Namespace creation itself is
/// checked by [`crate::PodNet::create_or_skip`], which tries it.
pub fn missing_capability() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (network namespaces, iptables, setpriv)".to_string());
    }
    let missing: Vec<&str> = REQUIRED_COMMANDS
        .iter()
        .copied()
        .filter(|c| !on_path(c))
        .collect();
    if !missing.is_empty() {
        return Some(format!("missing commands: {}", missing.join(", ")));
    }
    None
}

/// Skip the calling test (returns `None`), or panic under `CI=true`.
pub fn skip<T>(reason: &str) -> Option<T> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("this end-to-end test cannot run here and CI=true: {reason}");
    }
    eprintln!("skipped: {reason}");
    None
}

/// Whether `command` is on `PATH`.
pub fn has_command(command: &str) -> bool {
    on_path(command)
}

fn on_path(command: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| Path::new(&dir).join(command).is_file())
}
