//! HTTP/1.1 and HTTP/2 (cleartext) through the sidecar, to the connection's original
//! destination.
//!
//! A detected connection is served by hyper's server ([`serve`]); each request goes through the
//! phases of [`forward`]: check and prepare the request, send it upstream on a pooled connection
//! ([`pool`]) with Istio's retry policy ([`retry`]), then prepare the response, or answer
//! locally with Envoy's status, flag and (for gRPC) `grpc-status` ([`errors`]). Bodies stream
//! ([`body`]); the end of a response body ends the request: pool check-in and the access-log
//! line ([`access_log`]). The upstream speaks the client's HTTP version, as Envoy does with
//! `USE_DOWNSTREAM_PROTOCOL`.

pub mod access_log;
mod authorize;
pub mod body;
pub mod body_pace;
pub mod coalesce;
pub mod cors_stats;
pub mod counting;
mod drive;
pub mod errors;
pub mod ext_authz;
pub mod fault;
pub mod forward;
pub mod framing;
pub mod h1;
pub mod h2_server;
pub mod header_format;
pub mod headers;
pub mod io;
pub mod mirror;
pub mod originate;
pub mod pool;
pub mod premature_reset;
pub mod protocol;
pub mod replies;
pub mod retry;
pub mod retry_policy;
pub mod routed;
pub mod send_budget;
pub mod stream_capacity;
pub mod upgrade;

use crate::access_log::End;
use crate::connect::Upstream;
use crate::detect::HttpVersion;
use crate::proxy::Proxy;
use crate::tcp::Transfer;
use crate::Direction;
use bytes::BytesMut;
use coalesce::Coalesced;
use errors::Flags;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use remora_config::Config;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What of its HTTP connection manager a connection routed by xDS keeps for each request.
#[derive(Debug, Clone, Default)]
pub struct XdsChainFlags {
    /// The chain has Envoy's fault filter, without which a route's fault config injects
    /// nothing (as in Envoy).
    pub fault_filter: bool,
    /// The connection manager's stat prefix, for its fault filter's statistics (with it).
    pub fault_stats: Option<Arc<str>>,
    /// The connection manager's stat prefix, for its cors filter's statistics (with it).
    pub cors_stats: Option<Arc<str>>,
    /// The chain has Envoy's cors filter, without which a route's CORS policy does nothing
    /// (as in Envoy).
    pub cors_filter: bool,
    /// `normalize_path` (istiod's `true`): an outbound path is normalised before it is routed
    /// and sent, as Envoy's connection manager does (inbound paths always are, as the config
    /// file's `authorization.path_normalization` says).
    pub normalize_path: bool,
    /// The `server` header of every response, as Envoy's connection manager writes it over
    /// the upstream's (`server_name`, istiod's `istio-envoy`; Envoy's own `envoy` when unset).
    pub server: Option<http::HeaderValue>,
    /// `http2_protocol_options.max_concurrent_streams` (istiod writes it only from a
    /// ProxyConfig's `connectionSettings`): the HTTP/2 stream limit in place of
    /// `http.max_concurrent_streams`.
    pub max_concurrent_streams: Option<u32>,
    /// Outbound: the filter chain that took the connection, drained when an xDS update
    /// changes or removes it (inbound, `Connection::xds_inbound` is that chain).
    pub chain: Option<crate::route::ChainRef>,
}

impl XdsChainFlags {
    pub fn of(chain: &remora_xds::model::listener::HttpChain) -> XdsChainFlags {
        let server = chain.server_name.as_deref().unwrap_or("envoy");
        XdsChainFlags {
            fault_filter: chain.has_fault_filter(),
            fault_stats: chain
                .has_fault_filter()
                .then(|| Arc::clone(&chain.stat_prefix)),
            cors_filter: chain.has_cors_filter(),
            cors_stats: chain
                .has_cors_filter()
                .then(|| Arc::clone(&chain.stat_prefix)),
            normalize_path: chain.normalize_path,
            server: http::HeaderValue::try_from(server).ok(),
            max_concurrent_streams: chain.http2_max_concurrent_streams,
            chain: None,
        }
    }
}

/// Everything the requests of one downstream connection share.
#[derive(Debug)]
pub struct ConnContext {
    pub proxy: Arc<Proxy>,
    /// The config snapshot the connection started with.
    pub config: Arc<Config>,
    pub direction: Direction,
    pub peer: SocketAddr,
    /// Destination, source and HTTP version of the upstream connections.
    pub key: pool::Key,
    pub connect_timeout: Duration,
    /// The client's sidecar and our own identity, when mesh TLS was terminated.
    pub mesh_peer: Option<(Arc<crate::tls::Peer>, crate::identity::SpiffeId)>,
    /// The server name the client's TLS asked for, when mesh TLS was terminated.
    pub sni: Option<Box<str>>,
    /// Outbound to a mesh destination: requests go inside mesh TLS, on this connection's own.
    pub originate: Option<Box<originate::Originate>>,
    /// Routed by xDS: each request is routed by this table and balanced ([`routed`]).
    pub xds_routes: Option<Box<remora_xds::model::listener::RouteSource>>,
    /// Routed by xDS: what of its connection manager each request needs.
    pub xds_chain: XdsChainFlags,
    /// Inbound by xDS: the `virtualInbound` chain that took the connection, whose HTTP RBAC
    /// filters decide each request (the policy files do not).
    pub xds_inbound: Option<crate::route::ChainRef>,
    /// Routed by xDS: the watch on the connection's filter chain, which an update may retire
    /// (drained: told to go, then closed after `drain.drain_time`).
    pub chain_watch: Option<crate::chain_drain::Watch>,
    /// The client's sidecar as its metadata headers described it (mesh TLS terminated).
    described_client: std::sync::OnceLock<Arc<crate::tls::Peer>>,
    in_flight: AtomicUsize,
    /// Requests started on this connection.
    started: AtomicU64,
    /// The position (from 1) of the first HTTP/1.1 request head refused in its raw bytes
    /// (`framing::RefusedHead`); 0 while there is none. Set by the downstream IO when the
    /// head's last byte is read, before hyper can parse it.
    refused_head: std::sync::OnceLock<framing::RefusedHead>,
    /// The position of a request whose body was cut for its pace and answered 408 by the
    /// downstream IO (0: none), so that the request is recorded with that status.
    body_cut: AtomicU64,
    /// Bytes read from the client; with `bytes_out`, also what tells an idle connection.
    bytes_in: AtomicU64,
    /// Bytes written to the client.
    bytes_out: AtomicU64,
    /// Requests finished on this connection.
    served: AtomicU64,
    /// Draining: HTTP/1.1 responses carry `Connection: close` from now on.
    closing: AtomicBool,
    /// Woken when the connection's first request starts: an HTTP/2 connection that has had none
    /// when draining starts gets its GOAWAY then ([`drive`]).
    first_request: tokio::sync::Notify,
    /// The Istio series this connection's last request was counted in.
    series: crate::metrics::SeriesCache,
    /// Routed by xDS: what the last request's route decision found, for the next.
    route_memo: routed::memo::RouteMemo,
    /// The connect detection started failed: that was the first request's first attempt, as
    /// it would have been had the request dialled it (Envoy's router dials only then).
    early_failed: AtomicBool,
    /// Whether, and how, each request is logged: the config file's access log, or the one the
    /// xDS listeners ask for ([`Proxy::access_log_sink`]).
    log_sink: Option<crate::access_log::Sink>,
    /// HTTP/2: streams the client reset early, against Rapid Reset ([`premature_reset`]).
    pub resets: premature_reset::PrematureResets,
    /// HTTP/2: the response bytes queued for the client over all streams
    /// ([`send_budget`]); unset on HTTP/1.1.
    send_budget: std::sync::OnceLock<Arc<send_budget::SendBudget>>,
}

impl ConnContext {
    /// A connection with nothing counted yet, and no mesh peer.
    fn new(
        proxy: Arc<Proxy>,
        config: Arc<Config>,
        direction: Direction,
        peer: SocketAddr,
        key: pool::Key,
        connect_timeout: Duration,
    ) -> Self {
        ConnContext {
            log_sink: proxy.access_log_sink(&config),
            proxy,
            config,
            direction,
            peer,
            key,
            connect_timeout,
            mesh_peer: None,
            sni: None,
            originate: None,
            xds_routes: None,
            xds_chain: Default::default(),
            xds_inbound: None,
            chain_watch: None,
            described_client: std::sync::OnceLock::new(),
            in_flight: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            refused_head: std::sync::OnceLock::new(),
            body_cut: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            served: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            first_request: tokio::sync::Notify::new(),
            series: crate::metrics::SeriesCache::default(),
            route_memo: routed::memo::RouteMemo::default(),
            early_failed: AtomicBool::new(false),
            resets: premature_reset::PrematureResets::default(),
            send_budget: std::sync::OnceLock::new(),
        }
    }

    /// A plaintext outbound HTTP/1.1 connection from `peer` to `destination` (tests).
    #[cfg(test)]
    pub fn for_tests(proxy: Arc<Proxy>, destination: SocketAddr, peer: SocketAddr) -> Self {
        let config = proxy.config.load_full();
        let key = pool::Key {
            destination,
            source: None,
            version: HttpVersion::Http1,
            tls: 0,
        };
        let timeout = Duration::from_secs(1);
        ConnContext::new(proxy, config, Direction::Outbound, peer, key, timeout)
    }

    /// Resolves once this connection should wind down for draining: inbound only (outbound
    /// keeps serving while draining: the application may still need its peers).
    async fn drain_started(&self) {
        match self.direction {
            Direction::Inbound => self.proxy.drain.started().await,
            Direction::Outbound => std::future::pending().await,
        }
    }

    /// Open a new upstream connection to the destination.
    async fn connect_upstream(&self) -> Result<Upstream, errors::ProxyError> {
        let dst = self.key.destination;
        tracing::debug!(%dst, version = ?self.key.version, "opening an upstream HTTP connection");
        crate::connect::connect(
            dst,
            self.key.source,
            self.connect_timeout,
            self.direction,
            &self.proxy.loop_guard,
        )
        .await
        .map_err(|e| {
            let kind = match e {
                crate::connect::ConnectError::Timeout { .. } => errors::ErrorKind::ConnectTimeout,
                crate::connect::ConnectError::Io { .. } => errors::ErrorKind::ConnectFailed,
            };
            errors::ProxyError::new(kind, dst, e)
        })
    }

    /// Count a request in; returns its position on the connection (from 1).
    fn request_started(&self) -> u64 {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let position = self.started.fetch_add(1, Ordering::Relaxed) + 1;
        if position == 1 {
            // A permit: kept if nothing waits yet.
            self.first_request.notify_one();
        }
        position
    }

    /// Resolves once the connection's first request has started.
    async fn first_request_started(&self) {
        if self.started.load(Ordering::Relaxed) == 0 {
            self.first_request.notified().await;
        }
    }

    /// Whether no request is in flight.
    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0
    }

    /// The HTTP/1.1 request head at `head.position` is refused (the IO saw its raw bytes).
    fn refuse_head(&self, head: framing::RefusedHead) {
        // Only the first: the IO inspects nothing after it.
        let _ = self.refused_head.set(head);
    }

    /// The head of the request at `position`, if its raw bytes were refused. HTTP/1.1
    /// requests are served in order, so the IO's count of heads and ours of requests agree.
    fn refused(&self, position: u64) -> Option<&framing::RefusedHead> {
        self.refused_head.get().filter(|h| h.position == position)
    }

    /// The request at `position` had its body cut for its pace and the client was answered 408.
    fn cut_body(&self, position: u64) {
        self.body_cut.store(position, Ordering::Relaxed);
    }

    /// Whether the request at `position` is the one whose body was cut and answered 408.
    fn body_was_cut(&self, position: u64) -> bool {
        self.body_cut.load(Ordering::Relaxed) == position
    }

    fn request_ended(&self) {
        self.served.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether responses should tell HTTP/1.1 clients to close (the proxy is draining).
    fn closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// Whether the connect detection started failed, told to the first request that asks:
    /// that connect was its first attempt.
    fn take_early_failure(&self) -> bool {
        self.early_failed.load(Ordering::Relaxed)
            && self.early_failed.swap(false, Ordering::Relaxed)
    }

    fn count_received(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn count_sent(&self, n: usize) {
        self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(budget) = self.send_budget.get() {
            budget.written(n);
        }
    }

    /// The bytes the connection carried so far.
    fn transfer(&self) -> Transfer {
        Transfer {
            sent: self.bytes_in.load(Ordering::Relaxed),
            received: self.bytes_out.load(Ordering::Relaxed),
        }
    }

    fn activity(&self) -> u64 {
        self.bytes_in.load(Ordering::Relaxed) + self.bytes_out.load(Ordering::Relaxed)
    }

    /// Pool `sender` again, for `idle` (a routed request's cluster's) or Remora's
    /// `http.pool_idle_timeout`.
    fn return_to_pool(&self, key: pool::Key, sender: pool::Sender, idle: Option<Duration>) {
        if let Some(originate) = &self.originate {
            // A client's own HTTP/2 mesh connection: its handle stays with the client.
            if !matches!(sender, pool::Sender::Http1(..)) {
                return;
            }
            originate.checkin(self, sender);
            return;
        }
        let http = &self.config.http;
        self.proxy.pool.checkin(
            key,
            sender,
            idle.unwrap_or(http.pool_idle_timeout),
            http.pool_max_idle_per_upstream,
        );
    }

    /// The other side's sidecar for Istio's labels: the client's when mesh TLS was terminated,
    /// the server's on a mesh connection we originated.
    fn metrics_peer(&self) -> Option<Arc<crate::tls::Peer>> {
        match (&self.mesh_peer, &self.originate) {
            (Some((peer, _)), _) => Some(Arc::clone(self.described_client.get().unwrap_or(peer))),
            (None, Some(originate)) => originate.server(),
            (None, None) => None,
        }
    }

    /// What the client's sidecar said of itself in a request's `x-envoy-peer-metadata` value:
    /// only a client that proved its identity with mesh TLS is believed, and the first
    /// description that decodes stands (later ones are not decoded).
    fn learn_client_value(&self, value: &[u8]) {
        let Some((peer, _)) = &self.mesh_peer else {
            return;
        };
        if self.described_client.get().is_some() {
            return;
        }
        if let Some(metadata) = crate::metadata_exchange::http::decode_value(value) {
            let _ = self.described_client.set(Arc::new(crate::tls::Peer {
                metadata: Some(Arc::new(metadata)),
                ..crate::tls::Peer::clone(peer)
            }));
        }
    }

    fn write_log(&self, log: access_log::RequestLog, flags: Flags, sent: u64) {
        if let Some(sink) = &self.log_sink {
            let conn = (self.peer, self.key.destination, self.sni.as_deref());
            let line = log.line(flags, sent, &sink.format, conn);
            self.proxy.access_log.log_line(line, sink);
        }
    }

    fn logging(&self) -> bool {
        self.log_sink.is_some()
    }

    /// A request's log record, keeping what the log's format reads of its headers.
    fn request_log(
        &self,
        start: (std::time::SystemTime, std::time::Instant),
        parts: (&http::Method, &http::Uri, http::Version, &http::HeaderMap),
    ) -> Box<access_log::RequestLog> {
        let (m, u, v, h) = parts;
        let mut log = access_log::RequestLog::new(start, m, u, v, h);
        if let Some(sink) = &self.log_sink {
            log.keep_headers(&sink.format, h);
        }
        Box::new(log)
    }

    /// Whether the log's format prints this side of the upstream connection.
    fn log_wants_upstream_local(&self) -> bool {
        self.log_sink.as_ref().is_some_and(|s| s.upstream_local)
    }

    /// Whether the log's format reads request headers the HTTP/1.1 fast path does not keep
    /// (an Envoy format's `%REQ(…)%` of another header): hyper's path serves those requests.
    fn log_reads_other_headers(&self) -> bool {
        matches!(&self.log_sink, Some(crate::access_log::Sink {
            format: crate::access_log::LineFormat::Envoy(f), ..
        }) if !f.extra_request_headers.is_empty())
    }
}

/// Where a detected HTTP connection goes and how it got here.
#[derive(Debug)]
pub struct Connection {
    /// The client's socket, or mesh TLS terminated on it.
    pub downstream: crate::tls::stream::Downstream,
    /// The client's sidecar, when mesh TLS was terminated: x-forwarded-client-cert names it.
    pub mesh_peer: Option<Arc<crate::tls::Peer>>,
    pub peer: SocketAddr,
    pub direction: Direction,
    pub destination: SocketAddr,
    /// Source address of upstream connections (the inbound passthrough source).
    pub source: Option<crate::connect::Source>,
    pub connect_timeout: Duration,
    pub version: HttpVersion,
    /// The bytes detection read, replayed to the HTTP server.
    pub prefix: BytesMut,
    /// The upstream connection opened during detection: the first pooled one, or, failed,
    /// the first request's first attempt.
    pub early: Option<Result<Upstream, crate::connect::ConnectError>>,
    /// Outbound to a mesh destination: how requests go there (it holds the early socket).
    pub originate: Option<Box<originate::Originate>>,
    /// Routed by xDS: the chain's route table, by which each request is routed and balanced.
    pub xds_routes: Option<Box<remora_xds::model::listener::RouteSource>>,
    /// Routed by xDS: what of its connection manager each request needs.
    pub xds_chain: XdsChainFlags,
    /// Inbound by xDS: the chain whose HTTP RBAC filters decide each request.
    pub xds_inbound: Option<crate::route::ChainRef>,
}

/// Serve HTTP on a detected connection until it closes; how it ended and the bytes it carried
/// (to upstream: read from the client; from upstream: written to it). Plain HTTP/1.1 starts on
/// the fast path ([`h1`]); hyper serves everything else, and what the fast path hands over.
pub async fn serve(proxy: Arc<Proxy>, config: Arc<Config>, c: Connection) -> (End, Transfer) {
    let key = pool::Key {
        destination: c.destination,
        source: c.source,
        version: c.version,
        tls: 0,
    };
    // Routed by xDS or not: the fast path routes and balances each request as hyper's does.
    let fast = c.version == HttpVersion::Http1 && config.http.fast_path;
    let (mut early, early_failed) = match c.early {
        Some(Ok(up)) => (Some(up), false),
        Some(Err(e)) => {
            tracing::debug!(error = %e, "upstream connection opened during detection failed");
            (None, true)
        }
        None => (None, false),
    };
    if !fast {
        if let Some(up) = early.take() {
            Box::pin(pool_early(&proxy, &config, key, up)).await;
        }
    }
    let mesh_peer = c.mesh_peer.and_then(|peer| {
        let ours = proxy.mesh.identity.current()?.spiffe_id.clone();
        Some((peer, ours))
    });
    let sni = match &c.downstream {
        crate::tls::stream::Downstream::Mesh(tls) => tls.get_ref().1.server_name().map(Into::into),
        crate::tls::stream::Downstream::Plain(_) => None,
    };
    let chain_watch = proxy.watch_chain(c.xds_inbound.as_ref().or(c.xds_chain.chain.as_ref()));
    let ctx = Arc::new(ConnContext {
        mesh_peer,
        sni,
        chain_watch,
        originate: c.originate,
        xds_routes: c.xds_routes,
        xds_chain: c.xds_chain,
        xds_inbound: c.xds_inbound,
        early_failed: AtomicBool::new(early_failed),
        ..ConnContext::new(proxy, config, c.direction, c.peer, key, c.connect_timeout)
    });
    let (downstream, prefix) = if fast {
        let mut downstream = c.downstream;
        let served = match &mut downstream {
            crate::tls::stream::Downstream::Plain(stream) => {
                h1::serve(&ctx, stream, c.prefix, early).await
            }
            crate::tls::stream::Downstream::Mesh(tls) => {
                h1::serve(&ctx, &mut **tls, c.prefix, early).await
            }
        };
        match served {
            h1::Served::Ended(result) => {
                let end = match result {
                    Ok(()) => End::Closed,
                    Err(e) => {
                        tracing::debug!(peer = %ctx.peer, error = %e, "HTTP connection ended with an error");
                        End::DownstreamReset
                    }
                };
                return (end, ctx.transfer());
            }
            h1::Served::HandOff { prefix, early } => {
                tracing::trace!(peer = %ctx.peer, "HTTP/1.1 connection handed to the general server");
                if let Some(up) = early {
                    Box::pin(pool_early(&ctx.proxy, &ctx.config, key, up)).await;
                }
                (downstream, prefix)
            }
        }
    } else {
        (c.downstream, c.prefix)
    };
    // Boxed: a connection the fast path serves should not carry room for hyper's state.
    let result = Box::pin(serve_hyper(&ctx, downstream, prefix)).await;
    let transfer = ctx.transfer();
    match result {
        Ok(()) => (End::Closed, transfer),
        Err(e) => {
            tracing::debug!(peer = %ctx.peer, error = %e, "HTTP connection ended with an error");
            replies::record_refused_head(&ctx, &e);
            (End::DownstreamReset, transfer)
        }
    }
}

/// Pool the upstream connection detection opened, for hyper's client.
async fn pool_early(proxy: &Arc<Proxy>, config: &Config, key: pool::Key, up: Upstream) {
    match pool::handshake(up, key.version).await {
        Ok(sender) => proxy.pool.checkin(
            key,
            sender,
            config.http.pool_idle_timeout,
            config.http.pool_max_idle_per_upstream,
        ),
        Err(e) => {
            tracing::debug!(error = %e, destination = %key.destination, "early upstream connection unusable")
        }
    }
}

/// Serve the connection with hyper's server until it ends.
async fn serve_hyper(
    ctx: &Arc<ConnContext>,
    downstream: crate::tls::stream::Downstream,
    prefix: BytesMut,
) -> Result<(), hyper::Error> {
    let version = ctx.key.version;
    let io = io::DownstreamIo::new(
        prefix,
        downstream,
        Arc::clone(ctx),
        version == HttpVersion::Http1,
    );
    // HTTP/2: every stream's response within the connection's budget.
    let budget = (version == HttpVersion::Http2)
        .then(|| Arc::clone(ctx.send_budget.get_or_init(Default::default)));
    let service = {
        let ctx = Arc::clone(ctx);
        // Boxed: hyper's HTTP/1.1 server allocates room for one service future per connection
        // up front and keeps it while the connection idles; a request's state (several KiB)
        // should cost memory only while the request runs.
        service_fn(move |req| {
            let ctx = Arc::clone(&ctx);
            let budget = budget.clone();
            Box::pin(async move {
                let mut response = forward::handle(Arc::clone(&ctx), req).await;
                // Every response, the upstream's and our own, as Envoy's connection manager
                // writes it (`server_name`; a connection not routed by xDS has none).
                if let (Ok(r), Some(server)) = (&mut response, &ctx.xds_chain.server) {
                    r.headers_mut().insert(http::header::SERVER, server.clone());
                }
                response.map(|r| r.map(|body| send_budget::Budgeted::new(body, budget)))
            })
        })
    };
    let http = &ctx.config.http;
    match version {
        // Each connection is built inside the call that drives it: a builder or a connection
        // held in a local would keep its own room in this future for the connection's life.
        HttpVersion::Http1 => {
            let conn = |io, service| {
                let mut builder = http1::Builder::new();
                // The header read timeout is the IO's: hyper's would also bound the idle time
                // between requests, which is `http.idle_timeout`'s.
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(None)
                    .max_header_size(http.max_header_bytes)
                    // hyper's default (about 400 KiB) would let a client that does not read
                    // hold that much of a response here per connection.
                    .max_buf_size(downstream_h1_buffer(http.max_header_bytes))
                    // As Envoy's parser: `GET /a  HTTP/1.1` is served, and goes on with one space.
                    .allow_multiple_spaces_in_request_line_delimiters(true);
                // hyper's default is 100 on the stack; another number costs a heap allocation.
                if http.max_headers != 100 {
                    builder.max_headers(http.max_headers);
                }
                builder.serve_connection(io, service).with_upgrades()
            };
            drive::drive(conn(TokioIo::new(io), service), ctx, |c| {
                c.graceful_shutdown()
            })
            .await
        }
        HttpVersion::Http2 => {
            let streams = ctx
                .xds_chain
                .max_concurrent_streams
                .unwrap_or(http.max_concurrent_streams);
            let conn = h2_server::builder(streams, http.max_header_bytes)
                .serve_connection(TokioIo::new(Coalesced::new(io)), service);
            drive::drive(conn, ctx, |c| c.graceful_shutdown()).await
        }
    }
}

/// The most an HTTP/1.1 client connection on hyper's path buffers either way (hyper's
/// `max_buf_size`, its read buffer and its queue of response bytes not yet written): what a
/// client that reads slowly can make Remora hold, as Envoy's `per_connection_buffer_limit_bytes`
/// bounds it. 64 KiB keeps a stream at full speed (it is four times the largest TLS record),
/// and is room for the largest request head `http.max_header_bytes` allows, plus a read.
const DOWNSTREAM_H1_BUFFER: usize = 64 * 1024;

fn downstream_h1_buffer(max_header_bytes: usize) -> usize {
    DOWNSTREAM_H1_BUFFER.max(max_header_bytes.saturating_add(8 * 1024))
}
