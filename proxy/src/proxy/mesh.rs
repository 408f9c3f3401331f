//! The two legs of a connection that meet mesh TLS, read top to bottom like the plaintext one.
//!
//! **Inbound** (with a workload identity): detection reads the client's first bytes as usual, a
//! whole ClientHello included. One that offers Istio's ALPN values is mesh traffic: it is
//! terminated with the workload certificate (the client's must chain to the mesh roots), and
//! the decrypted stream is served exactly as plaintext would be, HTTP or TCP, with the client's
//! sidecar known. Plaintext and the application's own TLS pass as before in PERMISSIVE mode; in
//! STRICT mode plaintext is refused and any TLS is terminated, so only a client with a mesh
//! certificate gets through, and nothing is dialled before the client has proven itself.
//!
//! **Outbound** to a declared mesh destination: detection tells what the application speaks,
//! which picks Istio's ALPN values; the upstream connection is wrapped in TLS with the workload
//! certificate, Istio's SNI, and a check of the server's SPIFFE ID. TCP and HTTP/2 get a mesh
//! connection per client connection (without endpoint discovery Kubernetes balances per
//! connection); HTTP/1.1 requests go on mesh connections pooled across clients, as Envoy's.
//!
//! **Metadata exchange**: for TCP the client offers `istio-peer-exchange` first, as Istio's
//! sidecars do, and the server selects it when offered; both sides then exchange Istio's
//! metadata header ([`crate::metadata_exchange`]) before the stream, and the peer's workload
//! joins its certificate in naming it in metrics. Istio's open of a mesh connection is counted
//! once that is done, in the peer's series.

use super::*;
use crate::metadata_exchange::{self, Exchanged};
use crate::tls::client_hello::{self, ClientHello, Parsed};
use crate::tls::stream::Rewind;
use crate::tls::{
    self, HandshakeFailure, Mesh, Peer, ALPN_H2, ALPN_HTTP10, ALPN_HTTP11, ALPN_PEER_EXCHANGE,
};
use remora_config::{Cidr, ListenerTlsMode, MeshDestination, MtlsMode};
use tokio::io::{AsyncRead, AsyncWrite};

/// How long a PERMISSIVE inbound still waits for a mesh peer's ClientHello once the
/// application it dialled has spoken first. A peer's sidecar writes its ClientHello as soon as
/// its connect completes, so this is scheduling slack, not a network round trip.
const MESH_HELLO_GRACE: Duration = Duration::from_millis(100);

mod outbound;

/// Which mesh leg a connection takes.
#[derive(Debug)]
pub(super) enum Leg {
    /// Inbound: terminate mesh TLS.
    Inbound(Inbound),
    /// Outbound to a declared mesh destination (boxed: the plaintext path's future holds
    /// room for this value).
    Outbound(Box<MeshDestination>),
}

/// How an inbound leg terminates.
#[derive(Debug)]
pub(super) struct Inbound {
    /// Refuse anything but mesh TLS.
    strict: bool,
    /// An explicit listener that terminates: any TLS client is mesh traffic (not only one
    /// offering Istio's ALPN values: nothing else is expected here), and its SPIFFE ID must be
    /// one of the listener's `identities`.
    listener: Option<Arc<ListenerConfig>>,
}

impl Inbound {
    /// The SPIFFE IDs a client must carry one of; empty accepts any from the roots.
    fn allowed_clients(&self) -> &[String] {
        self.listener
            .as_ref()
            .and_then(|l| l.tls.as_ref())
            .map_or(&[], |t| t.identities.as_slice())
    }
}

/// The mesh leg of a connection, if it has one. Capture listeners have one only with a
/// workload identity loaded; an explicit listener configured for mesh TLS always has one, so
/// that without an identity it fails closed (refuses) rather than passing plaintext.
///
/// With xDS, capture inbound does not come here: `virtualInbound`'s chains decide
/// (`inbound_xds`).
pub(super) fn leg(mesh: &Mesh, config: &Config, route: &Route, dst: SocketAddr) -> Option<Leg> {
    if let Route::Fixed(listener) = route {
        let tls = listener.tls.as_ref()?;
        return Some(match tls.mode {
            ListenerTlsMode::Terminate => Leg::Inbound(Inbound {
                strict: true,
                listener: Some(Arc::clone(listener)),
            }),
            ListenerTlsMode::Originate => Leg::Outbound(Box::new(MeshDestination {
                cidrs: vec![Cidr::from(dst.ip())],
                ports: vec![dst.port()],
                hostname: tls.hostname.clone(),
                identities: tls.identities.clone(),
            })),
        });
    }
    if !mesh.has_identity() {
        return None;
    }
    let inbound = |strict| {
        Leg::Inbound(Inbound {
            strict,
            listener: None,
        })
    };
    match route {
        Route::Capture(Direction::Inbound) => match config.mesh.mtls_mode {
            MtlsMode::Permissive => Some(inbound(false)),
            MtlsMode::Strict => Some(inbound(true)),
            MtlsMode::Disable => None,
        },
        Route::Capture(Direction::Outbound) => config
            .mesh
            .destination(dst.ip(), dst.port())
            .map(|d| Leg::Outbound(Box::new(d.clone()))),
        Route::Fixed(_) => None,
    }
}

/// A mesh connection's whole life, on the heap.
type MeshFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send + 'a>>;

impl Proxy {
    /// Serve a connection that meets mesh TLS. Each leg is boxed on its own, so a connection
    /// holds the state of its own leg only: one future for both would be sized by the larger
    /// (inbound HTTP serving), which every outbound TCP connection would then carry too.
    pub(super) fn mesh<'a>(
        self: &'a Arc<Self>,
        config: &'a Arc<Config>,
        downstream: TcpStream,
        hop: Hop,
        mode: Mode,
        leg: Leg,
    ) -> MeshFuture<'a> {
        match leg {
            Leg::Inbound(inbound) => Box::pin(async move {
                self.inbound_mesh(config, downstream, hop, mode, &inbound)
                    .await
            }),
            Leg::Outbound(dest) => Box::pin(async move {
                self.outbound_mesh(config, downstream, hop, mode, &dest)
                    .await
            }),
        }
    }

    async fn inbound_mesh(
        self: &Arc<Self>,
        config: &Arc<Config>,
        mut downstream: TcpStream,
        hop: Hop,
        mode: Mode,
        inbound: &Inbound,
    ) -> Outcome {
        let strict = inbound.strict;
        let watch_server = !strict && mode != Mode::Http;
        let wait = match strict {
            true => detect::Wait {
                client: config.tls.handshake_timeout,
                ..detect_wait(config, watch_server)
            },
            // A mesh peer's ClientHello follows its connect at once, but the application,
            // dialled meanwhile, may greet first: the greeting waits unread for a moment, so
            // that it crosses inside mesh TLS rather than in the clear to a peer expecting a
            // ServerHello. Plaintext clients of server-first protocols pay that moment.
            false => detect::Wait {
                after_server_spoke: MESH_HELLO_GRACE,
                ..detect_wait(config, watch_server)
            },
        };
        let detected = self
            .detect(&mut downstream, hop, watch_server, wait, None)
            .await
            .declared(mode);
        let (prefix, upstream) = match detected {
            Detected::Tls(prefix, upstream) => match client_hello::parse(&prefix) {
                // STRICT terminates any TLS, as Istio's strict filter chains match TLS whatever
                // its ALPN (a proxyless gRPC client with a mesh certificate offers none of
                // Istio's); the handshake then requires a mesh client certificate.
                Parsed::Complete(hello)
                    if inbound.listener.is_some()
                        || strict
                        || hello.offers_any(&tls::MESH_ALPNS) =>
                {
                    let clients = inbound.allowed_clients();
                    let (hop, hello) = (Terminating { hop, mode, clients }, &hello);
                    return self
                        .terminate(config, downstream, prefix, upstream, hop, hello)
                        .await;
                }
                _ if strict => {
                    return self.refuse(&downstream, hop, "TLS without a whole ClientHello")
                }
                // The application's own TLS: its bytes pass untouched.
                _ => (prefix, upstream),
            },
            Detected::ClientFailed => return refused(Some(hop.destination), End::DownstreamReset),
            _ if strict => return self.refuse(&downstream, hop, "plaintext"),
            Detected::Http(version, prefix, early) if mode != Mode::Tcp => {
                let http = (version, prefix, early);
                let downstream = Downstream::Plain(downstream);
                return self.http(config, downstream, hop, http, None, None).await;
            }
            Detected::Http(_, prefix, early) => (prefix, early),
            Detected::Tcp(prefix, upstream) => (prefix, upstream),
        };
        if let Some(denied) = self.tcp_denied(&hop, None, || authorize::tls_sni(&prefix)) {
            return denied;
        }
        // Not mesh traffic: no peer to learn.
        let istio = self.metrics.direction(hop.dir).istio_opened(None);
        let upstream = match upstream {
            Some(up) => up,
            None => self.dial(&hop).await,
        };
        self.tcp(&hop, &downstream, &prefix, upstream)
            .await
            .counted_in(istio)
    }

    /// STRICT: anything but mesh TLS is closed, as Envoy closes a connection no filter chain
    /// matches.
    fn refuse(&self, downstream: &TcpStream, hop: Hop, what: &'static str) -> Outcome {
        self.metrics.tls.handshake(hop.dir, "mtls_required");
        tracing::info!(peer = %hop.peer, destination = %hop.destination, what, "refused: mutual TLS is required (STRICT)");
        reset(downstream);
        refused(Some(hop.destination), End::MtlsRequired)
    }

    /// Terminate mesh TLS on a connection whose ClientHello is in `prefix`, then serve what it
    /// carries as plaintext would be served.
    async fn terminate(
        self: &Arc<Self>,
        config: &Arc<Config>,
        downstream: TcpStream,
        prefix: BytesMut,
        upstream: Option<Result<Upstream, ConnectError>>,
        t: Terminating<'_>,
        hello: &ClientHello,
    ) -> Outcome {
        let hop = t.hop;
        let server = match self.mesh.server_config(&config.tls) {
            Some(Ok(server)) => server,
            Some(Err(e)) => {
                tracing::error!(error = %e, "cannot terminate mesh TLS");
                reset(&downstream);
                return refused(Some(hop.destination), End::TlsHandshakeFailed);
            }
            None => {
                tracing::warn!(peer = %hop.peer, "refused: no workload certificate to terminate mesh TLS with");
                reset(&downstream);
                return refused(Some(hop.destination), End::TlsHandshakeFailed);
            }
        };
        let accepting =
            tokio_rustls::TlsAcceptor::from(server).accept(Rewind::new(prefix, downstream));
        let handshake = tokio::time::timeout(config.tls.handshake_timeout, accepting).await;
        let (failure, error) = match handshake {
            Ok(Ok(stream)) => {
                return self
                    .serve_terminated(config, Box::new(stream), upstream, t, hello)
                    .await
            }
            Ok(Err(e)) => (HandshakeFailure::of(&e), e.to_string()),
            Err(_) => (HandshakeFailure::Timeout, "timed out".to_string()),
        };
        self.metrics.tls.handshake(hop.dir, failure.as_str());
        tracing::warn!(
            peer = %hop.peer, destination = %hop.destination, reason = failure.as_str(),
            %error, sni = hello.server_name.as_deref().unwrap_or("-"),
            "inbound mesh TLS handshake failed"
        );
        refused(Some(hop.destination), End::TlsHandshakeFailed)
    }

    /// Name the client from its certificate and, on `istio-peer-exchange`, its metadata; then
    /// serve what it carries (a TCP stream is counted open in the client's Istio series).
    async fn serve_terminated(
        self: &Arc<Self>,
        config: &Arc<Config>,
        mut stream: Box<tls::stream::ServerStream>,
        upstream: Option<Result<Upstream, ConnectError>>,
        t: Terminating<'_>,
        hello: &ClientHello,
    ) -> Outcome {
        let Terminating { hop, mode, clients } = t;
        let (_, session) = stream.get_ref();
        let chain = session.peer_certificates().unwrap_or_default();
        let Some(mut peer) = Peer::from_chain(chain, session.alpn_protocol()) else {
            // The verifier requires a certificate that parses; this is unreachable.
            return refused(Some(hop.destination), End::TlsHandshakeFailed);
        };
        let allowed = |id: &crate::identity::SpiffeId| clients.iter().any(|c| c == id.as_str());
        if !clients.is_empty() && !peer.spiffe_id.as_ref().is_some_and(allowed) {
            // Checked once the handshake is done: the roots vouch for the certificate, the
            // listener's `identities` for who may use it.
            self.metrics
                .tls
                .handshake(hop.dir, HandshakeFailure::WrongSan.as_str());
            tracing::warn!(
                peer = %hop.peer, principal = %peer.principal(), expected = ?clients,
                "refused: the client's SPIFFE ID is not one the listener accepts"
            );
            reset(stream.get_ref().0.inner());
            return refused(Some(hop.destination), End::TlsHandshakeFailed);
        }
        self.metrics.tls.handshake(hop.dir, "ok");
        tracing::debug!(peer = %hop.peer, principal = %peer.principal(), "inbound mesh TLS established");
        let mut unread = BytesMut::new();
        if peer.alpn.as_deref() == Some(ALPN_PEER_EXCHANGE) {
            let Some(exchanged) = self.exchange(&mut *stream, config, &hop).await else {
                reset(stream.get_ref().0.inner());
                return refused(Some(hop.destination), End::DownstreamReset);
            };
            peer.metadata = exchanged.peer.map(Arc::new);
            unread = exchanged.unread;
        }
        let peer = Arc::new(peer);
        let decrypted = (stream, unread);
        self.serve_decrypted(config, decrypted, upstream, hop, mode, hello, peer)
            .await
    }

    /// Serve the decrypted stream of a mesh client, after `unread` (bytes read during the
    /// metadata exchange that belong to the stream), as plaintext would be served.
    #[allow(clippy::too_many_arguments)]
    async fn serve_decrypted(
        self: &Arc<Self>,
        config: &Arc<Config>,
        (mut stream, unread): (Box<tls::stream::ServerStream>, BytesMut),
        upstream: Option<Result<Upstream, ConnectError>>,
        hop: Hop,
        mode: Mode,
        hello: &ClientHello,
        peer: Arc<Peer>,
    ) -> Outcome {
        // The client's sidecar says HTTP in its ALPN; otherwise the port's declaration and
        // detection decide, as for plaintext.
        let mode = match hello.offers_any(&[ALPN_HTTP10, ALPN_HTTP11, ALPN_H2]) {
            true => Mode::Http,
            false => mode,
        };
        let (prefix, upstream) = match mode {
            Mode::Tcp => (unread, upstream),
            Mode::Http | Mode::Auto => {
                let watch_server = mode == Mode::Auto;
                let wait = detect_wait(config, watch_server);
                let mut replayed = Rewind::new(unread, &mut *stream);
                let detected = self
                    .detect(&mut replayed, hop, watch_server, wait, upstream)
                    .await;
                let (not_read, _) = replayed.into_parts();
                let detected = detected.after(not_read).declared(mode);
                match detected {
                    Detected::Http(version, prefix, early) => {
                        let http = (version, prefix, early);
                        let downstream = Downstream::Mesh(stream);
                        return self
                            .http(config, downstream, hop, http, Some(peer), None)
                            .await;
                    }
                    Detected::Tcp(prefix, up) | Detected::Tls(prefix, up) => (prefix, up),
                    Detected::ClientFailed => {
                        return refused(Some(hop.destination), End::DownstreamReset)
                            .counted_in(self.metrics.direction(hop.dir).istio_opened(Some(&peer)))
                    }
                }
            }
        };
        let istio = self.metrics.direction(hop.dir).istio_opened(Some(&peer));
        self.copy_decrypted(stream, &prefix, upstream, &hop, hello, &peer)
            .await
            .counted_in(istio)
    }

    /// Copy a mesh client's decrypted bytes, `prefix` first, to the application.
    async fn copy_decrypted(
        &self,
        mut stream: Box<tls::stream::ServerStream>,
        prefix: &[u8],
        upstream: Option<Result<Upstream, ConnectError>>,
        hop: &Hop,
        hello: &ClientHello,
        peer: &Arc<Peer>,
    ) -> Outcome {
        let hop = *hop;
        if let Some(denied) = self.tcp_denied(&hop, Some(peer), || hello.server_name.clone()) {
            return denied;
        }
        let upstream = match upstream {
            Some(up) => up,
            None => self.dial(&hop).await,
        };
        let mut upstream = match upstream {
            Ok(up) => up,
            Err(e) => return self.connect_failed(&hop, e, stream.get_ref().0.inner()),
        };
        let copied = tcp::copy_streams(prefix, &mut *stream, &mut upstream.stream, hop.idle).await;
        copy_outcome(&hop, copied, stream.get_ref().0.inner(), &upstream.stream)
    }

    /// Istio's metadata exchange on a connection whose ALPN selected it; `None` when it failed
    /// (logged and counted), and the connection must be closed.
    pub(super) async fn exchange<S>(
        &self,
        stream: &mut S,
        config: &Config,
        hop: &Hop,
    ) -> Option<Exchanged>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let ours = &self.mesh.exchange_header;
        let timeout = config.mesh.metadata_exchange_timeout;
        match metadata_exchange::exchange(stream, ours, timeout).await {
            Ok(exchanged) => {
                let result = exchanged.result();
                self.metrics.tls.exchange(hop.dir, result);
                tracing::debug!(
                    peer = %hop.peer, destination = %hop.destination, direction = hop.dir.as_str(),
                    result, metadata = ?exchanged.peer, "metadata exchanged"
                );
                Some(exchanged)
            }
            Err(e) => {
                self.metrics.tls.exchange(hop.dir, e.as_str());
                tracing::warn!(
                    peer = %hop.peer, destination = %hop.destination, direction = hop.dir.as_str(),
                    error = %e, "metadata exchange failed"
                );
                None
            }
        }
    }
}

/// A connection whose mesh TLS is being terminated.
#[derive(Clone, Copy)]
pub(super) struct Terminating<'a> {
    hop: Hop,
    mode: Mode,
    /// SPIFFE IDs the client must carry one of; empty accepts any from the roots.
    clients: &'a [String],
}
