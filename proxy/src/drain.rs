//! Draining: what SIGTERM starts. The inbound listener stops accepting, outbound keeps serving
//! the application (it may still need to reach its peers while it shuts down), and open
//! connections carry on until the drain period ends or, when asked, until none is left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{watch, Notify};

/// Drain state and the count of open connections.
#[derive(Debug)]
pub struct Drain {
    draining: watch::Sender<bool>,
    /// Set when every data-path listener must close, outbound included (the admin API's
    /// `/drain_listeners` without `inboundonly`).
    all_closed: watch::Sender<bool>,
    active: AtomicUsize,
    changed: Notify,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            draining: watch::Sender::new(false),
            all_closed: watch::Sender::new(false),
            active: AtomicUsize::new(0),
            changed: Notify::new(),
        }
    }
}

impl Drain {
    /// A new, not draining, state.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Begin draining. Idempotent.
    pub fn start(&self) {
        self.draining.send_replace(true);
    }

    /// Whether draining has begun.
    pub fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Resolves once draining has begun.
    pub async fn started(&self) {
        let mut rx = self.draining.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Close every data-path listener, outbound included. Idempotent.
    pub fn close_all_listeners(&self) {
        self.all_closed.send_replace(true);
    }

    /// Resolves once every listener must close.
    pub async fn all_listeners_closed(&self) {
        let mut rx = self.all_closed.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Resolves once the inbound listener must close: on draining, or when all close.
    pub async fn inbound_closed(&self) {
        tokio::select! {
            () = self.started() => {}
            () = self.all_listeners_closed() => {}
        }
    }

    /// Count a connection as open until the returned value is dropped.
    pub fn track(self: &Arc<Self>) -> Active {
        self.active.fetch_add(1, Ordering::Relaxed);
        Active {
            drain: Arc::clone(self),
        }
    }

    /// Connections open now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Resolves when no connection is open.
    pub async fn idle(&self) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Register interest before checking, so a close between the check and the await
            // is not missed.
            notified.as_mut().enable();
            if self.active() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// An open connection, counted by [`Drain`].
#[derive(Debug)]
pub struct Active {
    drain: Arc<Drain>,
}

impl Drop for Active {
    fn drop(&mut self) {
        if self.drain.active.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.drain.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn idle_resolves_when_the_last_connection_closes() {
        let drain = Drain::new();
        let a = drain.track();
        let b = drain.track();
        assert_eq!(drain.active(), 2);
        let waiter = tokio::spawn({
            let drain = Arc::clone(&drain);
            async move { drain.idle().await }
        });
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "one connection is still open");
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("idle should resolve")
            .unwrap();
    }

    #[tokio::test]
    async fn started_resolves_after_start() {
        let drain = Drain::new();
        assert!(!drain.is_draining());
        let waiter = tokio::spawn({
            let drain = Arc::clone(&drain);
            async move { drain.started().await }
        });
        drain.start();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("started should resolve")
            .unwrap();
        assert!(drain.is_draining());
    }
}
