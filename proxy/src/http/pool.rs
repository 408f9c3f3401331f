//! Upstream HTTP connections, pooled per destination.
//!
//! One pool for the whole proxy, keyed by destination, source address (inbound connections come
//! from the passthrough source) and HTTP version, so a lookup is one hash. HTTP/1.1 connections
//! carry one request at a time: a request takes one out and the end of its response body puts
//! it back. An HTTP/2 connection is shared by every request to its destination while it has
//! room for another stream ([`super::stream_capacity`]: its peer's
//! `SETTINGS_MAX_CONCURRENT_STREAMS`); when every one is full, the request's path opens
//! another, which is shared too, as Envoy's HTTP/2 pool does.
//!
//! The same pool holds the raw sockets of Remora's own HTTP/1.1 exchange ([`super::h1`]),
//! in a pool of their own: [`Pooled`] is what the pool needs of either kind.
//!
//! Idle connections are bounded in number (`http.pool_max_idle_per_upstream`) and in time
//! (`http.pool_idle_timeout`), unlike Envoy's unbounded pool with its one-hour idle timeout:
//! servers close idle keep-alive connections on timers of their own, and a request sent on a
//! connection the server is closing fails.

use super::body::UpstreamBody;
use super::stream_capacity::{Held, Streams};
use crate::connect::Upstream;
use crate::detect::HttpVersion;
use crate::upstream::connection_end::{ConnectionEnd, Seen, Watched};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

mod dialing;
pub use dialing::{Dialing, PoolWaiters, Shared};
use std::time::{Duration, Instant};

// How often expired idle connections are looked for. Expiry is therefore late by up to this.
const REAP_INTERVAL: Duration = Duration::from_secs(1);

/// What a pool looks its connections up by: which connections are interchangeable.
pub trait PoolKey: Clone + Eq + std::hash::Hash + std::fmt::Debug {
    /// The HTTP version the connections speak: one request at a time, or shared.
    fn version(&self) -> HttpVersion;
}

/// Which connections are interchangeable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub destination: SocketAddr,
    pub source: Option<crate::connect::Source>,
    pub version: HttpVersion,
    /// xDS endpoints inside Istio mTLS: which SNI, ALPN and SAN check the connection was made
    /// with ([`crate::upstream::Upstreams::tls_id`]); 0: plaintext (a number, not an
    /// `Option`, so that the key stays as small as every request's state needs it).
    pub tls: u32,
}

impl PoolKey for Key {
    fn version(&self) -> HttpVersion {
        self.version
    }
}

/// The sending half of an upstream connection; the connection itself runs in its own task.
/// Each carries this side's address of the connection (`None` if the socket could not tell
/// it), which Envoy's `%UPSTREAM_LOCAL_ADDRESS%` prints for the requests it carries.
#[derive(Debug)]
pub enum Sender {
    /// With the number of requests the connection has carried (a cluster's
    /// `max_requests_per_connection` retires it at its limit).
    Http1(http1::SendRequest<UpstreamBody>, u32, LocalAddr),
    /// A handle on the connection that holds no stream (what the pool keeps).
    Http2(http2::SendRequest<UpstreamBody>, Arc<Streams>),
    /// A handle holding one of the connection's streams for a request.
    Http2Stream(http2::SendRequest<UpstreamBody>, Held),
}

/// This side's address of an upstream connection, shared by its handles: a pointer, not the
/// 32 bytes of an address, in every request's state that holds a sender or a response. An
/// xDS cluster's HTTP/1.1 connection also shares here what its IO sees of it.
#[derive(Debug, Clone, Default)]
pub struct LocalAddr(Option<Arc<Local>>);

#[derive(Debug)]
struct Local {
    addr: Option<SocketAddr>,
    seen: Option<Arc<Seen>>,
}

impl LocalAddr {
    pub fn new(addr: Option<SocketAddr>) -> Self {
        LocalAddr(addr.map(|addr| {
            Arc::new(Local {
                addr: Some(addr),
                seen: None,
            })
        }))
    }

    pub fn get(&self) -> Option<SocketAddr> {
        self.0.as_ref().and_then(|l| l.addr)
    }

    /// The same address, with what the connection's IO sees.
    fn watched(self, seen: Option<Arc<Seen>>) -> Self {
        match seen {
            None => self,
            Some(seen) => LocalAddr(Some(Arc::new(Local {
                addr: self.get(),
                seen: Some(seen),
            }))),
        }
    }
}

impl Sender {
    /// Another handle on this HTTP/2 connection holding one of its streams for a request,
    /// whatever the count (the first request of a connection opened for it).
    pub fn first_stream(&self) -> Option<Sender> {
        let (s, streams) = self.http2()?;
        Some(Sender::Http2Stream(s.clone(), streams.take_first()))
    }

    /// This side's address of the connection.
    pub fn local_addr(&self) -> LocalAddr {
        match self {
            Sender::Http1(_, _, local) => local.clone(),
            Sender::Http2(_, streams) => streams.local().clone(),
            Sender::Http2Stream(_, held) => held.streams().local().clone(),
        }
    }

    /// The request on this HTTP/1.1 connection is given up with its response not all read:
    /// the connection closes with it on, as Envoy counts it (`with_active_rq`).
    pub fn abandon(&self) {
        if let Sender::Http1(_, _, LocalAddr(Some(local))) = self {
            if let Some(seen) = &local.seen {
                seen.abandon();
            }
        }
    }

    /// The HTTP/2 connection's streams.
    pub fn streams(&self) -> Option<&Arc<Streams>> {
        self.http2().map(|(_, streams)| streams)
    }

    /// A handle on the same HTTP/2 connection that holds no stream.
    pub fn handle(&self) -> Option<Sender> {
        let (s, streams) = self.http2()?;
        Some(Sender::Http2(s.clone(), Arc::clone(streams)))
    }

    fn http2(&self) -> Option<(&http2::SendRequest<UpstreamBody>, &Arc<Streams>)> {
        match self {
            Sender::Http2(s, streams) => Some((s, streams)),
            Sender::Http2Stream(s, held) => Some((s, held.streams())),
            Sender::Http1(..) => None,
        }
    }
}

/// What the pool needs of a connection it keeps.
pub trait Pooled: Sized + Send + 'static {
    /// Whether the connection is known to be closed (by the server, or an error).
    fn is_closed(&self) -> bool;
    /// Another handle on a connection that serves several requests at once (HTTP/2), holding
    /// a stream of it, when it can take one more now; `None` for connections that carry one
    /// request at a time.
    fn share(&mut self) -> Option<Self>;
    /// Whether `other` is a handle on the same connection (HTTP/2).
    fn same_connection(&self, _other: &Self) -> bool {
        false
    }
    /// Whether requests hold streams of it now (a shared connection is not idle then).
    fn in_use(&self) -> bool {
        false
    }
    /// Whether it takes no more requests (retired: GOAWAY, or its request limit).
    fn is_retired(&self) -> bool {
        false
    }
    /// What the pool keeps of it: a handle holding no stream (HTTP/2).
    fn into_idle(self) -> Self {
        self
    }
    /// The pool lets it go, found closed (`by_peer`) or not (its idle time is up, or the pool
    /// is full): how its end is counted, for a connection that counts it itself.
    fn let_go(&mut self, _by_peer: bool) {}
}

impl Pooled for Sender {
    fn is_closed(&self) -> bool {
        match self.http2() {
            Some((s, _)) => s.is_closed(),
            None => matches!(self, Sender::Http1(s, ..) if s.is_closed()),
        }
    }

    fn share(&mut self) -> Option<Self> {
        let (s, streams) = self.http2()?;
        if !s.is_ready() {
            return None;
        }
        let held = streams.try_take()?;
        Some(Sender::Http2Stream(s.clone(), held))
    }

    fn same_connection(&self, other: &Self) -> bool {
        match (self.streams(), other.streams()) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    fn in_use(&self) -> bool {
        self.streams().is_some_and(|s| s.active() > 0)
    }

    fn is_retired(&self) -> bool {
        self.streams().is_some_and(|s| s.is_retired())
    }

    fn into_idle(self) -> Self {
        match self {
            Sender::Http2Stream(s, held) => Sender::Http2(s, Arc::clone(held.streams())),
            other => other,
        }
    }
}

#[derive(Debug)]
struct Idle<C> {
    sender: C,
    expires: Instant,
}

/// Every idle upstream HTTP connection.
#[derive(Debug)]
pub struct Pool<C = Sender, K = Key> {
    // A plain mutex, held for one map operation and never across an await.
    // foldhash: every request looks its key up twice, and SipHash was a visible share of it.
    idle: Mutex<foldhash::HashMap<K, Vec<Idle<C>>>>,
    reaper_started: AtomicBool,
    /// Destinations a shared (HTTP/2) connection is being opened to now: the requests that
    /// find no room wait for it rather than each opening one ([`Dialing`]).
    dialing: Arc<Mutex<foldhash::HashSet<K>>>,
    /// What wakes the requests without a cluster ([`Pool::shared`]) waiting for a dial or a
    /// stream.
    waiters: Arc<PoolWaiters>,
}

impl<C, K> Default for Pool<C, K> {
    fn default() -> Self {
        Pool {
            idle: Mutex::default(),
            reaper_started: AtomicBool::new(false),
            dialing: Arc::default(),
            waiters: Arc::default(),
        }
    }
}

impl<C: Pooled, K: PoolKey + Send + Sync + 'static> Pool<C, K> {
    /// A connection to `key`'s destination, if one is idle (HTTP/1.1) or shared with room
    /// for another stream (HTTP/2: the first that has, holding one for the caller). A shared
    /// HTTP/2 connection's idle clock restarts with each request it is given.
    pub fn checkout(&self, key: &K, now: Instant, idle_timeout: Duration) -> Option<C> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let list = idle.get_mut(key)?;
        let found = match key.version() {
            HttpVersion::Http1 => loop {
                // Most recently used first: the least likely to have been closed by the server.
                let Some(mut entry) = list.pop() else {
                    break None;
                };
                let closed = entry.sender.is_closed();
                if !closed && entry.expires > now {
                    break Some(entry.sender);
                }
                entry.sender.let_go(closed);
            },
            HttpVersion::Http2 => {
                list.retain(|e| !e.sender.is_closed() && !e.sender.is_retired());
                list.iter_mut().find_map(|e| {
                    let shared = e.sender.share()?;
                    e.expires = now + idle_timeout;
                    Some(shared)
                })
            }
        };
        // An emptied list stays (the reaper takes it within a second): the next checkin to the
        // destination, moments away under load, then pushes without allocating a list again.
        found
    }

    /// Keep `sender` for the next request to `key`, for at most `idle_timeout`, unless
    /// `max_idle` connections to it are idle already.
    pub fn checkin(
        self: &Arc<Self>,
        key: K,
        mut sender: C,
        idle_timeout: Duration,
        max_idle: usize,
    ) {
        let closed = sender.is_closed();
        if closed || max_idle == 0 {
            tracing::debug!(?key, closed, "not pooled");
            sender.let_go(closed);
            return;
        }
        let expires = Instant::now() + idle_timeout;
        let refused = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            let version = key.version();
            let list = idle.entry(key).or_default();
            let full = match version {
                HttpVersion::Http1 => list.len() >= max_idle,
                // A connection shared already (a request giving its stream back), one that
                // takes no more requests, or more than `max_idle` to one destination: not
                // kept (the last stays private to its requests and closes after them).
                HttpVersion::Http2 => {
                    sender.is_retired()
                        || list.iter().any(|e| e.sender.same_connection(&sender))
                        || list.iter().filter(|e| !e.sender.is_closed()).count() >= max_idle
                }
            };
            if full {
                Some(sender)
            } else {
                list.push(Idle {
                    sender: sender.into_idle(),
                    expires,
                });
                None
            }
        };
        // Dropped outside the lock: dropping the last sender closes the connection.
        drop(refused);
        self.start_reaper();
    }

    /// Stop sharing the HTTP/2 connection to `key`: it said GOAWAY, and the streams on their way
    /// keep it open until they finish. The next request opens a new one.
    pub fn forget_shared(&self, key: &K) {
        if key.version() != HttpVersion::Http2 {
            return;
        }
        let gone = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            idle.remove(key)
        };
        drop(gone);
    }

    fn start_reaper(self: &Arc<Self>) {
        if self.reaper_started.swap(true, Ordering::Relaxed) {
            return;
        }
        // A connection put back while no runtime runs (dropped with its client's state on
        // the way out) is reaped by the next reaper.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.reaper_started.store(false, Ordering::Relaxed);
            return;
        };
        let pool = Arc::downgrade(self);
        runtime.spawn(reap(pool));
    }

    /// Drop every expired or closed idle connection.
    fn reap_now(&self, now: Instant) {
        let expired: Vec<Idle<C>> = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            let mut expired = Vec::new();
            idle.retain(|_, list| {
                let mut i = 0;
                while i < list.len() {
                    let e = &mut list[i];
                    // A shared connection carrying streams is not idle, whatever its clock.
                    if e.expires <= now && e.sender.in_use() && !e.sender.is_retired() {
                        e.expires = now + REAP_INTERVAL;
                    }
                    let closed = e.sender.is_closed();
                    if e.expires <= now || closed || e.sender.is_retired() {
                        e.sender.let_go(closed);
                        expired.push(list.swap_remove(i));
                    } else {
                        i += 1;
                    }
                }
                !list.is_empty()
            });
            expired
        };
        drop(expired);
    }

    /// Idle connections held now (for tests and the admin API).
    pub fn idle_count(&self) -> usize {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.values().map(Vec::len).sum()
    }
}

impl<C: Pooled> Pool<C> {
    /// Whether an HTTP connection to `destination` (from `source`) is pooled now: the
    /// destination is known to speak HTTP, so it cannot be a server-first protocol.
    pub fn speaks_http(
        &self,
        destination: SocketAddr,
        source: Option<crate::connect::Source>,
    ) -> bool {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        [HttpVersion::Http1, HttpVersion::Http2]
            .into_iter()
            .any(|version| {
                idle.get(&Key {
                    destination,
                    source,
                    version,
                    tls: 0,
                })
                .is_some_and(|list| !list.is_empty())
            })
    }
}

/// Ends when the pool is dropped.
async fn reap<C: Pooled, K: PoolKey + Send + Sync + 'static>(pool: Weak<Pool<C, K>>) {
    let mut tick = tokio::time::interval(REAP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        pool.reap_now(Instant::now());
    }
}

/// The most an upstream HTTP/1.1 connection reads ahead (hyper's `max_buf_size`): with a
/// client that does not read, a response waits here at most this much at a time (Envoy's
/// `per_connection_buffer_limit_bytes` idea), where hyper's default let it read 400 KiB
/// chunks. It also bounds a response head, and the fast path's
/// [`super::h1::head::MAX_RESPONSE_HEAD`] follows it (Envoy's default is 60 KiB).
pub const UPSTREAM_H1_BUFFER: usize = 64 * 1024;

/// The receive window of each stream on an upstream HTTP/2 connection: what the upstream may
/// send of a response that nobody takes (its client reads nothing, or its client connection
/// has its [`super::send_budget`] queued), so what a stalled stream holds here. Envoy's edge
/// value (`initial_stream_window_size`, and Istio's EDGE connection profile); hyper's default
/// of 2 MiB let a client that reads nothing hold that per stream. Window updates go out as
/// the response is taken, so a reading client's stream keeps 64 KiB in flight.
pub const UPSTREAM_H2_STREAM_WINDOW: u32 = 64 * 1024;

/// The receive window of a whole upstream HTTP/2 connection: the largest there is, so that it
/// never closes and only the stream windows bound what waits. The connection is shared by
/// every client with a request to that destination, and h2 gives connection window back only
/// as streams take their data, so a smaller one would let clients that read nothing close it
/// on everyone else (hyper's default, 5 MiB, was closed by three stalled streams of 2 MiB).
/// What the connection holds is then at most a stream window per stream it carries (Envoy's
/// default windows are 256 MiB each, stream and connection).
pub const UPSTREAM_H2_CONNECTION_WINDOW: u32 = (1 << 31) - 1;

/// Request bytes queued per stream for an upstream HTTP/2 connection that does not take them
/// (hyper's `max_send_buf_size`, 1 MiB by default): the same as the client side's
/// ([`super::h2_server::MAX_SEND_BUF`]).
pub const UPSTREAM_H2_SEND_BUF: usize = 64 * 1024;

/// Start the HTTP client on a new upstream connection; the connection runs in a task of its own.
pub async fn handshake(upstream: Upstream, version: HttpVersion) -> Result<Sender, hyper::Error> {
    let (stream, registration) = upstream.into_parts();
    let local = LocalAddr::new(stream.local_addr().ok());
    handshake_over(stream, registration, version, local, None).await
}

/// Start the HTTP client on `io` (a socket, or mesh TLS on one); `keep` lives as long as the
/// connection (the loop guard's registration of its socket); `local` is this side's address
/// of the socket under it; `end`, for a connection of an xDS cluster, counts how it ends, as
/// its IO sees it.
pub async fn handshake_over<T>(
    io: T,
    keep: impl Send + 'static,
    version: HttpVersion,
    local: LocalAddr,
    end: Option<ConnectionEnd>,
) -> Result<Sender, hyper::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let seen = end.as_ref().map(|_| Arc::new(Seen::default()));
    let io = Watched::new(io, seen.clone());
    let seen_by_sender = seen.clone();
    // Counted once the connection is over, from what its IO saw (`active`: HTTP/2's streams).
    let finish = move |active: Option<bool>| {
        if let (Some(mut end), Some(seen)) = (end, seen) {
            seen.finish(&mut end, active);
        }
    };
    match version {
        HttpVersion::Http1 => {
            let (sender, conn) = http1::Builder::new()
                .max_buf_size(UPSTREAM_H1_BUFFER)
                .handshake(TokioIo::new(io))
                .await?;
            tokio::spawn(async move {
                let _keep = keep;
                // Upgrades (WebSocket) hand the socket to the tunnel, which keeps it open.
                if let Err(e) = conn.with_upgrades().await {
                    tracing::debug!(error = %e, "upstream HTTP/1.1 connection ended");
                }
                finish(None);
            });
            Ok(Sender::Http1(sender, 0, local.watched(seen_by_sender)))
        }
        HttpVersion::Http2 => {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .initial_stream_window_size(UPSTREAM_H2_STREAM_WINDOW)
                .initial_connection_window_size(UPSTREAM_H2_CONNECTION_WINDOW)
                .max_send_buf_size(UPSTREAM_H2_SEND_BUF)
                .initial_max_send_streams(super::stream_capacity::UNKNOWN_PEER_LIMIT)
                .handshake(TokioIo::new(super::coalesce::Coalesced::new(io)))
                .await?;
            // hyper keeps the peer's SETTINGS to itself but for an accessor on the
            // connection, whose task polls it: shared with the pool's look, which reads the
            // peer's limit there (0 once the connection is over).
            let conn = Arc::new(Mutex::new(Box::pin(conn)));
            let reader = Arc::downgrade(&conn);
            let streams = Arc::new(
                Streams::new(Box::new(move || {
                    reader.upgrade().map_or(0, |conn| {
                        let conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
                        conn.as_ref().get_ref().current_max_send_streams()
                    })
                }))
                .with_local(local),
            );
            let handle = Arc::clone(&streams);
            tokio::spawn(async move {
                let _keep = keep;
                let ended = std::future::poll_fn(|cx| {
                    let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
                    conn.as_mut().poll(cx)
                })
                .await;
                // A connection that ended takes no more requests, even before hyper says so.
                streams.retire();
                // The requests on it when it ended still hold their streams: they learn of
                // the end from their own tasks.
                finish(Some(streams.active() > 0));
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
                }
            });
            Ok(Sender::Http2(sender, handle))
        }
    }
}

#[cfg(test)]
mod tests;
