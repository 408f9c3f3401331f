//! An outbound connection routed by xDS, top to bottom: what the connection offers (read by
//! detection only when the listener's chains look at it), the route decision
//! ([`crate::route`]), then for TCP one endpoint of the chain's cluster ([`crate::upstream`])
//! and the copy, plaintext or inside Istio mTLS as the endpoint's transport says; for HTTP the
//! connection is served by the HTTP path (HTTP/1.1's fast path first, hyper otherwise), each
//! request routed and balanced on its own ([`crate::http::routed`]).

use super::*;
use crate::access_log::{Loggers, XdsFacts};
use crate::metrics::tcp_proxy::{Closed, TcpProxyCounters, TcpProxyStats};
use crate::route::{self, ChainDecision, ChainRef};
use crate::tls::client_hello::{self, ClientHello, Parsed};
use crate::upstream::dial::{self, Connected};
use crate::upstream::Outcome as Attempt;
use crate::upstream::UpstreamError;
use remora_xds::model::listener::{ChainKind, ConnectionFacts, Listener};
use remora_xds::snapshot::Snapshot;

impl Proxy {
    /// Serve an outbound connection by the xDS snapshot in force now; its line goes to the
    /// loggers of the chain that took it, or, if none did, the listener's.
    pub(super) async fn xds_outbound(
        self: &Arc<Self>,
        config: &Arc<Config>,
        downstream: TcpStream,
        hop: Hop,
        snapshot: Arc<Snapshot>,
    ) -> Outcome {
        let listener = snapshot.outbound_listener(hop.destination);
        // Handed on to a listener of its own (not virtualOutbound's chains): counted there.
        let _on_listener = listener
            .filter(|l| !l.use_original_dst)
            .map(|l| self.metrics.listeners.handed(l.address));
        let mut took = Took::default();
        let outcome = self
            .outbound_chain(config, downstream, hop, &snapshot, &mut took)
            .await;
        took.finish(outcome, listener.map(|l| &**l))
    }

    /// Serve an outbound connection by its chain; `took` is set once one takes it.
    async fn outbound_chain(
        self: &Arc<Self>,
        config: &Arc<Config>,
        mut downstream: TcpStream,
        hop: Hop,
        snapshot: &Snapshot,
        took: &mut Took,
    ) -> Outcome {
        let listener = snapshot.outbound_listener(hop.destination);
        // The listener's TLS inspector reads the ClientHello whether or not a chain matches
        // on it: the server name it finds is the connection's `%REQUESTED_SERVER_NAME%`.
        let tls_inspected = listener.is_some_and(|l| {
            l.listener_filters
                .tls_inspector
                .as_ref()
                .is_some_and(|s| s.applies_to(hop.destination.port()))
        });
        let inspect = tls_inspected || listener.is_some_and(|l| inspects(l));
        let Ok((prefix, http)) = self
            .first_bytes(config, &mut downstream, hop, inspect)
            .await
        else {
            return refused(Some(hop.destination), End::DownstreamReset);
        };
        let hello = match client_hello::parse(&prefix) {
            Parsed::Complete(hello) => Some(hello),
            Parsed::Incomplete | Parsed::Invalid => None,
        };
        let alpn = application_protocols(hello.as_ref(), http, true);
        let facts = connection_facts(hop.destination, hello.as_ref(), &alpn);
        let decision = route::outbound(snapshot, &facts, fastrand::u64(..));
        *took = Took::of(Some(&decision), &self.metrics.tcp_proxy);
        let (cluster, idle, hash, chain) = match decision {
            ChainDecision::NoChain => {
                tracing::debug!(peer = %hop.peer, destination = %hop.destination, "no xDS listener or filter chain");
                // Closed, not reset: Envoy's tcp_proxy closes a connection it cannot serve.
                drop(downstream);
                return refused(Some(hop.destination), End::NoRoute)
                    .with_xds(no_chain_facts(hop.destination));
            }
            ChainDecision::Http {
                http: chain,
                chain: filter_chain,
            } => {
                // A chain of HTTP that detection did not see as HTTP: Envoy's connection
                // manager would answer it 400; as HTTP/1.1 the parser does the same.
                let version = http.unwrap_or(HttpVersion::Http1);
                let mut flags = crate::http::XdsChainFlags::of(chain);
                // Kept for the drain of the chain, should an update change or remove it.
                flags.chain = snapshot
                    .outbound_listener(hop.destination)
                    .and_then(|l| ChainRef::new(l, filter_chain));
                let routes = Some((Box::new(chain.routes.clone()), flags));
                let downstream = Downstream::Plain(downstream);
                let http = (version, prefix, None);
                let served = Box::pin(self.http_routed(config, downstream, hop, http, routes));
                return served.await;
            }
            ChainDecision::Tcp { cluster, chain } => {
                // As Envoy's source-IP hash: xxHash64 of the address as text.
                let hashed = matches!(&chain.kind, ChainKind::Tcp(t) if t.hash_source_ip);
                let hash = hashed.then(|| {
                    crate::upstream::hash::xxhash64(hop.peer.ip().to_string().as_bytes(), 0)
                });
                // Kept for the drain of the chain, should an update change or remove it.
                let kept = snapshot
                    .outbound_listener(hop.destination)
                    .and_then(|l| ChainRef::new(l, chain));
                (cluster.to_string(), tcp_idle(chain, hop.idle), hash, kept)
            }
        };
        // What Envoy's access-log format names of the connection: where the client was
        // going, and the cluster (and, once connected, this side of the upstream connection).
        let mut facts = XdsFacts {
            downstream_local: Some(hop.destination),
            cluster: Some(Arc::from(cluster.as_str())),
            sni: hello
                .as_ref()
                .filter(|_| tls_inspected)
                .and_then(|h| h.server_name.as_deref())
                .map(Box::from),
            ..Default::default()
        };
        let selected = match self
            .upstreams
            .select_hashed(snapshot, &cluster, hop.destination, hash)
        {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(peer = %hop.peer, destination = %hop.destination, error = %e, "no upstream");
                // Closed, not reset: Envoy's tcp_proxy closes a connection it cannot serve.
                drop(downstream);
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
        // The endpoint is this connection's upstream from here on.
        let hop = Hop {
            destination: selected.address,
            idle,
            ..hop
        };
        let connected = dial::dial(self, &config.tls, &selected, hop.dir, None, None).await;
        // What Envoy's TCP proxy tells outlier detection: the connect, and that is all.
        match &connected {
            Ok(_) => selected.in_flight.report(Attempt::ConnectedFinal),
            Err(_) => {
                selected.in_flight.connect_failed();
                selected.in_flight.report(Attempt::ConnectFailed);
            }
        }
        match connected {
            Ok(Connected::Plain(mut up)) => {
                // No mesh peer to learn: Istio's open is counted now, for an unknown peer.
                let _ = self.metrics.direction(hop.dir).istio_opened(None);
                facts.upstream_local = up.stream.local_addr().ok();
                let watch = self.watch_chain(chain.as_ref());
                let stop = crate::chain_drain::deadline(watch.as_ref(), config.drain.drain_time);
                let copied =
                    tcp::copy_bidirectional_until(&prefix, &downstream, &up.stream, hop.idle, stop)
                        .await;
                if let Some(end) = up.registration_mut().end_mut() {
                    end.copied(&copied);
                }
                copy_outcome(&hop, copied, &downstream, &up.stream)
                    .counted_in(IstioOpen::Unknown)
                    .with_xds(facts)
            }
            Ok(Connected::Mesh(tls, mut registration)) => {
                let service = selected
                    .cluster
                    .istio
                    .services
                    .first()
                    .map(|s| Arc::from(s.host.as_str()));
                facts.upstream_local = tls.get_ref().0.local_addr().ok();
                let watch = self.watch_chain(chain.as_ref());
                let stop = crate::chain_drain::deadline(watch.as_ref(), config.drain.drain_time);
                let end = registration.take_end();
                self.serve_originated(config, &hop, downstream, &prefix, *tls, service, stop, end)
                    .await
                    .with_xds(facts)
            }
            Err(e) => {
                self.metrics.direction(hop.dir).connect_failures.inc();
                tracing::debug!(peer = %hop.peer, error = %e, "xDS upstream connect failed");
                // Closed, not reset: Envoy's tcp_proxy closes a connection it cannot serve.
                drop(downstream);
                refused(Some(hop.destination), e.end()).with_xds(facts)
            }
        }
    }

    /// Serve HTTP whose requests are routed by the chain's route table.
    async fn http_routed(
        self: &Arc<Self>,
        config: &Arc<Config>,
        downstream: Downstream,
        hop: Hop,
        http: (
            HttpVersion,
            BytesMut,
            Option<Result<Upstream, ConnectError>>,
        ),
        // The chain's route table, and what of its connection manager each request needs.
        routes: Option<(
            Box<remora_xds::model::listener::RouteSource>,
            crate::http::XdsChainFlags,
        )>,
    ) -> Outcome {
        let (version, prefix, early) = http;
        let (end, transfer) = http::serve(
            Arc::clone(self),
            Arc::clone(config),
            http::Connection {
                downstream,
                mesh_peer: None,
                peer: hop.peer,
                direction: hop.dir,
                destination: hop.destination,
                source: hop.source,
                connect_timeout: hop.timeout,
                version,
                prefix,
                early,
                originate: None,
                xds_chain: routes
                    .as_ref()
                    .map(|(_, flags)| flags.clone())
                    .unwrap_or_default(),
                xds_routes: routes.map(|(r, _)| r),
                xds_inbound: None,
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
}

/// What the listener's log says of a connection no chain took: where it was going.
pub(super) fn no_chain_facts(destination: std::net::SocketAddr) -> XdsFacts {
    XdsFacts {
        downstream_local: Some(destination),
        ..XdsFacts::default()
    }
}

/// What a connection keeps of the chain that took it until it ends: the loggers of its line
/// and its `tcp_proxy`'s counters.
#[derive(Default)]
pub(super) struct Took {
    log: Option<Loggers>,
    tcp_proxy: Option<Arc<TcpProxyCounters>>,
}

impl Took {
    /// What the chain of `decision` (`None`: no chain was decided) keeps; a chain that ends
    /// in `tcp_proxy` counts the connection, as Envoy's filter does once made for it.
    pub(super) fn of(decision: Option<&ChainDecision<'_>>, stats: &TcpProxyStats) -> Took {
        let tcp_proxy = match decision {
            Some(ChainDecision::Tcp { chain, .. }) => match &chain.kind {
                ChainKind::Tcp(tcp) => Some(stats.of(&tcp.stat_prefix)),
                ChainKind::Http(_) => None,
            },
            _ => None,
        };
        if let Some(counters) = &tcp_proxy {
            counters.opened();
        }
        Took {
            log: decision.and_then(connection_log),
            tcp_proxy,
        }
    }

    /// The connection ended with `outcome`: its `tcp_proxy` counts how, and its line goes to
    /// the chain's loggers, or `listener`'s when no chain took it.
    pub(super) fn finish(self, outcome: Outcome, listener: Option<&Listener>) -> Outcome {
        if let Some(counters) = &self.tcp_proxy {
            counters.closed(Closed {
                received: outcome.transfer.sent,
                sent: outcome.transfer.received,
                idle_timeout: outcome.end == End::IdleTimeout,
                no_route: outcome.end == End::NoCluster,
            });
        }
        outcome.logged_by(self.log, listener)
    }
}

/// The loggers of a connection a chain took, as Envoy's: its `tcp_proxy`'s; none at the
/// connection's end for HTTP (its connection manager's loggers write each request); `None`
/// when no chain took it (the listener's loggers then, with their filter).
fn connection_log(decision: &ChainDecision<'_>) -> Option<Loggers> {
    match decision {
        ChainDecision::Tcp { chain, .. } => Some(match &chain.kind {
            ChainKind::Tcp(tcp) => Loggers::xds(&tcp.access_log),
            ChainKind::Http(_) => Loggers::None,
        }),
        ChainDecision::Http { .. } => Some(Loggers::None),
        ChainDecision::NoChain => None,
    }
}

/// The chain's `tcp_proxy` idle timeout: unset is Envoy's hour (the config file's
/// `tcp.idle_timeout`, whose default it is), zero is none.
pub(super) fn tcp_idle(
    chain: &remora_xds::model::listener::FilterChain,
    config: Option<Duration>,
) -> Option<Duration> {
    match &chain.kind {
        remora_xds::model::listener::ChainKind::Tcp(tcp) => match tcp.idle_timeout {
            None => config,
            Some(d) => Some(d).filter(|d| !d.is_zero()),
        },
        remora_xds::model::listener::ChainKind::Http(_) => config,
    }
}

impl Proxy {
    /// Watch the chain a connection took for an xDS update that changes or removes it
    /// ([`crate::chain_drain`]); none without xDS or a chain.
    pub fn watch_chain(&self, chain: Option<&ChainRef>) -> Option<crate::chain_drain::Watch> {
        let (Some(store), Some(chain)) = (&self.xds, chain) else {
            return None;
        };
        Some(self.chain_drains.watch(store, chain.clone()))
    }
}

/// Whether a listener's chains look at what detection reads (TLS or not, ALPN, SNI): if none
/// does, the connection is decided by its destination alone, at once, as Envoy does without
/// inspector filters, and a server that speaks first is not kept waiting.
impl Proxy {
    /// The connection's first bytes, read by detection when the listener's chains look at
    /// them (`inspect`), as Envoy's TLS and HTTP inspectors read them; `Err` when the client
    /// went away meanwhile. Nothing is dialled while detecting: where to is not known until
    /// the chain is.
    pub(super) async fn first_bytes(
        self: &Arc<Self>,
        config: &Arc<Config>,
        downstream: &mut TcpStream,
        hop: Hop,
        inspect: bool,
    ) -> Result<(BytesMut, Option<HttpVersion>), ()> {
        if !inspect {
            return Ok((BytesMut::new(), None));
        }
        let wait = detect_wait(config, true);
        match self.detect(downstream, hop, false, wait, None).await {
            Detected::Http(version, prefix, _) => Ok((prefix, Some(version))),
            Detected::Tcp(prefix, _) | Detected::Tls(prefix, _) => Ok((prefix, None)),
            Detected::ClientFailed => Err(()),
        }
    }
}

/// The application protocols a filter chain match sees: the ClientHello's ALPN, else what the
/// HTTP inspector reports of plaintext HTTP (when it runs for this connection).
pub(super) fn application_protocols(
    hello: Option<&ClientHello>,
    http: Option<HttpVersion>,
    http_inspected: bool,
) -> Vec<&str> {
    match (hello, http) {
        (Some(h), _) => h
            .alpn
            .iter()
            .filter_map(|p| std::str::from_utf8(p).ok())
            .collect(),
        (None, Some(HttpVersion::Http1)) if http_inspected => vec!["http/1.1"],
        (None, Some(HttpVersion::Http2)) if http_inspected => vec!["h2c"],
        (None, _) => vec![],
    }
}

/// What a filter chain is matched on, from the destination and what the inspectors saw.
pub(super) fn connection_facts<'a>(
    destination: std::net::SocketAddr,
    hello: Option<&'a ClientHello>,
    alpn: &'a [&'a str],
) -> ConnectionFacts<'a> {
    ConnectionFacts {
        destination,
        server_name: hello.and_then(|h| h.server_name.as_deref()),
        transport_protocol: if hello.is_some() { "tls" } else { "raw_buffer" },
        application_protocols: alpn,
    }
}

pub(super) fn inspects(listener: &Listener) -> bool {
    listener.all_chains().any(|c| {
        let m = &c.matcher;
        m.transport_protocol.is_some()
            || !m.application_protocols.is_empty()
            || !m.server_names.is_empty()
            || matches!(c.kind, remora_xds::model::listener::ChainKind::Http(_))
    })
}

#[cfg(test)]
#[path = "xds_log_tests.rs"]
mod log_tests;
