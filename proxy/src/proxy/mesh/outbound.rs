//! The outbound mesh leg: to a declared mesh destination, the client's bytes (or requests)
//! go inside mutual TLS with Istio's ALPN values and SNI, and the server is named from its
//! certificate and, on `istio-peer-exchange`, its metadata.

use super::*;
use rustls::pki_types::ServerName;

impl Proxy {
    pub(super) async fn outbound_mesh(
        self: &Arc<Self>,
        config: &Arc<Config>,
        mut downstream: TcpStream,
        hop: Hop,
        mode: Mode,
        dest: &MeshDestination,
    ) -> Outcome {
        let (version, prefix, upstream) = match mode {
            Mode::Tcp => (None, BytesMut::new(), None),
            Mode::Http | Mode::Auto => {
                // Nothing is dialled while detecting: an early connection here would be
                // plaintext, and the server's sidecar would hand it the application's first
                // bytes in the clear before mesh TLS could start on it. A client that stays
                // silent (a server-first protocol) is TCP once the detection timeout ends.
                let wait = detect_wait(config, mode == Mode::Auto);
                let detected = self
                    .detect(&mut downstream, hop, false, wait, None)
                    .await
                    .declared(mode);
                match detected {
                    Detected::Http(version, prefix, early) => (Some(version), prefix, early),
                    Detected::Tcp(prefix, up) | Detected::Tls(prefix, up) => (None, prefix, up),
                    Detected::ClientFailed => {
                        return refused(Some(hop.destination), End::DownstreamReset)
                    }
                }
            }
        };
        // Istio's outbound ALPN: what the application speaks, then "istio" for mesh traffic;
        // for TCP, metadata exchange first, which a server that does not speak it ignores.
        let http_alpn = version.map(http::originate::alpn);
        let alpn: &[&[u8]] = match &http_alpn {
            Some(alpn) => alpn,
            None => &[ALPN_PEER_EXCHANGE, tls::ALPN_ISTIO],
        };
        let client = match self.mesh.client_config(&config.tls, &dest.identities, alpn) {
            Some(Ok(client)) => client,
            Some(Err(e)) => {
                tracing::error!(error = %e, "cannot originate mesh TLS");
                reset(&downstream);
                return refused(Some(hop.destination), End::ConnectFailed);
            }
            None => {
                tracing::warn!(destination = %hop.destination, "refused: no workload certificate to originate mesh TLS with");
                reset(&downstream);
                return refused(Some(hop.destination), End::ConnectFailed);
            }
        };
        if let Some(version) = version {
            // HTTP is served here, as outbound HTTP is, and each request goes inside mesh TLS
            // on a pooled mesh connection (HTTP/2: this client connection's own).
            let early = match upstream {
                Some(Ok(up)) => Some(up),
                Some(Err(e)) => return self.connect_failed(&hop, e, &downstream),
                None => None,
            };
            let originate = http::originate::Originate::new(
                client,
                server_name(dest, hop.destination),
                dest.hostname.as_deref().map(Arc::from),
                config.tls.handshake_timeout,
                early,
                Arc::clone(&self.mesh_pool),
            );
            let http = (version, prefix, None);
            let downstream = Downstream::Plain(downstream);
            let originate = Some(Box::new(originate));
            let served = Box::pin(self.http(config, downstream, hop, http, None, originate));
            return served.await;
        }
        let upstream = match upstream {
            Some(up) => up,
            None => self.dial(&hop).await,
        };
        let upstream = match upstream {
            Ok(up) => up,
            Err(e) => return self.connect_failed(&hop, e, &downstream),
        };
        // The registration lives as long as the connection does.
        let (stream, _registration) = upstream.into_parts();
        let originating = tls::Originating {
            client,
            name: server_name(dest, hop.destination),
            timeout: config.tls.handshake_timeout,
            destination: hop.destination,
            direction: hop.dir,
            metrics: &self.metrics.tls,
        };
        let end = match tls::originate(stream, originating).await {
            Ok(tls) => {
                let service = dest.hostname.as_deref().map(Arc::from);
                return self
                    .serve_originated(
                        config,
                        &hop,
                        downstream,
                        &prefix,
                        tls,
                        service,
                        std::future::pending(),
                        None,
                    )
                    .await;
            }
            Err(HandshakeFailure::Timeout) => End::ConnectTimeout,
            Err(_) => End::ConnectFailed,
        };
        self.metrics.direction(hop.dir).connect_failures.inc();
        reset(&downstream);
        refused(Some(hop.destination), end)
    }

    /// Name the server from its certificate, the `service` we dialled it as and, on
    /// `istio-peer-exchange`, its metadata; count the connection open for it; then copy the
    /// client's bytes (`prefix` first) both ways, until `stop` (the drain of an xDS chain);
    /// `end` counts how the connection ended, for an xDS cluster's.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::proxy) async fn serve_originated(
        &self,
        config: &Config,
        hop: &Hop,
        mut downstream: TcpStream,
        prefix: &[u8],
        mut tls: tls::stream::ClientStream,
        service: Option<Arc<str>>,
        stop: impl std::future::Future<Output = ()>,
        end: Option<crate::upstream::connection_end::ConnectionEnd>,
    ) -> Outcome {
        let (_, session) = tls.get_ref();
        let chain = session.peer_certificates().unwrap_or_default();
        let mut peer = Peer::from_chain(chain, session.alpn_protocol())
            .map(|server| Peer { service, ..server });
        let mut unread = BytesMut::new();
        if let Some(server) = peer.as_mut() {
            if server.alpn.as_deref() == Some(ALPN_PEER_EXCHANGE) {
                let Some(exchanged) = self.exchange(&mut tls, config, hop).await else {
                    self.metrics.direction(hop.dir).connect_failures.inc();
                    reset(&downstream);
                    reset(tls.get_ref().0);
                    return refused(Some(hop.destination), End::ConnectFailed);
                };
                server.metadata = exchanged.peer.map(Arc::new);
                unread = exchanged.unread;
            }
        }
        let istio = self.metrics.direction(hop.dir).istio_opened(peer.as_ref());
        let copied = {
            let mut upstream =
                Rewind::new(unread, crate::tls::stream::EndWithoutCloseNotify(&mut tls));
            tcp::copy_streams_until(prefix, &mut downstream, &mut upstream, hop.idle, stop).await
        };
        if let Some(mut end) = end {
            end.copied(&copied);
        }
        copy_outcome(hop, copied, &downstream, tls.get_ref().0).counted_in(istio)
    }
}

/// Istio's SNI for a mesh destination, `outbound_.PORT_._.HOSTNAME`; without a hostname, none
/// (rustls sends no SNI for an address).
fn server_name(dest: &MeshDestination, dst: SocketAddr) -> ServerName<'static> {
    dest.hostname
        .as_ref()
        .and_then(|host| ServerName::try_from(format!("outbound_.{}_._.{host}", dst.port())).ok())
        .unwrap_or_else(|| ServerName::IpAddress(dst.ip().into()))
}
