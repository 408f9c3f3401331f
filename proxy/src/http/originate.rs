//! HTTP to a mesh destination: the client sidecar's half of a mesh hop at L7.
//!
//! The application's requests are served here as any outbound HTTP is (statuses, retries,
//! `reporter="source"` request metrics), and sent upstream inside mesh TLS. A client
//! connection keeps the mesh connection its last request used, for its next one: no lock
//! shared with other clients, and the connection's TLS state stays warm on its thread. When
//! the client connection ends, its idle HTTP/1.1 mesh connection goes to a pool shared by
//! every client connection, from which a client's first request takes one, as Envoy pools a
//! cluster's connections: an application that opens a connection per request would otherwise
//! cost both sidecars a TLS handshake per request. An HTTP/2 one is never pooled: without
//! endpoint discovery Kubernetes balances per connection, and one HTTP/2 connection shared by
//! every client would send all of a service's traffic to one pod.

use super::errors::{ErrorKind, ProxyError};
use super::pool::{self, Key, Pool, PoolKey, Sender};
use super::ConnContext;
use crate::connect::Upstream;
use crate::detect::HttpVersion;
use crate::loop_guard::Registration;
use crate::metadata_exchange::WorkloadMetadata;
use crate::tls::stream::ClientStream;
use crate::tls::{self, HandshakeFailure, Peer};
use rustls::pki_types::ServerName;
use std::hash::{Hash, Hasher};
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How a client connection's requests reach its mesh destination, and the connection they use.
#[derive(Debug)]
pub struct Originate {
    client: Arc<rustls::ClientConfig>,
    server_name: Arc<ServerName<'static>>,
    /// The destination's hostname: the service the server is named as in metrics.
    service: Option<Arc<str>>,
    handshake_timeout: Duration,
    /// Idle mesh connections, shared by every client connection.
    pool: Arc<MeshPool>,
    state: Mutex<State>,
}

/// A mesh connection as the HTTP/1.1 fast path drives it: mesh TLS on the socket, and the
/// socket's loop-guard registration (dropped with it).
pub type MeshConn = Box<(ClientStream, Registration)>;

#[derive(Debug, Default)]
struct State {
    /// The socket detection dialled, not yet wrapped in TLS.
    early: Option<Upstream>,
    /// The client's idle mesh connection (HTTP/2: a handle on the one its streams share).
    idle: Option<Sender>,
    /// The same for the fast path, which drives the connection itself.
    idle_raw: Option<MeshConn>,
    /// The server's sidecar on the connection the client's request went on last: the
    /// destination in metrics.
    server: Option<Arc<Peer>>,
    /// The last `x-envoy-peer-metadata` value read on that connection, to decode a new one only.
    described_as: Vec<u8>,
    /// Where the idle connections go when the client connection ends, once one was kept.
    home: Option<Home>,
}

/// The pool's key and bounds for this client's connections.
#[derive(Debug)]
struct Home {
    key: MeshKey,
    idle_timeout: Duration,
    max_idle: usize,
}

impl State {
    /// `conn` is one more than the client can use: it goes to the shared pool with what is
    /// known of its server. Without a home (HTTP/2, whose one handle is enough) it is dropped.
    fn spare<C>(&mut self, pool: &Arc<Pool<Idle<C>, MeshKey>>, conn: C)
    where
        Idle<C>: pool::Pooled,
    {
        let Some(home) = &self.home else { return };
        let idle = Idle {
            conn,
            server: self.server.clone(),
            described_as: std::mem::take(&mut self.described_as),
        };
        pool.checkin(home.key.clone(), idle, home.idle_timeout, home.max_idle);
    }
}

/// Which mesh connections are interchangeable: the same destination and HTTP version, the same
/// client config (our certificate, the identities the server must prove, the ALPN offer) and
/// the same server name.
#[derive(Debug, Clone)]
pub struct MeshKey {
    conn: Key,
    client: Arc<rustls::ClientConfig>,
    name: Arc<ServerName<'static>>,
}

impl PartialEq for MeshKey {
    fn eq(&self, other: &Self) -> bool {
        // The config by identity: its cache builds one per identities and ALPN offer, and a new
        // one when our certificate changes, after which the old connections are left to expire.
        self.conn == other.conn
            && Arc::ptr_eq(&self.client, &other.client)
            && self.name == other.name
    }
}

impl Eq for MeshKey {}

impl Hash for MeshKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.conn.hash(state);
        Arc::as_ptr(&self.client).hash(state);
        self.name.hash(state);
    }
}

impl PoolKey for MeshKey {
    fn version(&self) -> HttpVersion {
        self.conn.version
    }
}

/// An idle mesh connection and what is known of the server's sidecar on it.
#[derive(Debug)]
pub struct Idle<C> {
    conn: C,
    server: Option<Arc<Peer>>,
    described_as: Vec<u8>,
}

/// An idle HTTP/1.1 client: closed when hyper says so.
impl pool::Pooled for Idle<Sender> {
    fn is_closed(&self) -> bool {
        pool::Pooled::is_closed(&self.conn)
    }

    fn share(&mut self) -> Option<Self> {
        None
    }
}

/// An idle mesh connection of the fast path is closed when rustls holds anything (plaintext no
/// request asked for, or the server's close_notify) or the socket turned readable while idle
/// (the server's FIN, an alert): a connection in either state would fail the next request.
impl pool::Pooled for Idle<MeshConn> {
    fn is_closed(&self) -> bool {
        closed_while_idle(&self.conn.0)
    }

    fn share(&mut self) -> Option<Self> {
        None
    }
}

/// Probing costs no system call while the socket has been quiet: the reactor has not seen it
/// readable, and the read is not tried.
pub(crate) fn closed_while_idle(conn: &ClientStream) -> bool {
    let (socket, session) = conn.get_ref();
    if !session.wants_read() {
        return true;
    }
    let mut probe = [0u8; 1];
    !matches!(socket.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// Every idle HTTP/1.1 mesh connection: those the fast path drives, and hyper's clients.
#[derive(Debug, Default)]
pub struct MeshPool {
    raw: Arc<Pool<Idle<MeshConn>, MeshKey>>,
    senders: Arc<Pool<Idle<Sender>, MeshKey>>,
}

impl Originate {
    /// `client` offers Istio's ALPN values for the client's HTTP version; `early` is the socket
    /// detection opened, if it did; `pool` holds the idle mesh connections of every client.
    pub fn new(
        client: Arc<rustls::ClientConfig>,
        server_name: ServerName<'static>,
        service: Option<Arc<str>>,
        handshake_timeout: Duration,
        early: Option<Upstream>,
        pool: Arc<MeshPool>,
    ) -> Self {
        Originate {
            client,
            server_name: Arc::new(server_name),
            service,
            handshake_timeout,
            pool,
            state: Mutex::new(State {
                early,
                ..State::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Held for one field's update, never across an await.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn key(&self, ctx: &ConnContext) -> MeshKey {
        MeshKey {
            conn: ctx.key,
            client: Arc::clone(&self.client),
            name: Arc::clone(&self.server_name),
        }
    }

    /// Where this client's idle connections go when it ends: noted with the first one it keeps.
    fn note_home(&self, state: &mut State, ctx: &ConnContext) {
        if state.home.is_none() && ctx.key.version == HttpVersion::Http1 {
            state.home = Some(Home {
                key: self.key(ctx),
                idle_timeout: ctx.config.http.pool_idle_timeout,
                max_idle: ctx.config.http.pool_max_idle_per_upstream,
            });
        }
    }

    /// The server's sidecar, as its certificate (and ALPN) named it on the newest connection.
    pub fn server(&self) -> Option<Arc<Peer>> {
        self.state().server.clone()
    }

    /// What the server's sidecar said of itself in a response's metadata headers: it names the
    /// server in the metrics from now on.
    fn learn_server(&self, metadata: WorkloadMetadata) {
        let mut state = self.state();
        let Some(server) = &state.server else { return };
        if server.metadata.as_deref() == Some(&metadata) {
            return;
        }
        let described = Peer {
            metadata: Some(Arc::new(metadata)),
            ..Peer::clone(server)
        };
        state.server = Some(Arc::new(described));
    }

    /// An idle connection another client left in `pool` for this destination, adopted.
    fn take_shared<C>(&self, pool: &Pool<Idle<C>, MeshKey>, ctx: &ConnContext) -> Option<C>
    where
        Idle<C>: pool::Pooled,
    {
        let timeout = ctx.config.http.pool_idle_timeout;
        let idle = pool.checkout(&self.key(ctx), Instant::now(), timeout)?;
        Some(self.adopt(idle))
    }

    /// A pooled connection's server becomes the client's, for the request about to use it.
    fn adopt<C>(&self, idle: Idle<C>) -> C {
        let mut state = self.state();
        state.server = idle.server;
        state.described_as = idle.described_as;
        idle.conn
    }

    /// An idle mesh connection for a request: the client's own (HTTP/2: shared by its
    /// streams), else, for HTTP/1.1, one from the shared pool.
    pub fn checkout(&self, ctx: &ConnContext) -> Option<Sender> {
        {
            let mut state = self.state();
            if let Some(sender) = state.idle.take() {
                if !pool::Pooled::is_closed(&sender) {
                    state.idle = sender_handle(&sender);
                    return Some(sender);
                }
            }
        }
        if ctx.key.version == HttpVersion::Http2 {
            return None;
        }
        self.take_shared(&self.pool.senders, ctx)
    }

    /// Keep `sender` for the client's next request (HTTP/2: its next streams), unless it
    /// closed; one more than the client can use goes to the shared pool.
    pub fn checkin(&self, ctx: &ConnContext, sender: Sender) {
        if pool::Pooled::is_closed(&sender) {
            return;
        }
        let mut state = self.state();
        self.note_home(&mut state, ctx);
        if state.idle.is_none() {
            state.idle = Some(sender);
            return;
        }
        state.spare(&self.pool.senders, sender);
    }

    /// An idle mesh connection for the fast path: the client's own, else one from the
    /// shared pool.
    pub fn checkout_raw(&self, ctx: &ConnContext) -> Option<MeshConn> {
        let own = self.state().idle_raw.take();
        if let Some(conn) = own {
            if !closed_while_idle(&conn.0) {
                return Some(conn);
            }
        }
        self.take_shared(&self.pool.raw, ctx)
    }

    /// Keep the fast path's mesh connection for the client's next request; one more than it
    /// can use goes to the shared pool.
    pub fn checkin_raw(&self, ctx: &ConnContext, conn: MeshConn) {
        let mut state = self.state();
        self.note_home(&mut state, ctx);
        if state.idle_raw.is_none() {
            state.idle_raw = Some(conn);
            return;
        }
        state.spare(&self.pool.raw, conn);
    }

    /// An `x-envoy-peer-metadata` value from a response the fast path read: decoded when it
    /// differs from the last one.
    pub fn learn_server_value(&self, value: &[u8]) {
        {
            let mut state = self.state();
            if state.described_as == value {
                return;
            }
            state.described_as = value.to_vec();
        }
        if let Some(metadata) = crate::metadata_exchange::http::decode_value(value) {
            self.learn_server(metadata);
        }
    }

    /// A new HTTP client on a mesh connection: an idle one of the fast path's (hyper takes over
    /// connections the fast path hands it), or a new one. An HTTP/2 connection is kept for the
    /// client's other streams.
    pub async fn open(&self, ctx: &ConnContext) -> Result<Sender, ProxyError> {
        let dst = ctx.key.destination;
        let conn = match self.checkout_raw(ctx) {
            Some(conn) => conn,
            None => self.connect(ctx).await?,
        };
        let (stream, registration) = *conn;
        let local = pool::LocalAddr::new(stream.get_ref().0.local_addr().ok());
        let sender = pool::handshake_over(stream, registration, ctx.key.version, local, None)
            .await
            .map_err(|e| ProxyError::new(ErrorKind::ConnectFailed, dst, e))?;
        if let Some(handle) = sender_handle(&sender) {
            self.checkin(ctx, handle);
        }
        Ok(sender)
    }

    /// A new mesh connection to the destination: the early socket or a new one, then mesh TLS
    /// (the server must present a mesh certificate, and the expected SPIFFE ID when one is
    /// configured). Its certificate names the server in metrics from now on.
    pub async fn connect(&self, ctx: &ConnContext) -> Result<MeshConn, ProxyError> {
        let dst = ctx.key.destination;
        let early = self.state().early.take();
        let upstream = match early {
            Some(up) => up,
            None => ctx.connect_upstream().await?,
        };
        let (stream, registration) = upstream.into_parts();
        let originating = tls::Originating {
            client: Arc::clone(&self.client),
            name: ServerName::clone(&self.server_name),
            timeout: self.handshake_timeout,
            destination: dst,
            direction: ctx.direction,
            metrics: &ctx.proxy.metrics.tls,
        };
        let stream = tls::originate(stream, originating)
            .await
            .map_err(|failure| {
                let kind = match failure {
                    HandshakeFailure::Timeout => ErrorKind::ConnectTimeout,
                    _ => ErrorKind::ConnectFailed,
                };
                ProxyError::new(kind, dst, failure.as_str())
            })?;
        let (_, session) = stream.get_ref();
        let chain = session.peer_certificates().unwrap_or_default();
        let server = Peer::from_chain(chain, session.alpn_protocol()).map(|server| {
            Arc::new(Peer {
                service: self.service.clone(),
                ..server
            })
        });
        {
            let mut state = self.state();
            state.server = server;
            state.described_as.clear();
        }
        Ok(Box::new((stream, registration)))
    }
}

/// The client connection is over: its idle HTTP/1.1 mesh connections go to the shared pool,
/// for other clients' requests.
impl Drop for Originate {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(conn) = state.idle_raw.take() {
            if !closed_while_idle(&conn.0) {
                state.spare(&self.pool.raw, conn);
            }
        }
        if let Some(sender) = state.idle.take() {
            state.spare(&self.pool.senders, sender);
        }
    }
}

/// Another handle on an HTTP/2 connection; `None` for HTTP/1.1, which carries one request at a
/// time.
fn sender_handle(sender: &Sender) -> Option<Sender> {
    sender.handle()
}

/// Istio's outbound ALPN values for mesh HTTP of `version`: the application's protocol, then
/// "istio".
pub fn alpn(version: HttpVersion) -> [&'static [u8]; 2] {
    match version {
        HttpVersion::Http1 => [tls::ALPN_HTTP11, tls::ALPN_ISTIO],
        HttpVersion::Http2 => [tls::ALPN_H2, tls::ALPN_ISTIO],
    }
}

#[cfg(test)]
mod tests;
