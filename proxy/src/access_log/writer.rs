//! The writer thread's side of the access log: standard output, and the files the loggers
//! name, each opened once (append, created if absent) and kept open, all opened again after a
//! reopen is asked for (SIGHUP, log rotation).

use crate::metrics::Metrics;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// At most this many files stay open; istiod's loggers name one path per Telemetry provider,
/// so more means a configuration that changed its paths over time: the map is emptied and
/// filled again as lines come, rather than growing without bound.
const OPEN_FILES: usize = 16;

/// One line for the writer, and where it goes.
pub(super) struct Line {
    /// `None`: standard output.
    pub file: Option<Arc<str>>,
    pub text: String,
}

/// The writer thread's state: the files open now, by path.
pub(super) struct Writer {
    open: HashMap<Arc<str>, OpenFile>,
    reopen: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
}

struct OpenFile {
    /// The reopen count it was opened under.
    generation: u64,
    /// `None`: the last open failed (retried at the next reopen).
    file: Option<std::fs::File>,
}

impl Writer {
    pub(super) fn new(reopen: Arc<AtomicU64>, metrics: Arc<Metrics>) -> Writer {
        Writer {
            open: HashMap::new(),
            reopen,
            metrics,
        }
    }

    pub(super) fn write(&mut self, line: Line) {
        let written = match &line.file {
            None => {
                let stdout = std::io::stdout();
                let mut out = stdout.lock();
                out.write_all(line.text.as_bytes())
                    .and_then(|_| out.flush())
                    .is_ok()
            }
            Some(path) => match self.file(path) {
                Some(f) => f.write_all(line.text.as_bytes()).is_ok(),
                None => false,
            },
        };
        if !written {
            // A full disk or a vanished stdout: the line is lost, counted as Envoy counts
            // its `filesystem.write_failed`.
            self.metrics.access_log_dropped.inc();
        }
    }

    /// The open file for `path`, opened (append, created if absent) when it is not yet or
    /// when a reopen was asked for since it was.
    fn file(&mut self, path: &Arc<str>) -> Option<&mut std::fs::File> {
        let generation = self.reopen.load(Ordering::Relaxed);
        let current = self
            .open
            .get(path)
            .is_some_and(|o| o.generation == generation);
        if !current {
            if !self.open.contains_key(path) && self.open.len() >= OPEN_FILES {
                self.open.clear();
            }
            let file = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&**path);
            let file = match file {
                Ok(f) => Some(f),
                Err(e) => {
                    tracing::warn!(path = %path, error = %e, "cannot open the access log file");
                    None
                }
            };
            self.open
                .insert(Arc::clone(path), OpenFile { generation, file });
        }
        self.open.get_mut(path).and_then(|o| o.file.as_mut())
    }

    /// How many files are open (tests).
    #[cfg(test)]
    pub(super) fn open_files(&self) -> usize {
        self.open.values().filter(|o| o.file.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two loggers to two files, lines alternating: each file is opened once, not per line
    /// (a reopen would show as a line in the renamed file landing in a new one).
    #[test]
    fn alternating_paths_keep_both_files_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a.log"), dir.path().join("b.log"));
        let path = |p: &std::path::Path| -> Arc<str> { p.to_str().expect("utf-8").into() };
        let reopen = Arc::new(AtomicU64::new(0));
        let mut w = Writer::new(Arc::clone(&reopen), Arc::new(Metrics::default()));
        let line = |p: &std::path::Path, text: &str| Line {
            file: Some(path(p)),
            text: text.into(),
        };
        w.write(line(&a, "a1\n"));
        w.write(line(&b, "b1\n"));
        // Renamed away: a file kept open goes on being written where it is now.
        let a_moved = dir.path().join("a.log.1");
        std::fs::rename(&a, &a_moved).expect("rename");
        w.write(line(&b, "b2\n"));
        w.write(line(&a, "a2\n"));
        assert_eq!(w.open_files(), 2);
        assert_eq!(std::fs::read_to_string(&a_moved).expect("a"), "a1\na2\n");
        assert_eq!(std::fs::read_to_string(&b).expect("b"), "b1\nb2\n");
        assert!(!a.exists());
        // A reopen opens every path again.
        reopen.fetch_add(1, Ordering::Relaxed);
        w.write(line(&a, "a3\n"));
        assert_eq!(std::fs::read_to_string(&a).expect("a"), "a3\n");
    }
}
