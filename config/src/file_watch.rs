//! Waking when a file-backed source may have changed, as Envoy watches its file-based config
//! (`path_config_source`, `watched_directory`) with inotify.
//!
//! The watch is on directories, never on the files themselves: the usual ways to update a
//! file in place atomically all replace a directory entry, which a watch on the old file would
//! miss. A writer renames a finished file over the old one (`mv new.json clusters.json`), and
//! Kubernetes updates a mounted ConfigMap by renaming a fresh `..data` symlink over the old one
//! in the mount's directory (the files are symlinks through it). Both are events of the
//! directory. An event only wakes the owner, which still compares what it holds with what is
//! on disk, so an event that changed nothing costs one comparison.
//!
//! `notify` is the crate: it is what the Rust tools that watch files are built on (cargo-watch,
//! watchexec, rust-analyzer, deno), it is maintained, and it uses each system's own interface
//! (inotify on Linux, kqueue or FSEvents on a developer's Mac), so a laptop is watched too.
//! Where no watch can be set (inotify's per-user limit reached, a file system without events),
//! the owner polls at its interval, as Remora did before.

use notify::event::{EventKind, MetadataKind, ModifyKind};
use notify::{RecursiveMode, Watcher as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Watches directories for changes to their entries.
pub struct DirWatch {
    /// Dropping it ends the watch; `None` when no directory could be watched.
    watcher: Option<notify::RecommendedWatcher>,
    /// One stored wake-up at most: a burst of events wakes the owner once more, not per event.
    changed: Arc<Notify>,
    /// Polling: when the next look is due. Kept across calls, so an owner that also waits on
    /// a shorter timer (and so drops the wait for this one) still looks at its interval.
    next_poll: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatch")
            .field("watching", &self.watcher.is_some())
            .finish()
    }
}

impl DirWatch {
    /// Watch each of `dirs` (not their subdirectories). `what` names the source in the log.
    /// Directories that cannot be watched are logged; with none watched, [`DirWatch::changed`]
    /// polls.
    pub fn new(dirs: &[PathBuf], what: &str) -> DirWatch {
        let changed = Arc::new(Notify::new());
        let wake = Arc::clone(&changed);
        let handler = move |event: notify::Result<notify::Event>| match event {
            Ok(e) if matters(&e.kind) => wake.notify_one(),
            Ok(_) => {}
            // A lost event (the kernel's queue overflowed) may have been a change: look.
            Err(_) => wake.notify_one(),
        };
        let mut watcher = match notify::recommended_watcher(handler) {
            Ok(w) => w,
            Err(error) => {
                tracing::warn!(%error, what, "cannot watch files; polling them instead");
                return DirWatch {
                    watcher: None,
                    changed,
                    next_poll: Default::default(),
                };
            }
        };
        let mut watched = 0;
        for dir in dirs {
            match watcher.watch(dir, RecursiveMode::NonRecursive) {
                Ok(()) => watched += 1,
                Err(error) => {
                    tracing::warn!(%error, dir = %dir.display(), what, "cannot watch a directory; polling it instead");
                }
            }
        }
        if watched < dirs.len() {
            // One unwatched directory would miss its changes: poll them all.
            return DirWatch {
                watcher: None,
                changed,
                next_poll: Default::default(),
            };
        }
        tracing::debug!(what, dirs = ?dirs, "watching for changes");
        DirWatch {
            watcher: Some(watcher),
            changed,
            next_poll: Default::default(),
        }
    }

    /// The directories a config file's changes show in: the one holding it and, when it is a
    /// symlink (a ConfigMap's file), the one holding what it points to.
    pub fn dirs_of_file(path: &Path) -> Vec<PathBuf> {
        let parent = |p: &Path| match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut dirs = vec![parent(path)];
        if let Ok(real) = std::fs::canonicalize(path) {
            let real_dir = parent(&real);
            if std::fs::canonicalize(&dirs[0]).ok().as_deref() != Some(real_dir.as_path()) {
                dirs.push(real_dir);
            }
        }
        dirs
    }

    /// Whether the directories are watched (else [`DirWatch::changed`] polls).
    pub fn is_watching(&self) -> bool {
        self.watcher.is_some()
    }

    /// Resolves when something may have changed: at the next event, or after `poll` when
    /// nothing could be watched.
    /// Either wait may be dropped and taken up again: a stored event stays stored, and a due
    /// poll stays due.
    pub async fn changed(&self, poll: Duration) {
        if self.watcher.is_some() {
            self.changed.notified().await;
            return;
        }
        let next_poll = || {
            self.next_poll
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let due = *next_poll().get_or_insert_with(|| tokio::time::Instant::now() + poll);
        tokio::time::sleep_until(due).await;
        *next_poll() = None;
    }
}

/// Whether an event may have changed what a file holds. Reads are not changes (the owner's own
/// reads would wake it again), nor are access-time updates.
fn matters(kind: &EventKind) -> bool {
    !matches!(
        kind,
        EventKind::Access(_) | EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime))
    )
}

/// Publish `files` as Kubernetes publishes a Secret or a CSI driver its volume: a fresh
/// timestamped directory, a `..data` symlink renamed over the old one, and each file a symlink
/// through `..data` (made once, removed with the file). For tests here and in the crates that
/// watch files (feature `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub fn publish_atomically(dir: &Path, generation: u32, files: &[(&str, &str)]) {
    let fresh = format!("..2026_11_28_20_00_{generation:02}.000000001");
    std::fs::create_dir(dir.join(&fresh)).expect("mkdir");
    for (name, contents) in files {
        std::fs::write(dir.join(&fresh).join(name), contents).expect("write");
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&fresh, &tmp).expect("link ..data_tmp");
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    for (name, _) in files {
        let link = dir.join(name);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).expect("link a file");
        }
    }
    // Files the new set no longer has lose their links, as kubelet removes them.
    for entry in std::fs::read_dir(dir).expect("list") {
        let name = entry.expect("entry").file_name();
        let name = name.to_string_lossy();
        if !name.starts_with('.') && !files.iter().any(|(n, _)| *n == name) {
            std::fs::remove_file(dir.join(&*name)).expect("remove a link");
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).expect("remove the old data");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With nothing watched (a directory that does not exist), a poll comes at its interval
    /// even when every wait for it is dropped by a shorter timer first, as the certificate
    /// and policy watchers drop it for their one-second checks.
    #[tokio::test(start_paused = true)]
    async fn a_poll_stays_due_when_its_wait_is_dropped() {
        let watch = DirWatch::new(&[PathBuf::from("/nonexistent/remora-watch-test")], "test");
        assert!(!watch.is_watching());
        let start = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = watch.changed(Duration::from_secs(5)) => break,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            assert!(
                start.elapsed() < Duration::from_secs(6),
                "the poll never came"
            );
        }
        assert!(
            start.elapsed() >= Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn a_rename_into_a_watched_directory_wakes_and_a_read_does_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.json"), "[]").expect("write");
        let watch = DirWatch::new(&[dir.path().to_path_buf()], "test");
        assert!(watch.is_watching());
        let never = Duration::from_secs(3600);
        // A read alone: no wake-up.
        let _ = std::fs::read(dir.path().join("a.json")).expect("read");
        let woke = tokio::time::timeout(Duration::from_millis(300), watch.changed(never)).await;
        assert!(woke.is_err(), "a read woke the watch");
        // A file written beside and renamed over the old one.
        std::fs::write(dir.path().join(".a.json.tmp"), "[1]").expect("write");
        std::fs::rename(dir.path().join(".a.json.tmp"), dir.path().join("a.json")).expect("mv");
        tokio::time::timeout(Duration::from_secs(5), watch.changed(never))
            .await
            .expect("the rename woke the watch");
    }

    #[tokio::test]
    async fn a_configmaps_data_symlink_swap_wakes_the_watch_on_its_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        publish_atomically(dir.path(), 1, &[("a.yaml", "one")]);
        let watch = DirWatch::new(&[dir.path().to_path_buf()], "test");
        assert!(watch.is_watching());
        let never = Duration::from_secs(3600);
        publish_atomically(dir.path(), 2, &[("a.yaml", "two")]);
        tokio::time::timeout(Duration::from_secs(5), watch.changed(never))
            .await
            .expect("the ..data swap woke the watch");
        let read = std::fs::read_to_string(dir.path().join("a.yaml")).expect("read");
        assert_eq!(read, "two");
    }

    #[test]
    fn a_symlinked_file_is_watched_where_it_points_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("..data");
        std::fs::create_dir(&data).expect("mkdir");
        std::fs::write(data.join("remora.yaml"), "").expect("write");
        let link = dir.path().join("remora.yaml");
        std::os::unix::fs::symlink(data.join("remora.yaml"), &link).expect("symlink");
        let dirs = DirWatch::dirs_of_file(&link);
        assert_eq!(dirs.len(), 2, "{dirs:?}");
        assert_eq!(dirs[0], dir.path());
        let plain = DirWatch::dirs_of_file(&data.join("remora.yaml"));
        assert_eq!(plain, vec![data]);
    }
}
