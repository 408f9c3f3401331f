//! Running code inside another network namespace (`--network-namespace`) without `unsafe`:
//! a dedicated thread enters the namespace with `setns(2)` (which only changes that thread)
//! and ends when the work is done, so no other thread ever sees the switch.
//!
//! External commands do not need this: the [`crate::runner`] prefixes them with `nsenter`.
//! It is for what this process does itself: listing the pod's addresses and the validation's
//! sockets.

use std::path::Path;

use nix::sched::CloneFlags;

use crate::error::CaptureError;

/// Runs `work` on a new thread, inside the network namespace at `path` when one is given (in
/// this process's namespace otherwise). Sockets it creates belong to that namespace.
pub fn run_in<T: Send>(
    path: Option<&Path>,
    work: impl FnOnce() -> T + Send,
) -> Result<T, CaptureError> {
    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            if let Some(path) = path {
                let enter = |source| CaptureError::Netns {
                    path: path.to_owned(),
                    source,
                };
                let file = std::fs::File::open(path).map_err(enter)?;
                nix::sched::setns(&file, CloneFlags::CLONE_NEWNET)
                    .map_err(|e| enter(std::io::Error::from(e)))?;
            }
            Ok(work())
        });
        // A panic in `work` is a bug, not an outcome; let it surface as one.
        worker
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_path_runs_here() {
        assert_eq!(run_in(None, || 7).unwrap(), 7);
    }

    #[test]
    fn a_missing_namespace_is_an_error_naming_it() {
        let path = Path::new("/nonexistent/remora-netns");
        let err = run_in(Some(path), || ()).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/remora-netns"),
            "{err}"
        );
    }
}
