//! One dial at a time to a shared (HTTP/2) destination, for every path that sends on the
//! pool: a request that finds no pooled connection with room while another request is
//! opening one waits for that one (what Envoy's pool counts as connecting capacity) rather
//! than dialling its own. A new connection carries one stream until its peer's SETTINGS are
//! read, so without this wait a cold burst of N streams would open N connections.
//!
//! The look ([`Pool::look_shared`]) and the hand-over of a new connection
//! ([`Pool::share_new`]) are the same for a request routed by xDS and one without xDS; only
//! the wait differs: a routed request waits as one of its cluster's pending requests (with
//! the cluster's limits and counters), one without xDS on the pool's own [`PoolWaiters`]
//! ([`Pool::shared`]).

use super::{Pool, PoolKey, Pooled, Sender};
use crate::http::stream_capacity::StreamWaiters;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// A shared connection to a destination being opened: while it lives, requests to that
/// destination that find no room on its open connections wait for this one, so that a burst
/// opens connections one after another, each taken up to its peer's limit, not one per
/// request. Dropped once the new connection's peer limit is known (or the dial failed),
/// waking them.
pub struct Dialing<K: PoolKey> {
    dialing: Weak<Mutex<foldhash::HashSet<K>>>,
    key: K,
    waiters: Option<Arc<dyn StreamWaiters>>,
}

impl<K: PoolKey> Drop for Dialing<K> {
    fn drop(&mut self) {
        if let Some(dialing) = self.dialing.upgrade() {
            let mut d = dialing.lock().unwrap_or_else(PoisonError::into_inner);
            d.remove(&self.key);
        }
        if let Some(w) = &self.waiters {
            w.released();
        }
    }
}

/// What a request to a shared destination goes out on.
pub enum Shared<C, K: PoolKey, S> {
    /// A pooled connection with room, holding a stream of it for the request.
    Pooled(C),
    /// A new connection, opened by the request: `S` is what the caller's limits gave it (a
    /// cluster's connection slot); the guard makes the requests that follow wait for it
    /// (`None`: a request that waited past its bound dials on its own).
    Dial(S, Option<Dialing<K>>),
}

/// The requests without a cluster waiting for a dial or a stream: woken when a dial ends or
/// a stream is given back. Counted, so that a stream given back with nobody waiting (nearly
/// always) costs one atomic load.
#[derive(Debug, Default)]
pub struct PoolWaiters {
    waiting: AtomicUsize,
    notify: tokio::sync::Notify,
}

impl StreamWaiters for PoolWaiters {
    fn released(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }
}

/// One waiting request, counted while it lives.
struct Waiting<'a>(&'a PoolWaiters);

impl<'a> Waiting<'a> {
    fn new(w: &'a PoolWaiters) -> Self {
        w.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting(w)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<C: Pooled, K: PoolKey + Send + Sync + 'static> Pool<C, K> {
    /// Whether a shared connection to `key` is being opened now.
    pub fn is_dialing(&self, key: &K) -> bool {
        let dialing = self.dialing.lock().unwrap_or_else(PoisonError::into_inner);
        dialing.contains(key)
    }

    /// Record that a shared connection to `key` is being opened, until the guard is dropped
    /// (waking `waiters`); `None` when one is already.
    pub fn start_dial(
        &self,
        key: K,
        waiters: Option<Arc<dyn StreamWaiters>>,
    ) -> Option<Dialing<K>> {
        let mut dialing = self.dialing.lock().unwrap_or_else(PoisonError::into_inner);
        dialing.insert(key.clone()).then(|| Dialing {
            dialing: Arc::downgrade(&self.dialing),
            key,
            waiters,
        })
    }

    /// One look for a connection to the shared destination `key`: a pooled one with room
    /// (unless `use_pool` is false: the request's pooled connection was just found closed),
    /// else, when none is being opened and `slot` gives one, the right to open one, whose
    /// end wakes `waiters`. `None`: the request waits (for the dial under way, a stream, or
    /// a slot) and looks again when woken.
    pub fn look_shared<S>(
        &self,
        key: &K,
        idle_timeout: Duration,
        use_pool: bool,
        slot: impl FnOnce() -> Option<S>,
        waiters: impl FnOnce() -> Arc<dyn StreamWaiters>,
    ) -> Option<Shared<C, K, S>> {
        if let Some(found) = use_pool
            .then(|| self.checkout(key, Instant::now(), idle_timeout))
            .flatten()
        {
            return Some(Shared::Pooled(found));
        }
        if self.is_dialing(key) {
            return None;
        }
        let slot = slot()?;
        let dialing = self.start_dial(key.clone(), Some(waiters()))?;
        Some(Shared::Dial(slot, Some(dialing)))
    }

    /// What a request without a cluster (a port declared `http2` in the config file) to the
    /// shared destination `key` goes out on: [`Pool::look_shared`], waiting on the pool's
    /// own waiters while a dial is under way, at most `bound` (then it dials on its own:
    /// the dial it waited for is stuck).
    pub async fn shared(
        &self,
        key: &K,
        idle_timeout: Duration,
        bound: Duration,
    ) -> Shared<C, K, ()> {
        match self.look_shared(
            key,
            idle_timeout,
            true,
            || Some(()),
            || self.stream_waiters(),
        ) {
            Some(found) => found,
            // Boxed: most requests find a pooled connection, and the wait's state would
            // otherwise size every request's.
            None => Box::pin(self.wait_shared(key, idle_timeout, bound)).await,
        }
    }

    async fn wait_shared(
        &self,
        key: &K,
        idle_timeout: Duration,
        bound: Duration,
    ) -> Shared<C, K, ()> {
        let deadline = tokio::time::Instant::now() + bound;
        let _waiting = Waiting::new(&self.waiters);
        loop {
            // Made before the look, so that a wake between the two is not missed.
            let woken = self.waiters.notify.notified();
            if let Some(found) = self.look_shared(
                key,
                idle_timeout,
                true,
                || Some(()),
                || self.stream_waiters(),
            ) {
                return found;
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                tracing::debug!(?key, "waited past the bound for a dial; opening another");
                return Shared::Dial((), None);
            }
        }
    }

    /// What wakes the requests waiting in [`Pool::shared`].
    pub fn stream_waiters(&self) -> Arc<dyn StreamWaiters> {
        Arc::clone(&self.waiters) as Arc<dyn StreamWaiters>
    }
}

impl<K: PoolKey + Send + Sync + 'static> Pool<Sender, K> {
    /// A connection a request opened: an HTTP/2 one goes in the pool, shared from now on by
    /// every request to `key` while it has room, and the request is given its first stream;
    /// `dialing` is released (waking the requests that waited for it) once the peer's limit
    /// is known, at most `settle` later. Any other connection is the request's own.
    pub fn share_new(
        self: &Arc<Self>,
        key: K,
        sender: Sender,
        idle_timeout: Duration,
        max_idle: usize,
        dialing: Option<Dialing<K>>,
        settle: Duration,
    ) -> Sender {
        let Some(first) = sender.first_stream() else {
            return sender;
        };
        let streams = sender.streams().map(Arc::clone);
        if let Some(streams) = &streams {
            // A routed connection was bound to its cluster's waiters already (kept then).
            streams.bind(None, None, Some(self.stream_waiters()));
        }
        self.checkin(key, sender, idle_timeout, max_idle);
        if let (Some(dialing), Some(streams)) = (dialing, streams) {
            tokio::spawn(async move {
                streams.settled(settle).await;
                drop(dialing);
            });
        }
        first
    }
}
