//! How many streams an upstream HTTP/2 connection may carry now, and how many it carries: what
//! the pool needs to give a request a connection with room for it, and to open another one
//! when every connection to the endpoint is at its peer's limit, as Envoy's HTTP/2 pool does
//! (a connection is "busy" at its peer's `SETTINGS_MAX_CONCURRENT_STREAMS`, and a request
//! that finds none "ready" makes a new one within the cluster's `max_connections`).
//!
//! The streams counted are the ones this proxy's requests hold: a request takes one when it
//! is given the connection and gives it back when its response is over ([`Held`] dropped).
//! That is never earlier than `h2` closes the stream, so the count never lets a request past
//! the peer's limit into `h2`'s own queue.

use super::pool::LocalAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use crate::upstream::StreamWaiters;

/// What the connection says of its peer's limit until the peer's SETTINGS arrive: the `h2`
/// client starts with it (hyper's `initial_max_send_streams`), and no peer can send it (a
/// SETTINGS value is 32 bits; one without the setting makes it `usize::MAX`). Until then a
/// connection carries one stream: Envoy assumes no limit and lets a burst pile onto a new
/// connection, which the peer then refuses or its codec queues past the limit.
pub const UNKNOWN_PEER_LIMIT: usize = usize::MAX - 1;

/// How often a new connection looks whether its peer's SETTINGS have arrived (hyper gives no
/// signal); about a round trip inside a cluster.
const SETTINGS_LOOK: Duration = Duration::from_millis(1);

/// The peer's `SETTINGS_MAX_CONCURRENT_STREAMS`, read from the connection when asked.
pub type PeerLimit = Box<dyn Fn() -> usize + Send + Sync>;

/// One upstream HTTP/2 connection's streams.
pub struct Streams {
    /// Streams held by this proxy's requests now.
    active: AtomicU32,
    /// The peer's limit now: read at each look, since a SETTINGS frame may lower (or raise)
    /// it at any time, and the connection's own task is not told when one arrives.
    peer_limit: PeerLimit,
    /// Streams the connection was given in all.
    served: AtomicU32,
    /// A cluster's `max_requests_per_connection` (`u32::MAX`: none).
    max_requests: AtomicU32,
    /// A cluster's own limit on streams at once (`http2_protocol_options.max_concurrent_streams`,
    /// `u32::MAX`: none), below the peer's when lower.
    max_streams: AtomicU32,
    /// Gives no more streams: it carried `max_requests`, or the peer said GOAWAY.
    retired: AtomicBool,
    /// The routed cluster's pending requests, woken when a stream is given back.
    waiters: OnceLock<Arc<dyn StreamWaiters>>,
    /// This side's address of the connection: kept here, once per connection, rather than
    /// in each of its handles (every request's state holds one).
    local: LocalAddr,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streams")
            .field("active", &self.active)
            .field("served", &self.served)
            .field("retired", &self.retired)
            .finish_non_exhaustive()
    }
}

impl Streams {
    /// A new connection's streams, its peer's limit read by `peer_limit`.
    pub fn new(peer_limit: PeerLimit) -> Self {
        Streams {
            active: AtomicU32::new(0),
            peer_limit,
            served: AtomicU32::new(0),
            max_requests: AtomicU32::new(u32::MAX),
            max_streams: AtomicU32::new(u32::MAX),
            retired: AtomicBool::new(false),
            waiters: OnceLock::new(),
            local: LocalAddr::default(),
        }
    }

    /// With this side's address of the connection.
    pub fn with_local(mut self, local: LocalAddr) -> Self {
        self.local = local;
        self
    }

    /// This side's address of the connection.
    pub fn local(&self) -> &LocalAddr {
        &self.local
    }

    /// Take one stream if the connection has room for it now (under the peer's limit and
    /// its `max_requests_per_connection`); the connection is retired by the last one.
    pub fn try_take(self: &Arc<Self>) -> Option<Held> {
        if self.retired.load(Ordering::Acquire) {
            return None;
        }
        let limit = match (self.peer_limit)() {
            // One stream: a connection opened ahead of its first request (while detection
            // read the client's bytes) serves that request, whatever its peer then says.
            UNKNOWN_PEER_LIMIT => 1,
            known => u32::try_from(known)
                .unwrap_or(u32::MAX)
                .min(self.max_streams.load(Ordering::Acquire)),
        };
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()?;
        Some(self.served_one())
    }

    /// Take one stream whatever the count: the first stream of a connection opened for it.
    pub fn take_first(self: &Arc<Self>) -> Held {
        self.active.fetch_add(1, Ordering::AcqRel);
        self.served_one()
    }

    fn served_one(self: &Arc<Self>) -> Held {
        let served = self.served.fetch_add(1, Ordering::AcqRel).saturating_add(1);
        if served >= self.max_requests.load(Ordering::Acquire)
            && !self.retired.swap(true, Ordering::AcqRel)
        {
            if let Some(w) = self.waiters.get() {
                w.retired_at_limit();
            }
        }
        Held(Arc::clone(self))
    }

    /// The connection carries at most `max` streams in all (a cluster's
    /// `max_requests_per_connection`) and `at_once` at a time (its
    /// `max_concurrent_streams`), and wakes `waiters` when it gives one back.
    pub fn bind(
        &self,
        max: Option<u32>,
        at_once: Option<u32>,
        waiters: Option<Arc<dyn StreamWaiters>>,
    ) {
        if let Some(max) = max {
            self.max_requests.store(max.max(1), Ordering::Release);
        }
        if let Some(n) = at_once {
            self.max_streams.store(n.max(1), Ordering::Release);
        }
        if let Some(w) = waiters {
            let _ = self.waiters.set(w);
        }
    }

    /// Whether the peer's SETTINGS have been read.
    pub fn peer_limit_known(&self) -> bool {
        (self.peer_limit)() != UNKNOWN_PEER_LIMIT
    }

    /// Wait until the peer's SETTINGS have been read, at most `bound` (a peer that sends
    /// none leaves the connection to the request that opened it).
    pub async fn settled(&self, bound: Duration) {
        let deadline = tokio::time::Instant::now() + bound;
        while !self.peer_limit_known() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(SETTINGS_LOOK).await;
        }
    }

    /// Give no more streams (the peer said GOAWAY, or the connection ended); the requests
    /// waiting for one of its streams look elsewhere.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        self.wake();
    }

    /// Whether the connection gives no more streams.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Streams held now.
    pub fn active(&self) -> u32 {
        self.active.load(Ordering::Acquire)
    }

    fn wake(&self) {
        if let Some(w) = self.waiters.get() {
            w.released();
        }
    }
}

/// One stream of an upstream HTTP/2 connection, held for a request; given back when dropped.
#[derive(Debug)]
pub struct Held(Arc<Streams>);

impl Held {
    /// The connection's streams.
    pub fn streams(&self) -> &Arc<Streams> {
        &self.0
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
        self.0.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Debug, Default)]
    struct Counted {
        released: AtomicUsize,
        retired: AtomicUsize,
    }

    impl StreamWaiters for Counted {
        fn released(&self) {
            self.released.fetch_add(1, Ordering::SeqCst);
        }
        fn retired_at_limit(&self) {
            self.retired.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A connection whose peer's limit the test sets, and what it wakes.
    fn connection(max: Option<u32>) -> (Arc<Streams>, Arc<AtomicUsize>, Arc<Counted>) {
        let limit = Arc::new(AtomicUsize::new(usize::MAX));
        let peer = Arc::clone(&limit);
        let streams = Arc::new(Streams::new(Box::new(move || peer.load(Ordering::SeqCst))));
        let waiters = Arc::new(Counted::default());
        streams.bind(
            max,
            None,
            Some(Arc::clone(&waiters) as Arc<dyn StreamWaiters>),
        );
        (streams, limit, waiters)
    }

    #[test]
    fn a_connection_at_its_peers_limit_gives_no_stream_until_one_ends() {
        let (streams, limit, waiters) = connection(None);
        limit.store(2, Ordering::SeqCst);
        let first = streams.try_take().expect("room for one");
        let second = streams.try_take().expect("room for two");
        assert!(streams.try_take().is_none(), "over the peer's limit of 2");
        assert_eq!(streams.active(), 2);
        drop(first);
        assert_eq!(waiters.released.load(Ordering::SeqCst), 1);
        let third = streams.try_take().expect("room again");
        // The peer lowers its limit: the streams held stay, no new one is given.
        limit.store(1, Ordering::SeqCst);
        drop(second);
        assert!(streams.try_take().is_none(), "at the lowered limit");
        drop(third);
        let fourth = streams.try_take().expect("under the lowered limit");
        // And raises it again.
        limit.store(3, Ordering::SeqCst);
        assert!(streams.try_take().is_some());
        drop(fourth);
        assert_eq!(streams.active(), 0);
    }

    #[test]
    fn max_requests_per_connection_retires_the_connection_at_its_last_stream() {
        let (streams, _, waiters) = connection(Some(2));
        let a = streams.take_first();
        let b = streams.try_take().expect("second of two");
        assert!(streams.is_retired());
        assert!(
            streams.try_take().is_none(),
            "retired after its second stream"
        );
        assert_eq!(waiters.retired.load(Ordering::SeqCst), 1);
        drop((a, b));
        assert!(streams.try_take().is_none(), "retired for good");
    }

    #[test]
    fn a_connection_is_not_shared_before_its_peers_settings() {
        let (streams, limit, _) = connection(None);
        limit.store(UNKNOWN_PEER_LIMIT, Ordering::SeqCst);
        let first = streams.try_take().expect("one stream before the SETTINGS");
        assert!(!streams.peer_limit_known());
        assert!(streams.try_take().is_none(), "no second");
        drop(first);
        let _first = streams.take_first();
        limit.store(usize::MAX, Ordering::SeqCst);
        assert!(streams.try_take().is_some(), "a peer with no limit");
    }

    #[test]
    fn the_clusters_own_limit_applies_below_the_peers() {
        let (streams, limit, _) = connection(None);
        streams.bind(None, Some(1), None);
        limit.store(100, Ordering::SeqCst);
        let _one = streams.try_take().expect("one");
        assert!(streams.try_take().is_none(), "the cluster's limit of 1");
    }

    #[test]
    fn a_retired_connection_gives_no_stream() {
        let (streams, _, _) = connection(None);
        assert!(streams.try_take().is_some());
        streams.retire();
        assert!(streams.try_take().is_none());
    }
}
