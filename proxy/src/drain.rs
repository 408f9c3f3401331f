//! Draining: what SIGTERM starts, as Envoy does under Istio's pilot-agent
//! (`/drain_listeners?inboundonly&graceful`, `--drain-strategy immediate`). Every inbound
//! connection, open or new, is told to go (HTTP/1.1 `connection: close`, HTTP/2 GOAWAY) while
//! the inbound listeners keep accepting, so a client that reconnects is served and told again;
//! outbound keeps serving the application (it may still need its peers while it shuts down).
//! Listeners close only when asked to (`/drain_listeners` without `graceful`, or once its
//! graceful period is over); the process ends after the drain period or, when asked, once no
//! connection is left.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the open connections are counted after the minimum drain duration: pilot-agent's
/// `activeConnectionCheckDelay`.
const ACTIVE_CONNECTION_CHECK: Duration = Duration::from_secs(1);

/// Drain state and the count of open connections.
#[derive(Debug)]
pub struct Drain {
    draining: watch::Sender<bool>,
    /// Set when the inbound listeners must close (the admin API's
    /// `/drain_listeners?inboundonly`, at once or after its graceful period).
    inbound_closed: watch::Sender<bool>,
    /// Set when every data-path listener must close, outbound included (the admin API's
    /// `/drain_listeners` without `inboundonly`).
    all_closed: watch::Sender<bool>,
    /// Draining was asked for ahead of SIGTERM (the agent's `/drain`: a native sidecar's
    /// preStop), so SIGTERM exits at once, as pilot-agent does once it has drained.
    drained_ahead: AtomicBool,
    active: AtomicUsize,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            draining: watch::Sender::new(false),
            inbound_closed: watch::Sender::new(false),
            all_closed: watch::Sender::new(false),
            drained_ahead: AtomicBool::new(false),
            active: AtomicUsize::new(0),
        }
    }
}

impl Drain {
    /// A new, not draining, state.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Begin draining: inbound connections are told to go from now on. The listeners keep
    /// accepting. Idempotent.
    pub fn start(&self) {
        self.draining.send_replace(true);
    }

    /// Begin draining ahead of SIGTERM, as pilot-agent's `/drain` does (Envoy's
    /// `drain_listeners?inboundonly&graceful&skip_exit`: the listeners stay open): the pod's
    /// containers are stopping, and SIGTERM will then end the process at once.
    pub fn start_ahead(&self) {
        self.drained_ahead.store(true, Ordering::Relaxed);
        self.start();
    }

    /// Whether draining was asked for ahead of SIGTERM ([`Drain::start_ahead`]).
    pub fn drained_ahead(&self) -> bool {
        self.drained_ahead.load(Ordering::Relaxed)
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

    /// Close the inbound listeners. Idempotent.
    pub fn close_inbound_listeners(&self) {
        self.inbound_closed.send_replace(true);
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

    /// Resolves once the inbound listeners must close: when asked for them, or for all.
    /// Draining alone does not close them.
    pub async fn inbound_listeners_closed(&self) {
        let mut rx = self.inbound_closed.subscribe();
        tokio::select! {
            _ = rx.wait_for(|d| *d) => {}
            () = self.all_listeners_closed() => {}
        }
    }

    /// Whether the inbound listeners must be closed now.
    pub fn inbound_listeners_are_closed(&self) -> bool {
        *self.inbound_closed.borrow() || *self.all_closed.borrow()
    }

    /// Whether every data-path listener must be closed now.
    pub fn all_listeners_are_closed(&self) -> bool {
        *self.all_closed.borrow()
    }

    /// Count a connection as open until the returned value is dropped.
    pub fn track(self: &Arc<Self>) -> Active {
        self.active.fetch_add(1, Ordering::Relaxed);
        Active {
            drain: Arc::clone(self),
        }
    }

    /// Connections open now: every data-path connection, inbound and outbound (what
    /// pilot-agent sums from Envoy's `listener.*.downstream_cx_active` for
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`).
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Resolves as pilot-agent decides, under `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`, that Envoy has
    /// no connection left: after `minimum`, the open connections ([`Drain::active`]) are counted
    /// every second, and the first count of zero ends the drain. The listeners keep accepting
    /// meanwhile, so clients that keep reconnecting keep the proxy up; counting at those instants
    /// only, rather than waking the moment the last connection closes, does not end the drain in
    /// the gap between a client's `connection: close` and its next connection.
    pub async fn no_connection_left(&self, minimum: Duration) {
        tokio::time::sleep(minimum).await;
        let first = tokio::time::Instant::now() + ACTIVE_CONNECTION_CHECK;
        let mut check = tokio::time::interval_at(first, ACTIVE_CONNECTION_CHECK);
        loop {
            check.tick().await;
            match self.active() {
                0 => return,
                active => tracing::info!(active, "draining: connections still open"),
            }
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
        self.drain.active.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn active_counts_tracked_connections_until_dropped() {
        let drain = Drain::new();
        let a = drain.track();
        let b = drain.track();
        assert_eq!(drain.active(), 2);
        drop(a);
        assert_eq!(drain.active(), 1);
        drop(b);
        assert_eq!(drain.active(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn no_connection_left_counts_each_second_after_the_minimum() {
        let drain = Drain::new();
        let open = drain.track();
        let waiter = tokio::spawn({
            let drain = Arc::clone(&drain);
            async move { drain.no_connection_left(Duration::from_secs(5)).await }
        });
        // Past the minimum and two counts, the connection still open.
        tokio::time::sleep(Duration::from_millis(7_500)).await;
        assert!(!waiter.is_finished(), "a connection is still open");
        drop(open);
        // Idle, but the next count is at 8 s.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!waiter.is_finished(), "counted only once a second");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(waiter.is_finished(), "the count at 8 s found none");
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

    #[tokio::test]
    async fn draining_leaves_the_inbound_listeners_open_until_they_are_closed() {
        let drain = Drain::new();
        let closed = tokio::spawn({
            let drain = Arc::clone(&drain);
            async move { drain.inbound_listeners_closed().await }
        });
        drain.start();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!closed.is_finished(), "draining alone closes no listener");
        drain.close_inbound_listeners();
        tokio::time::timeout(Duration::from_secs(5), closed)
            .await
            .expect("closing the inbound listeners should resolve")
            .unwrap();
        // Closing all closes inbound too.
        let drain = Drain::new();
        drain.close_all_listeners();
        tokio::time::timeout(Duration::from_secs(5), drain.inbound_listeners_closed())
            .await
            .expect("closing all closes inbound");
    }
}
