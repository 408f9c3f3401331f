//! HTTP to a mesh destination: the client sidecar's half of a mesh hop at L7.
//!
//! The application's requests are served here as any outbound HTTP is (statuses, retries,
//! `reporter="source"` request metrics), and sent upstream inside mesh TLS on a connection
//! that belongs to this client connection alone: without endpoint discovery, Kubernetes
//! balances per connection, so requests of different clients must not share one. At most one
//! such connection is kept idle, for the client's next request; an HTTP/2 one is shared by the
//! client's streams.

use super::errors::{ErrorKind, ProxyError};
use super::pool::{self, Sender};
use super::ConnContext;
use crate::connect::Upstream;
use crate::detect::HttpVersion;
use crate::loop_guard::Registration;
use crate::metadata_exchange::WorkloadMetadata;
use crate::tls::stream::ClientStream;
use crate::tls::{self, HandshakeFailure, Peer};
use rustls::pki_types::ServerName;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How a client connection's requests reach its mesh destination, and the connection they use.
#[derive(Debug)]
pub struct Originate {
    client: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
    /// The destination's hostname: the service the server is named as in metrics.
    service: Option<Arc<str>>,
    handshake_timeout: Duration,
    state: Mutex<State>,
}

/// A mesh connection as the HTTP/1.1 fast path drives it: mesh TLS on the socket, and the
/// socket's loop-guard registration (dropped with it).
pub type MeshConn = Box<(ClientStream, Registration)>;

#[derive(Debug, Default)]
struct State {
    /// The socket detection dialled, not yet wrapped in TLS.
    early: Option<Upstream>,
    /// The mesh connection, while no request uses it (or, HTTP/2, a handle on it).
    idle: Option<Sender>,
    /// The same for the fast path, which drives the connection itself.
    idle_raw: Option<MeshConn>,
    /// The server's sidecar on the newest mesh connection: the destination in metrics.
    server: Option<Arc<Peer>>,
    /// The last `x-envoy-peer-metadata` value the fast path read, to decode a new one only.
    described_as: Vec<u8>,
}

impl Originate {
    /// `client` offers Istio's ALPN values for the client's HTTP version; `early` is the socket
    /// detection opened, if it did.
    pub fn new(
        client: Arc<rustls::ClientConfig>,
        server_name: ServerName<'static>,
        service: Option<Arc<str>>,
        handshake_timeout: Duration,
        early: Option<Upstream>,
    ) -> Self {
        Originate {
            client,
            server_name,
            service,
            handshake_timeout,
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

    /// The idle mesh connection, if it is still open; an HTTP/2 one stays for other streams.
    pub fn checkout(&self) -> Option<Sender> {
        let mut state = self.state();
        let sender = state.idle.take()?;
        if pool::Pooled::is_closed(&sender) {
            return None;
        }
        if let Sender::Http2(shared) = &sender {
            state.idle = Some(Sender::Http2(shared.clone()));
        }
        Some(sender)
    }

    /// Keep `sender` for the client's next request, unless one is kept already or it closed.
    pub fn checkin(&self, sender: Sender) {
        if pool::Pooled::is_closed(&sender) {
            return;
        }
        let mut state = self.state();
        if state.idle.is_none() {
            state.idle = Some(sender);
        }
    }

    /// The fast path's idle mesh connection, if it has one.
    pub fn checkout_raw(&self) -> Option<MeshConn> {
        self.state().idle_raw.take()
    }

    /// Keep the fast path's mesh connection for the client's next request.
    pub fn checkin_raw(&self, conn: MeshConn) {
        let mut state = self.state();
        if state.idle_raw.is_none() {
            state.idle_raw = Some(conn);
        }
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

    /// A new HTTP client on a mesh connection: the fast path's idle one (a connection handed
    /// from the fast path to hyper's), or a new one. An HTTP/2 connection is kept for the
    /// client's other streams.
    pub async fn open(&self, ctx: &ConnContext) -> Result<Sender, ProxyError> {
        let dst = ctx.key.destination;
        let idle = self.state().idle_raw.take();
        let conn = match idle {
            Some(conn) => conn,
            None => self.connect(ctx).await?,
        };
        let (stream, registration) = *conn;
        let sender = pool::handshake_over(stream, registration, ctx.key.version)
            .await
            .map_err(|e| ProxyError::new(ErrorKind::ConnectFailed, dst, e))?;
        if let Sender::Http2(shared) = &sender {
            self.checkin(Sender::Http2(shared.clone()));
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
            name: self.server_name.clone(),
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

/// Istio's outbound ALPN values for mesh HTTP of `version`: the application's protocol, then
/// "istio".
pub fn alpn(version: HttpVersion) -> [&'static [u8]; 2] {
    match version {
        HttpVersion::Http1 => [tls::ALPN_HTTP11, tls::ALPN_ISTIO],
        HttpVersion::Http2 => [tls::ALPN_H2, tls::ALPN_ISTIO],
    }
}
