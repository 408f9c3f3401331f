//! An inbound connection served by istiod's `virtualInbound`, top to bottom, as Envoy serves
//! it: what the connection offers (TLS or not, ALPN, SNI, read by detection as Envoy's TLS and
//! HTTP inspectors read it, where the listener runs them), the chain those facts pick
//! ([`crate::route::inbound`]; none: the connection is reset, `NR`), mesh TLS terminated with
//! the chain's downstream context (the workload certificate, the chain's ALPN, a client
//! certificate required and its SAN checked as the chain says), Istio's metadata exchange when
//! the chain has it, the chain's network RBAC filters, then TCP to one endpoint of the chain's
//! cluster ([`crate::upstream`]: istiod's `inbound|PORT||`, `InboundPassthroughCluster…`) or
//! HTTP, each request routed by the chain's route table and decided by its HTTP RBAC filters.
//!
//! Before the first listener configuration there is no `virtualInbound`: Envoy has no 15006
//! listener until LDS brings it, so a captured connection finds nothing; here it is reset and
//! counted as `NR`, rather than served by the config file's rules.

use super::inbound_tls::chain_params;
use super::*;
use crate::authz::{Attributes, Verdict};
use crate::metrics::rbac_filters::{ChainRbac, Filters};
use crate::route::{self, ChainDecision, ChainRef};
use crate::tls;
use crate::tls::client_hello::{self, ClientHello, Parsed};
use crate::tls::stream::Rewind;
use crate::tls::{HandshakeFailure, Peer, ALPN_PEER_EXCHANGE};
use crate::upstream::dial::{self, Connected};
use crate::upstream::Outcome as Attempt;
use crate::upstream::UpstreamError;
use remora_xds::model::listener::{DownstreamTls, NetworkFilter};
use remora_xds::snapshot::Snapshot;

/// What the inbound chain serves, once mesh TLS (if any) is terminated.
struct Served<'a> {
    hop: Hop,
    snapshot: &'a Snapshot,
    decision: ChainDecision<'a>,
    chain: Option<ChainRef>,
    /// The client's sidecar, when mesh TLS was terminated with its certificate.
    peer: Option<Arc<Peer>>,
    sni: Option<String>,
    /// The listener's TLS inspector ran: the server name is the connection's
    /// `%REQUESTED_SERVER_NAME%`.
    tls_inspected: bool,
}

/// How a chain's network filters refused a connection, in Envoy's words for its access-log
/// line.
struct Refusal {
    end: End,
    /// `%CONNECTION_TERMINATION_DETAILS%`: an RBAC filter's
    /// `rbac_access_denied_matched_policy[…]`.
    termination: Option<String>,
    /// `%RESPONSE_CODE_DETAILS%`: the ext_authz filter's `ext_authz_denied` or
    /// `ext_authz_error`.
    details: Option<&'static str>,
}

impl Refusal {
    fn rbac(why: String) -> Refusal {
        Refusal {
            end: End::RbacDenied,
            termination: Some(why),
            details: None,
        }
    }
}

impl Proxy {
    /// Serve an inbound connection by the xDS snapshot in force now; its line goes to the
    /// loggers of the chain that took it, or, if none did, the listener's.
    pub(super) async fn xds_inbound(
        self: &Arc<Self>,
        config: &Arc<Config>,
        downstream: TcpStream,
        hop: Hop,
        snapshot: Arc<Snapshot>,
    ) -> Outcome {
        let mut took = super::xds::Took::default();
        let outcome = self
            .inbound_chain(config, downstream, hop, &snapshot, &mut took)
            .await;
        let listener = snapshot.inbound_listener();
        took.finish(outcome, listener.map(|l| &**l))
    }

    /// Serve an inbound connection by its chain; `took` is set once one takes it.
    async fn inbound_chain(
        self: &Arc<Self>,
        config: &Arc<Config>,
        mut downstream: TcpStream,
        hop: Hop,
        snapshot: &Snapshot,
        took: &mut super::xds::Took,
    ) -> Outcome {
        let Some(listener) = snapshot.inbound_listener() else {
            tracing::debug!(peer = %hop.peer, destination = %hop.destination, "no virtualInbound listener yet: refused, as Envoy has no inbound listener before LDS");
            reset(&downstream);
            return refused(Some(hop.destination), End::NoRoute);
        };
        let port = hop.destination.port();
        let scope = &listener.listener_filters;
        let tls_inspected = scope
            .tls_inspector
            .as_ref()
            .is_some_and(|s| s.applies_to(port));
        let http_inspected = scope
            .http_inspector
            .as_ref()
            .is_some_and(|s| s.applies_to(port));
        let inspect = super::xds::inspects(listener);
        let Ok((prefix, http)) = self
            .first_bytes(config, &mut downstream, hop, inspect)
            .await
        else {
            return refused(Some(hop.destination), End::DownstreamReset);
        };
        let hello = match client_hello::parse(&prefix) {
            Parsed::Complete(hello) if tls_inspected => Some(hello),
            _ => None,
        };
        let alpn = super::xds::application_protocols(hello.as_ref(), http, http_inspected);
        let facts = super::xds::connection_facts(hop.destination, hello.as_ref(), &alpn);
        let decided = route::inbound(snapshot, &facts, fastrand::u64(..));
        *took = super::xds::Took::of(
            decided.as_ref().map(|i| &i.decision),
            &self.metrics.tcp_proxy,
        );
        let Some(inbound) = decided.filter(|i| !matches!(i.decision, ChainDecision::NoChain))
        else {
            tracing::debug!(peer = %hop.peer, destination = %hop.destination, alpn = ?alpn, "no virtualInbound filter chain");
            reset(&downstream);
            return refused(Some(hop.destination), End::NoRoute)
                .with_xds(super::xds::no_chain_facts(hop.destination));
        };
        let mut served = Served {
            hop,
            snapshot,
            decision: inbound.decision,
            chain: inbound.chain,
            peer: None,
            sni: None,
            tls_inspected,
        };
        let Some(tls) = inbound.terminate else {
            // A plaintext chain (or TLS passed through as bytes).
            served.sni = hello_sni(&prefix);
            let downstream = Downstream::Plain(downstream);
            return self
                .serve_chain(config, downstream, prefix, http, served)
                .await;
        };
        let Some(hello) = hello else {
            // A chain that terminates TLS took a client that sent none: Envoy's handshake
            // fails; nothing is served in the clear on a chain meant for mesh TLS.
            self.metrics.tls.handshake(hop.dir, "mtls_required");
            tracing::debug!(peer = %hop.peer, destination = %hop.destination, "no ClientHello on a TLS chain");
            reset(&downstream);
            return refused(Some(hop.destination), End::TlsHandshakeFailed);
        };
        let accepted = self
            .terminate_chain(config, downstream, prefix, tls, &hello, hop)
            .await;
        let (mut stream, mut peer) = match accepted {
            Ok(accepted) => accepted,
            Err(refusal) => return refusal,
        };
        let mut unread = BytesMut::new();
        let exchanges = served
            .chain
            .as_ref()
            .and_then(ChainRef::chain)
            .is_some_and(|c| {
                c.filters
                    .iter()
                    .any(|f| matches!(f, NetworkFilter::MetadataExchange(_)))
            });
        if let Some(p) = peer
            .as_mut()
            .filter(|p| exchanges && p.alpn.as_deref() == Some(ALPN_PEER_EXCHANGE))
        {
            let Some(exchanged) = self.exchange(&mut *stream, config, &hop).await else {
                reset(stream.get_ref().0.inner());
                return refused(Some(hop.destination), End::DownstreamReset);
            };
            p.metadata = exchanged.peer.map(Arc::new);
            unread = exchanged.unread;
        }
        served.peer = peer.map(Arc::new);
        served.sni = hello.server_name.clone();
        // HTTP inside: its version is read from the decrypted bytes, as the connection
        // manager's codec reads it.
        let (prefix, http) = match &served.decision {
            ChainDecision::Http { .. } => {
                let wait = detect_wait(config, false);
                let mut replayed = Rewind::new(unread, &mut *stream);
                let detected = self.detect(&mut replayed, hop, false, wait, None).await;
                let (not_read, _) = replayed.into_parts();
                match detected.after(not_read) {
                    Detected::Http(version, prefix, _) => (prefix, Some(version)),
                    Detected::Tcp(prefix, _) | Detected::Tls(prefix, _) => (prefix, None),
                    Detected::ClientFailed => {
                        return refused(Some(hop.destination), End::DownstreamReset)
                    }
                }
            }
            _ => (unread, None),
        };
        self.serve_chain(config, Downstream::Mesh(stream), prefix, http, served)
            .await
    }

    /// Terminate mesh TLS with the chain's context; the stream and the client's sidecar (none
    /// when the chain does not require a certificate and none was sent), or the outcome of a
    /// refused handshake.
    async fn terminate_chain(
        &self,
        config: &Config,
        downstream: TcpStream,
        prefix: BytesMut,
        tls: &DownstreamTls,
        hello: &ClientHello,
        hop: Hop,
    ) -> Result<(Box<tls::stream::ServerStream>, Option<Peer>), Outcome> {
        // Envoy selects the first of the chain's protocols the client offers, or none.
        let alpn: Vec<&[u8]> = tls
            .alpn
            .iter()
            .map(String::as_bytes)
            .filter(|a| hello.alpn.iter().any(|o| o.as_slice() == *a))
            .collect();
        let server = match self.mesh.chain_server_config(
            &chain_params(tls, &config.tls),
            &alpn,
            tls.require_client_certificate,
        ) {
            Some(Ok(server)) => server,
            Some(Err(e)) => {
                tracing::error!(error = %e, "cannot terminate mesh TLS");
                reset(&downstream);
                return Err(refused(Some(hop.destination), End::TlsHandshakeFailed));
            }
            None => {
                tracing::warn!(peer = %hop.peer, "refused: no workload certificate to terminate mesh TLS with");
                reset(&downstream);
                return Err(refused(Some(hop.destination), End::TlsHandshakeFailed));
            }
        };
        let accepting =
            tokio_rustls::TlsAcceptor::from(server).accept(Rewind::new(prefix, downstream));
        let (failure, error) =
            match tokio::time::timeout(config.tls.handshake_timeout, accepting).await {
                Ok(Ok(stream)) => {
                    let (_, session) = stream.get_ref();
                    let peer = session
                        .peer_certificates()
                        .and_then(|chain| Peer::from_chain(chain, session.alpn_protocol()));
                    self.metrics.tls.handshake(hop.dir, "ok");
                    return Ok((Box::new(stream), peer));
                }
                Ok(Err(e)) => (HandshakeFailure::of(&e), e.to_string()),
                Err(_) => (HandshakeFailure::Timeout, "timed out".to_string()),
            };
        self.metrics.tls.handshake(hop.dir, failure.as_str());
        tracing::warn!(
            peer = %hop.peer, destination = %hop.destination, reason = failure.as_str(),
            %error, "inbound mesh TLS handshake failed"
        );
        Err(refused(Some(hop.destination), End::TlsHandshakeFailed))
    }

    /// Serve what the chain says: network RBAC first, then TCP to its cluster or HTTP by its
    /// route table.
    async fn serve_chain(
        self: &Arc<Self>,
        config: &Arc<Config>,
        downstream: Downstream,
        prefix: BytesMut,
        http: Option<HttpVersion>,
        served: Served<'_>,
    ) -> Outcome {
        let hop = served.hop;
        let principal = served
            .peer
            .as_ref()
            .and_then(|p| p.spiffe_id.as_ref())
            .map(crate::identity::SpiffeId::as_str);
        let attributes = Attributes {
            source: hop.peer,
            destination: hop.destination,
            principal,
            peer: served.peer.as_deref(),
            sni: served.sni.as_deref(),
            request: None,
        };
        // How the connection is refused, if it is, in Envoy's words. The chain's RBAC filters
        // are counted (`tcp.rbac.*`) in counters looked up once, for this decision only.
        let denied = {
            let counts = served.chain.as_ref().and_then(|chain| {
                let mut all = chain.all_network_rbac().peekable();
                all.peek()
                    .is_some()
                    .then(|| ChainRbac::resolve(&self.metrics.rbac_filters, Filters::Network, all))
            });
            let filters = served.chain.iter().flat_map(ChainRef::network_rbac);
            let mut denied = match self.authz.check_rbac(filters, &attributes, counts.as_ref()) {
                Verdict::Denied(why) => Some(Refusal::rbac(why)),
                Verdict::Allowed => None,
            };
            if let (None, Some(chain)) = (&denied, &served.chain) {
                denied = self
                    .network_ext_authz(config, chain, &attributes, counts.as_ref(), hop.timeout)
                    .await;
            }
            denied
        };
        match served.decision {
            ChainDecision::Http { http: chain, .. } => {
                if let Some(refusal) = denied {
                    close(&downstream);
                    return refused(Some(hop.destination), refusal.end);
                }
                // A chain of HTTP that detection did not see as HTTP: Envoy's connection
                // manager would answer it 400; as HTTP/1.1 the parser does the same.
                let version = http.unwrap_or(HttpVersion::Http1);
                let (end, transfer) = http::serve(
                    Arc::clone(self),
                    Arc::clone(config),
                    http::Connection {
                        downstream,
                        mesh_peer: served.peer,
                        peer: hop.peer,
                        direction: hop.dir,
                        destination: hop.destination,
                        source: hop.source,
                        connect_timeout: hop.timeout,
                        version,
                        prefix,
                        early: None,
                        originate: None,
                        xds_routes: Some(Box::new(chain.routes.clone())),
                        xds_chain: crate::http::XdsChainFlags::of(chain),
                        xds_inbound: served.chain,
                    },
                )
                .await;
                Outcome {
                    destination: Some(hop.destination),
                    transfer,
                    end,
                    http: true,
                    istio: IstioOpen::NotTcp,
                    xds: None,
                    log: Loggers::None,
                }
            }
            ChainDecision::Tcp { cluster, chain } => {
                let istio = self
                    .metrics
                    .direction(hop.dir)
                    .istio_opened(served.peer.as_deref());
                if let Some(refusal) = denied {
                    close(&downstream);
                    // What Envoy's log says of it: its TCP proxy had taken the chain's
                    // cluster (and had dialled it: Remora does not, `docs/xds.md`), its
                    // filter had read the client's first bytes.
                    let facts = crate::access_log::XdsFacts {
                        downstream_local: Some(hop.destination),
                        cluster: Some(Arc::from(cluster)),
                        sni: served
                            .sni
                            .as_deref()
                            .filter(|_| served.tls_inspected)
                            .map(Box::from),
                        termination_details: refusal.termination.map(String::into_boxed_str),
                        response_details: refusal.details,
                        unforwarded: prefix.len() as u64,
                        ..Default::default()
                    };
                    return refused(Some(hop.destination), refusal.end)
                        .with_xds(facts)
                        .counted_in(istio);
                }
                let hop = Hop {
                    idle: super::xds::tcp_idle(chain, hop.idle),
                    ..hop
                };
                let sni = served.sni.as_deref().filter(|_| served.tls_inspected);
                let target = (served.snapshot, cluster, served.chain.as_ref());
                self.inbound_tcp(config, downstream, &prefix, hop, target, sni)
                    .await
                    .counted_in(istio)
            }
            ChainDecision::NoChain => {
                close(&downstream);
                refused(Some(hop.destination), End::NoRoute)
            }
        }
    }

    /// The chain's network filters from its first ext_authz filter on (AuthorizationPolicy
    /// CUSTOM on a TCP port), in order: each ext_authz filter that the shadow RBAC filters
    /// before it enable asks the authorizer, then the RBAC filters after it decide (counted in
    /// `counts`). What ends the connection, if anything.
    async fn network_ext_authz(
        self: &Arc<Self>,
        config: &Arc<Config>,
        chain: &ChainRef,
        attributes: &Attributes<'_>,
        counts: Option<&ChainRbac>,
        connect_timeout: std::time::Duration,
    ) -> Option<Refusal> {
        use crate::authz::rbac::{shadow_metadata, NETWORK_RBAC_METADATA};
        let mut before: Vec<&remora_xds::model::rbac::Rbac> = chain.network_rbac().collect();
        let mut after = Vec::new();
        for filter in chain.network_from_ext_authz() {
            match filter {
                NetworkFilter::ExtAuthz(ext) => {
                    if !after.is_empty() {
                        if let Verdict::Denied(why) =
                            self.authz.check_rbac(after.drain(..), attributes, counts)
                        {
                            return Some(Refusal::rbac(why));
                        }
                    }
                    let enabled = ext.enabled_by.as_ref().is_none_or(|on| {
                        on.filter == NETWORK_RBAC_METADATA
                            && shadow_metadata(before.iter().copied(), attributes, &on.key)
                                .is_some_and(|v| on.matcher.matches(v))
                    });
                    let conn = http::ext_authz::network::Connection {
                        peer: attributes.source,
                        destination: attributes.destination,
                        principal: attributes.principal,
                        connect_timeout,
                    };
                    if !enabled {
                        http::ext_authz::network::disabled(self, ext);
                    } else if let Err(refused) =
                        http::ext_authz::network::check(self, config, ext, &conn).await
                    {
                        return Some(Refusal {
                            end: End::ExtAuthzDenied,
                            termination: None,
                            details: Some(refused.details()),
                        });
                    }
                }
                NetworkFilter::Rbac(r) => {
                    after.push(r);
                    before.push(r);
                }
                _ => {}
            }
        }
        match self.authz.check_rbac(after, attributes, counts) {
            Verdict::Denied(why) => Some(Refusal::rbac(why)),
            Verdict::Allowed => None,
        }
    }

    /// Copy the connection to one endpoint of `cluster` (`sni`: the server name the listener's
    /// TLS inspector read), until the end of the drain time of `chain` once an update retires
    /// it.
    async fn inbound_tcp(
        &self,
        config: &Config,
        mut downstream: Downstream,
        prefix: &[u8],
        hop: Hop,
        (snapshot, cluster, chain): (&Snapshot, &str, Option<&ChainRef>),
        sni: Option<&str>,
    ) -> Outcome {
        // What Envoy's access-log format names of the connection.
        let mut facts = crate::access_log::XdsFacts {
            downstream_local: Some(hop.destination),
            cluster: Some(Arc::from(cluster)),
            sni: sni.map(Box::from),
            ..Default::default()
        };
        let selected = match self.upstreams.select(snapshot, cluster, hop.destination) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(peer = %hop.peer, destination = %hop.destination, error = %e, "no upstream");
                close(&downstream);
                let end = match e {
                    UpstreamError::NoCluster(_) => End::NoCluster,
                    UpstreamError::NoHealthyUpstream(_) | UpstreamError::Transport { .. } => {
                        End::NoHealthyUpstream
                    }
                    UpstreamError::Overflow(_) | UpstreamError::ConnectionsFull(_) => End::Overflow,
                };
                if end == End::NoCluster {
                    facts.cluster = None;
                }
                return refused(Some(hop.destination), end).with_xds(facts);
            }
        };
        let hop = Hop {
            destination: selected.address,
            ..hop
        };
        let connected = dial::dial(self, &config.tls, &selected, hop.dir, None, hop.source).await;
        // What Envoy's TCP proxy tells outlier detection: the connect, and that is all.
        match &connected {
            Ok(_) => selected.in_flight.report(Attempt::ConnectedFinal),
            Err(_) => {
                selected.in_flight.connect_failed();
                selected.in_flight.report(Attempt::ConnectFailed);
            }
        }
        let watch = self.watch_chain(chain);
        let stop = crate::chain_drain::deadline(watch.as_ref(), config.drain.drain_time);
        // How the upstream connection ends is counted from what the copy came to.
        let ended = |registration: &mut crate::loop_guard::Registration, copied: &_| {
            if let Some(end) = registration.end_mut() {
                end.copied(copied);
            }
        };
        let copied = match (&mut downstream, connected) {
            (Downstream::Plain(d), Ok(Connected::Plain(mut up))) => {
                facts.upstream_local = up.stream.local_addr().ok();
                let copied =
                    tcp::copy_bidirectional_until(prefix, d, &up.stream, hop.idle, stop).await;
                ended(up.registration_mut(), &copied);
                return copy_outcome(&hop, copied, d, &up.stream).with_xds(facts);
            }
            (Downstream::Mesh(d), Ok(Connected::Plain(up))) => {
                let (mut stream, mut registration) = up.into_parts();
                let copied =
                    tcp::copy_streams_until(prefix, &mut **d, &mut stream, hop.idle, stop).await;
                ended(&mut registration, &copied);
                (copied, stream)
            }
            (Downstream::Plain(d), Ok(Connected::Mesh(mut tls, mut registration))) => {
                let copied = tcp::copy_streams_until(prefix, d, &mut *tls, hop.idle, stop).await;
                ended(&mut registration, &copied);
                (copied, tls.into_inner().0)
            }
            (Downstream::Mesh(d), Ok(Connected::Mesh(mut tls, mut registration))) => {
                let copied =
                    tcp::copy_streams_until(prefix, &mut **d, &mut *tls, hop.idle, stop).await;
                ended(&mut registration, &copied);
                (copied, tls.into_inner().0)
            }
            (_, Err(e)) => {
                self.metrics.direction(hop.dir).connect_failures.inc();
                tracing::debug!(peer = %hop.peer, error = %e, "inbound upstream connect failed");
                close(&downstream);
                return refused(Some(hop.destination), e.end()).with_xds(facts);
            }
        };
        let (copied, upstream) = copied;
        facts.upstream_local = upstream.local_addr().ok();
        copy_outcome(&hop, copied, downstream_socket(&downstream), &upstream).with_xds(facts)
    }
}

/// The server name of a ClientHello at the start of `prefix` (TLS passed through).
fn hello_sni(prefix: &[u8]) -> Option<String> {
    super::authorize::tls_sni(prefix)
}

/// The client's TCP socket.
fn downstream_socket(d: &Downstream) -> &TcpStream {
    match d {
        Downstream::Plain(s) => s,
        Downstream::Mesh(tls) => tls.get_ref().0.inner(),
    }
}

/// Reset the client: a refusal, as Envoy closes a connection its filters stop.
fn close(d: &Downstream) {
    reset(downstream_socket(d));
}
