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
mod conn_context;
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
pub mod internal_headers;
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
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use remora_config::Config;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

pub use conn_context::ConnContext;

/// What of its HTTP connection manager a connection routed by xDS keeps for each request.
#[derive(Debug, Clone, Default)]
pub struct XdsChainFlags {
    /// The chain has Envoy's fault filter, without which a route's fault config injects
    /// nothing (as in Envoy).
    pub fault_filter: bool,
    /// The connection manager's stat prefix, for its statistics and its fault and cors
    /// filters' ([`XdsChainFlags::fault_stats`]).
    pub stat_prefix: Option<Arc<str>>,
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
    pub max_concurrent_streams: Option<std::num::NonZeroU32>,
    /// Outbound: the filter chain that took the connection, drained when an xDS update
    /// changes or removes it (inbound, `Connection::xds_inbound` is that chain).
    pub chain: Option<crate::route::ChainRef>,
    /// The connection manager's access logs (shared with the snapshot; `None` without any).
    pub access_log: Option<Arc<[remora_xds::model::listener::AccessLog]>>,
    /// The HTTP/1.1 upgrades the connection manager allows (`upgrade_configs`), shared with
    /// the snapshot (a thin pointer: this is in every connection's state).
    pub upgrades: Option<Arc<Vec<remora_xds::model::route::Upgrade>>>,
}

impl XdsChainFlags {
    pub fn of(chain: &remora_xds::model::listener::HttpChain) -> XdsChainFlags {
        let server = chain.server_name.as_deref().unwrap_or("envoy");
        XdsChainFlags {
            fault_filter: chain.has_fault_filter(),
            stat_prefix: Some(Arc::clone(&chain.stat_prefix)),
            cors_filter: chain.has_cors_filter(),
            normalize_path: chain.normalize_path,
            server: http::HeaderValue::try_from(server).ok(),
            // Envoy's range starts at 1 (the conversion refuses 0).
            max_concurrent_streams: chain
                .http2_max_concurrent_streams
                .and_then(std::num::NonZeroU32::new),
            chain: None,
            access_log: (!chain.access_log.is_empty()).then(|| Arc::clone(&chain.access_log)),
            upgrades: Some(Arc::clone(&chain.upgrades)),
        }
    }

    /// The stat prefix of the chain's fault filter's statistics, with one.
    pub fn fault_stats(&self) -> Option<&Arc<str>> {
        self.stat_prefix.as_ref().filter(|_| self.fault_filter)
    }

    /// The stat prefix of the chain's cors filter's statistics, with one.
    pub fn cors_stats(&self) -> Option<&Arc<str>> {
        self.stat_prefix.as_ref().filter(|_| self.cors_filter)
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
pub async fn serve(proxy: Arc<Proxy>, config: Arc<Config>, mut c: Connection) -> (End, Transfer) {
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
    // The config file's access log wins; else the chain's connection manager's loggers.
    let log_sink = crate::access_log::Loggers::of_config(&config).unwrap_or_else(|| {
        c.xds_chain.access_log.take().map_or(
            crate::access_log::Loggers::None,
            crate::access_log::Loggers::Xds,
        )
    });
    // The connection manager's statistics (xDS chains), looked up once for the connection.
    let hcm = c.xds_chain.stat_prefix.as_deref().map(|prefix| {
        let counters = proxy.metrics.http_conn_managers.of(prefix);
        counters.connection_opened(c.version, mesh_peer.is_some());
        counters
    });
    let ctx = Arc::new(ConnContext {
        hcm,
        log_sink,
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
    let _counts_close = conn_context::CountsClose(&ctx);
    // What detection read from the socket is the connection's first bytes.
    ctx.count_received(c.prefix.len());
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
                .map_or(http.max_concurrent_streams, std::num::NonZeroU32::get);
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
