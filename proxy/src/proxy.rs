//! One connection, top to bottom: where it was going, whether it would loop, what it speaks
//! (detection, while the upstream connection is already being opened), then the copy of opaque
//! bytes or the HTTP proxy, and the record of it (metrics, access log).

use crate::access_log::{AccessLog, End, Entry, Loggers};
use crate::connect::{self, ConnectError, Upstream};
use crate::detect::{self, HttpVersion};
use crate::drain::Drain;
use crate::http::{self, pool::Pool};
use crate::loop_guard::{self, Guard, LoopGuard};
use crate::metrics::{IstioOpen, Metrics};
use crate::tcp::{self, CopyError, Transfer};
use crate::tls::stream::Downstream;
use crate::{orig_dst, Direction};
use arc_swap::ArcSwap;
use bytes::BytesMut;
use remora_config::{Config, InterceptionMode, ListenerConfig, ListenerProtocol};
use socket2::SockRef;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::net::TcpStream;

use detection::{detect_wait, Detected};

mod authorize;
mod detection;
mod inbound_tls;
mod inbound_xds;
mod mesh;
mod xds;

/// Everything a connection needs, shared by all of them.
#[derive(Debug)]
pub struct Proxy {
    /// The current config; a reload swaps in a new snapshot, which new connections pick up.
    pub config: Arc<ArcSwap<Config>>,
    pub loop_guard: Arc<LoopGuard>,
    pub metrics: Arc<Metrics>,
    pub drain: Arc<Drain>,
    pub access_log: AccessLog,
    /// Idle upstream HTTP connections, shared by every downstream connection.
    pub pool: Arc<Pool>,
    /// The HTTP/1.1 fast path's idle upstream sockets and read buffers, shared likewise.
    pub h1: Arc<http::h1::Shared>,
    /// Idle HTTP/1.1 mesh connections we originated, shared likewise.
    pub mesh_pool: Arc<http::originate::MeshPool>,
    /// The workload identity and mesh TLS configs; without an identity, no mesh TLS.
    pub mesh: Arc<crate::tls::Mesh>,
    /// Istio authorization policies in force for inbound traffic.
    pub authz: Arc<crate::authz::Authorizer>,
    /// Configuration in Envoy's discovery resources (from istiod over ADS, or from files):
    /// when present, it decides where connections and requests go; when absent, the config
    /// file's capture and explicit-listener behaviour does.
    pub xds: Option<Arc<remora_xds::store::Store>>,
    /// With `xds`: the balancers' state and the pooled connections to endpoints.
    pub upstreams: Arc<crate::upstream::Upstreams>,
    /// With `xds`: the connections watched for an update that retires their filter chain.
    pub chain_drains: Arc<crate::chain_drain::ChainDrains>,
}

/// Where a listener's connections go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// A capture listener: to the original destination.
    Capture(Direction),
    /// An explicit listener, as configured when it was bound: always to its upstream, as its
    /// protocol, with mesh TLS if it says so. Counted as outbound, or as inbound when it
    /// terminates mesh TLS (the server's sidecar).
    Fixed(Arc<ListenerConfig>),
}

impl Route {
    /// The direction metrics and logs file the connection under.
    pub fn direction(&self) -> Direction {
        match self {
            Route::Capture(d) => *d,
            Route::Fixed(l) if l.terminates_tls() => Direction::Inbound,
            Route::Fixed(_) => Direction::Outbound,
        }
    }
}

/// How a connection is handled before anything is read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Opaque bytes, no detection: declared `tcp`-like, or one of Istio's always-TCP ports.
    Tcp,
    /// Declared HTTP: only HTTP/1 versus HTTP/2 is read from the client; the server is not
    /// expected to speak first.
    Http,
    /// Detect, with server-first protocols decided by the server's first byte.
    Auto,
}

/// What happened to one connection.
struct Outcome {
    destination: Option<SocketAddr>,
    transfer: Transfer,
    end: End,
    /// Served as HTTP (each request has its own access-log line).
    http: bool,
    /// Where Istio's open was counted: once plaintext is known to be TCP, once the peer is
    /// known for mesh connections; never for HTTP.
    istio: IstioOpen,
    /// Routed by xDS: its cluster and addresses, for Envoy's access-log format.
    xds: Option<Box<crate::access_log::XdsFacts>>,
    /// Routed by xDS: the loggers of its chain, or of its listener when no chain took it.
    log: Loggers,
}

impl Proxy {
    /// A proxy with `config`, no mesh identity and no policies (tests, and the whole-proxy
    /// fuzz target: cargo-fuzz builds with `--cfg fuzzing`).
    #[cfg(any(test, fuzzing))]
    #[doc(hidden)]
    pub fn for_tests(config: Config) -> Arc<Self> {
        let metrics = Arc::new(Metrics::default());
        Arc::new(Proxy {
            config: Arc::new(ArcSwap::from_pointee(config)),
            loop_guard: LoopGuard::new(vec![]),
            metrics: Arc::clone(&metrics),
            drain: Drain::new(),
            access_log: AccessLog::start(metrics).expect("the access-log thread starts"),
            pool: Arc::default(),
            h1: Arc::default(),
            mesh_pool: Arc::default(),
            mesh: Arc::default(),
            authz: Arc::new(crate::authz::Authorizer::new(Default::default())),
            xds: None,
            upstreams: Arc::default(),
            chain_drains: Arc::default(),
        })
    }

    /// Serve one accepted connection until it is finished.
    pub async fn serve(self: Arc<Self>, downstream: TcpStream, peer: SocketAddr, route: Route) {
        let dir = route.direction();
        let _active = self.drain.track();
        let config = self.config.load_full();
        let started = (SystemTime::now(), Instant::now());
        let m = self.metrics.direction(dir);
        m.connection_opened();
        let peer = orig_dst::canonical(peer);

        let outcome = self.proxy(&config, downstream, peer, &route).await;
        match outcome.end {
            End::IdleTimeout => m.idle_timeouts.inc(),
            End::FilterChainRemoved => m.chain_drain_closes.inc(),
            _ => 0,
        };

        m.connection_closed(
            &outcome.istio,
            outcome.end.response_flag(),
            outcome.transfer.sent,
            outcome.transfer.received,
        );
        // HTTP connections log each request instead. The config file's log takes every
        // connection; else the loggers of the chain (or listener) that served it.
        let loggers = Loggers::of_config(&config).unwrap_or(outcome.log);
        if loggers.is_some() && !outcome.http {
            let entry = Entry {
                start: started.0,
                direction: dir,
                source: peer,
                destination: outcome.destination,
                sent: outcome.transfer.sent,
                received: outcome.transfer.received,
                duration: started.1.elapsed(),
                end: outcome.end,
                xds: outcome.xds,
            };
            self.access_log.log(&entry, &loggers);
        }
    }

    async fn proxy(
        self: &Arc<Self>,
        config: &Arc<Config>,
        downstream: TcpStream,
        peer: SocketAddr,
        route: &Route,
    ) -> Outcome {
        let dir = route.direction();
        let destination = match route {
            Route::Fixed(l) => l.upstream,
            Route::Capture(_) => match orig_dst::original_dst(&downstream) {
                Ok((dst, _)) => dst,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "no destination for connection");
                    return refused(None, End::NoDestination);
                }
            },
        };
        let verdict = match &route {
            Route::Capture(_) => self.loop_guard.check(peer, destination),
            Route::Fixed(_) => {
                let dialled = downstream.local_addr().ok();
                self.loop_guard.check_explicit(peer, dialled, destination)
            }
        };
        match verdict {
            loop_guard::Verdict::Pass => {
                self.proxy_to(config, downstream, peer, route, destination)
                    .await
            }
            // On the heap: rare, and the common path should not carry a second copy.
            loop_guard::Verdict::Suspect => {
                let serving = self.proxy_to(config, downstream, peer, route, destination);
                Box::pin(loop_guard::serve_suspect(serving)).await
            }
            loop_guard::Verdict::Refuse(guard) => {
                let counter = match guard {
                    Guard::OwnListener => &self.metrics.loop_refused_own_listener,
                    Guard::OwnUpstream => &self.metrics.loop_refused_own_upstream,
                };
                counter.inc();
                tracing::warn!(
                    %peer, %destination, guard = guard.as_str(), direction = dir.as_str(),
                    "refused a connection that would loop into Remora"
                );
                reset(&downstream);
                refused(Some(destination), End::LoopRefused(guard))
            }
        }
    }

    /// Proxy a connection the loop guards let through to `destination`.
    async fn proxy_to(
        self: &Arc<Self>,
        config: &Arc<Config>,
        mut downstream: TcpStream,
        peer: SocketAddr,
        route: &Route,
        destination: SocketAddr,
    ) -> Outcome {
        let dir = route.direction();
        let _ = downstream.set_nodelay(true);

        let (source, timeout) = upstream_settings(config, route, peer, destination);
        let mut mode = mode(config, route, destination);
        if mode == Mode::Auto
            && (self.pool.speaks_http(destination, source)
                || self.h1.pool.speaks_http(destination, source))
        {
            // A pooled HTTP connection to it exists: no need to dial early or to watch for a
            // server that speaks first, and no new upstream connection per client connection.
            mode = Mode::Http;
        }
        let hop = Hop {
            dir,
            peer,
            destination,
            source,
            timeout,
            idle: config.tcp.idle(),
        };
        let routed_by_xds = match route {
            Route::Capture(Direction::Outbound) => self.xds.is_some(),
            Route::Capture(Direction::Inbound) => false,
            Route::Fixed(l) => l.protocol == ListenerProtocol::Xds,
        };
        if routed_by_xds {
            let Some(xds) = &self.xds else {
                // An explicit `xds` listener with no resources to route by.
                tracing::debug!(%peer, %destination, "xds listener without xDS resources");
                reset(&downstream);
                return refused(Some(destination), End::NoRoute);
            };
            // Routed by xDS: the route decision and the upstream layer choose, not the
            // destination. Boxed: the file-config path should not carry its state.
            let snapshot = xds.snapshot();
            return Box::pin(self.xds_outbound(config, downstream, hop, snapshot)).await;
        }
        if let (Some(xds), Route::Capture(Direction::Inbound)) = (&self.xds, route) {
            // Inbound by xDS: `virtualInbound`'s chains decide mesh TLS, RBAC and where to.
            let snapshot = xds.snapshot();
            return Box::pin(self.xds_inbound(config, downstream, hop, snapshot)).await;
        }
        if let Some(leg) = mesh::leg(&self.mesh, config, route, destination) {
            // Boxed (by `mesh`): only connections that meet mesh TLS carry its state.
            return self.mesh(config, downstream, hop, mode, leg).await;
        }
        // One call site for the copy: each `.await` of it would get its own slot in this
        // future, and the copy is what every TCP connection holds for its whole life.
        let (prefix, upstream) = match mode {
            Mode::Tcp => (BytesMut::new(), None),
            Mode::Http | Mode::Auto => {
                // On the heap, and freed when detection ends: a long-lived connection does not
                // keep paying for the detection and connect futures.
                let watch_server = mode == Mode::Auto;
                let wait = detect_wait(config, watch_server);
                let detecting =
                    Box::pin(self.detect(&mut downstream, hop, watch_server, wait, None));
                match detecting.await.declared(mode) {
                    Detected::Tcp(prefix, upstream) | Detected::Tls(prefix, upstream) => {
                        (prefix, upstream)
                    }
                    Detected::ClientFailed => {
                        return refused(Some(destination), End::DownstreamReset);
                    }
                    Detected::Http(version, prefix, early) => {
                        // The HTTP path lives on the heap: it is larger than the TCP path and
                        // every TCP connection would otherwise pay for it.
                        let downstream = Downstream::Plain(downstream);
                        let http = (version, prefix, early);
                        let served = Box::pin(self.http(config, downstream, hop, http, None, None));
                        return served.await;
                    }
                }
            }
        };
        // Proxied as TCP, with no mesh peer to learn: Istio's open is counted now, for an
        // unknown peer, and every outcome below says so.
        let _ = self.metrics.direction(dir).istio_opened(None);
        if let Some(denied) = self.tcp_denied(&hop, None, || authorize::tls_sni(&prefix)) {
            return denied.counted_in(IstioOpen::Unknown);
        }
        let upstream = match upstream {
            Some(up) => up,
            // Boxed: the connect future is only needed until the handshake, and a long-lived
            // connection should not keep its memory inline for the copy's whole life.
            None => Box::pin(self.dial(&hop)).await,
        };
        let copied = self.tcp(&hop, &downstream, &prefix, upstream).await;
        copied.counted_in(IstioOpen::Unknown)
    }

    /// Copy opaque bytes, after the `prefix` detection read, over the upstream connection
    /// detection opened or (`None`) a new one.
    async fn tcp(
        &self,
        hop: &Hop,
        downstream: &TcpStream,
        prefix: &[u8],
        upstream: Result<Upstream, ConnectError>,
    ) -> Outcome {
        let upstream = match upstream {
            Ok(up) => up,
            Err(e) => return self.connect_failed(hop, e, downstream),
        };
        let copied =
            tcp::copy_bidirectional_after(prefix, downstream, &upstream.stream, hop.idle).await;
        copy_outcome(hop, copied, downstream, &upstream.stream)
    }

    /// Open the hop's upstream connection (the future is `connect`'s own, no bigger).
    fn dial(
        &self,
        hop: &Hop,
    ) -> impl std::future::Future<Output = Result<Upstream, ConnectError>> + '_ {
        connect::connect(
            hop.destination,
            hop.source,
            hop.timeout,
            hop.dir,
            &self.loop_guard,
        )
    }

    /// The upstream connection failed: the client is closed at once, with a reset, since the
    /// destination refused or never answered, and a clean FIN would look like an empty but
    /// successful exchange.
    fn connect_failed(&self, hop: &Hop, e: ConnectError, downstream: &TcpStream) -> Outcome {
        self.metrics.direction(hop.dir).connect_failures.inc();
        tracing::debug!(peer = %hop.peer, error = %e, direction = hop.dir.as_str(), "upstream connect failed");
        reset(downstream);
        let end = match e {
            ConnectError::Timeout { .. } => End::ConnectTimeout,
            ConnectError::Io { .. } => End::ConnectFailed,
        };
        refused(Some(hop.destination), end)
    }
}

impl Proxy {
    /// Serve a connection detected as HTTP; `mesh_peer` is the client's sidecar when mesh TLS
    /// was terminated, `originate` how requests reach a mesh destination.
    async fn http(
        self: &Arc<Self>,
        config: &Arc<Config>,
        downstream: Downstream,
        hop: Hop,
        (version, prefix, early): (
            HttpVersion,
            BytesMut,
            Option<Result<Upstream, ConnectError>>,
        ),
        mesh_peer: Option<Arc<crate::tls::Peer>>,
        originate: Option<Box<http::originate::Originate>>,
    ) -> Outcome {
        let (end, transfer) = http::serve(
            Arc::clone(self),
            Arc::clone(config),
            http::Connection {
                downstream,
                mesh_peer,
                peer: hop.peer,
                direction: hop.dir,
                destination: hop.destination,
                source: hop.source,
                connect_timeout: hop.timeout,
                version,
                prefix,
                early,
                originate,
                xds_routes: None,
                xds_chain: Default::default(),
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

/// The upstream hop of one connection.
#[derive(Debug, Clone, Copy)]
struct Hop {
    dir: Direction,
    peer: SocketAddr,
    destination: SocketAddr,
    source: Option<connect::Source>,
    timeout: Duration,
    /// How long an opaque stream may go without a byte before it is closed.
    idle: Option<Duration>,
}

/// Whether to detect, and how, from the listener and the destination port's declaration.
fn mode(config: &Config, route: &Route, destination: SocketAddr) -> Mode {
    match route {
        Route::Fixed(l) => match l.protocol {
            ListenerProtocol::Tcp => Mode::Tcp,
            ListenerProtocol::Http => Mode::Http,
            // Decided by the xDS listener's chains, not here.
            ListenerProtocol::Auto | ListenerProtocol::Xds => Mode::Auto,
        },
        Route::Capture(_) => match config.declared_protocol(destination.port()) {
            Some(p) if p.is_http() => Mode::Http,
            Some(_) => Mode::Tcp,
            None => Mode::Auto,
        },
    }
}

/// The source address and connect timeout for the upstream hop.
fn upstream_settings(
    config: &Config,
    route: &Route,
    peer: SocketAddr,
    destination: SocketAddr,
) -> (Option<connect::Source>, Duration) {
    match route {
        Route::Capture(Direction::Outbound) => (None, config.outbound.connect_timeout),
        // Nothing captures an explicit listener's upstream hop: any source will do.
        Route::Fixed(_) => match route.direction() {
            Direction::Outbound => (None, config.outbound.connect_timeout),
            Direction::Inbound => (None, config.inbound.connect_timeout),
        },
        Route::Capture(Direction::Inbound) => {
            let source = match config.inbound.interception_mode {
                // Delivered from the passthrough source, which the capture rules let through;
                // from any other address the hop would be captured into 15006 again.
                InterceptionMode::Redirect => connect::Source::Local(match destination {
                    SocketAddr::V4(_) => IpAddr::V4(config.inbound.passthrough_source_v4),
                    SocketAddr::V6(_) => IpAddr::V6(config.inbound.passthrough_source_v6),
                }),
                // TPROXY rules do not capture the proxy's marked traffic, and the application
                // sees the client as it would without a sidecar.
                InterceptionMode::Tproxy => connect::Source::Transparent {
                    ip: peer.ip(),
                    mark: config.inbound.tproxy_mark,
                },
            };
            (Some(source), config.inbound.connect_timeout)
        }
    }
}

impl Outcome {
    /// This outcome, for a connection counted open in Istio's metrics as `istio` says.
    fn counted_in(mut self, istio: IstioOpen) -> Outcome {
        self.istio = istio;
        self
    }

    /// This outcome, for a connection routed by xDS with these facts.
    fn with_xds(mut self, facts: crate::access_log::XdsFacts) -> Outcome {
        self.xds = Some(Box::new(facts));
        self
    }

    /// This outcome, logged by its chain's loggers (`chain`), or by `listener`'s when no
    /// chain took the connection.
    fn logged_by(
        mut self,
        chain: Option<Loggers>,
        listener: Option<&remora_xds::model::listener::Listener>,
    ) -> Outcome {
        self.log = chain
            .unwrap_or_else(|| listener.map_or(Loggers::None, |l| Loggers::xds(&l.access_log)));
        self
    }
}

fn refused(destination: Option<SocketAddr>, end: End) -> Outcome {
    Outcome {
        destination,
        transfer: Transfer::default(),
        end,
        http: false,
        istio: IstioOpen::Pending,
        xds: None,
        log: Loggers::None,
    }
}

/// How a copy ended. An error resets both sockets (the plaintext copy has already; a TLS
/// stream's sockets have not); an idle connection is closed, not reset.
fn copy_outcome(
    hop: &Hop,
    copied: Result<Transfer, CopyError>,
    downstream: &TcpStream,
    upstream: &TcpStream,
) -> Outcome {
    let (transfer, end) = match copied {
        Ok(t) => {
            // With the bytes each way: which hop of a chain held a stream's bytes shows here.
            tracing::debug!(
                peer = %hop.peer, destination = %hop.destination, sent = t.sent,
                received = t.received, "connection ended"
            );
            (t, End::Closed)
        }
        Err(e @ CopyError::Idle { .. }) => {
            tracing::debug!(peer = %hop.peer, destination = %hop.destination, error = %e, "closed an idle connection");
            (e.transfer(), End::IdleTimeout)
        }
        Err(e @ CopyError::Stopped { .. }) => {
            tracing::info!(peer = %hop.peer, destination = %hop.destination, "closed a connection whose filter chain an xDS update changed or removed: its drain time ran out");
            (e.transfer(), End::FilterChainRemoved)
        }
        Err(e) => {
            let t = e.transfer();
            tracing::debug!(
                peer = %hop.peer, destination = %hop.destination, error = %e, sent = t.sent,
                received = t.received, "connection ended with an error"
            );
            reset(downstream);
            reset(upstream);
            let end = match e {
                CopyError::Upstream { .. } => End::UpstreamReset,
                CopyError::Downstream { .. }
                | CopyError::Idle { .. }
                | CopyError::Stopped { .. } => End::DownstreamReset,
            };
            (e.transfer(), end)
        }
    };
    Outcome {
        destination: Some(hop.destination),
        transfer,
        end,
        http: false,
        istio: IstioOpen::Pending,
        xds: None,
        log: Loggers::None,
    }
}

/// Make the close of `stream` a reset. Failure means the peer is already gone.
fn reset(stream: &TcpStream) {
    let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

#[cfg(test)]
mod tests;
