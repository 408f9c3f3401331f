//! What the requests of one downstream connection share ([`ConnContext`]): its proxy,
//! config and route, its counters (bytes, requests, the head refused in its raw bytes), and
//! the access-log and pool hand-offs each request's end makes through it.

use super::{
    access_log, errors, framing, originate, pool, premature_reset, routed, send_budget,
    XdsChainFlags,
};
use crate::connect::Upstream;
use crate::proxy::Proxy;
use crate::tcp::Transfer;
use crate::Direction;
use errors::Flags;
use remora_config::Config;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    pub(super) described_client: std::sync::OnceLock<Arc<crate::tls::Peer>>,
    pub(super) in_flight: AtomicUsize,
    /// Requests started on this connection.
    pub(super) started: AtomicU64,
    /// The position (from 1) of the first HTTP/1.1 request head refused in its raw bytes
    /// (`framing::RefusedHead`); 0 while there is none. Set by the downstream IO when the
    /// head's last byte is read, before hyper can parse it.
    pub(super) refused_head: std::sync::OnceLock<framing::RefusedHead>,
    /// The position of a request whose body was cut for its pace and answered 408 by the
    /// downstream IO (0: none), so that the request is recorded with that status.
    pub(super) body_cut: AtomicU64,
    /// Bytes read from the client; with `bytes_out`, also what tells an idle connection.
    pub(super) bytes_in: AtomicU64,
    /// Bytes written to the client.
    pub(super) bytes_out: AtomicU64,
    /// Requests finished on this connection.
    pub(super) served: AtomicU64,
    /// Draining: HTTP/1.1 responses carry `Connection: close` from now on.
    pub(super) closing: AtomicBool,
    /// Woken when the connection's first request starts: an HTTP/2 connection that has had none
    /// when draining starts gets its GOAWAY then ([`drive`]).
    pub(super) first_request: tokio::sync::Notify,
    /// The Istio series this connection's last request was counted in.
    pub(super) series: crate::metrics::SeriesCache,
    /// Routed by xDS: what the last request's route decision found, for the next.
    pub(super) route_memo: routed::memo::RouteMemo,
    /// The connect detection started failed: that was the first request's first attempt, as
    /// it would have been had the request dialled it (Envoy's router dials only then).
    pub(super) early_failed: AtomicBool,
    /// Which loggers each request is written to: the config file's access log, or the
    /// loggers of the connection manager of the chain that took the connection (none: no
    /// line).
    pub(super) log_sink: crate::access_log::Loggers,
    /// HTTP/2: streams the client reset early, against Rapid Reset ([`premature_reset`]).
    pub resets: premature_reset::PrematureResets,
    /// HTTP/2: the response bytes queued for the client over all streams
    /// ([`send_budget`]); unset on HTTP/1.1.
    pub(super) send_budget: std::sync::OnceLock<Arc<send_budget::SendBudget>>,
    /// Inbound by xDS: the ext_authz counters of the chain's connection manager, looked up at
    /// its first request through the filter, so that no request looks them up by name.
    pub(super) ext_authz_stats: std::sync::OnceLock<Arc<super::ext_authz::HttpCounters>>,
    /// Inbound by xDS: the RBAC counters of the chain's connection manager, looked up at its
    /// first request ([`super::authorize::rbac_counts`]).
    pub(super) rbac_stats: std::sync::OnceLock<crate::metrics::rbac_filters::ChainRbac>,
    /// Routed by xDS: the counters of the chain's connection manager (Envoy's
    /// `http.<stat_prefix>.downstream_*`), counted into as requests start and end and as the
    /// connection ends.
    pub(super) hcm: Option<Arc<crate::metrics::http_conn_manager::HcmCounters>>,
}

/// Counts the connection's end into its connection manager's statistics when dropped: held
/// by the task serving the connection, it counts however that ends (cancelled too).
pub(super) struct CountsClose<'a>(pub &'a ConnContext);

impl Drop for CountsClose<'_> {
    fn drop(&mut self) {
        let ctx = self.0;
        if let Some(hcm) = &ctx.hcm {
            // `transfer` names the bytes as the upstream side sees them.
            let Transfer { sent, received, .. } = ctx.transfer();
            hcm.connection_closed(ctx.key.version, ctx.mesh_peer.is_some(), sent, received);
        }
    }
}

impl ConnContext {
    /// A connection with nothing counted yet, and no mesh peer.
    pub(super) fn new(
        proxy: Arc<Proxy>,
        config: Arc<Config>,
        direction: Direction,
        peer: SocketAddr,
        key: pool::Key,
        connect_timeout: Duration,
    ) -> Self {
        ConnContext {
            log_sink: crate::access_log::Loggers::of_config(&config).unwrap_or_default(),
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
            ext_authz_stats: std::sync::OnceLock::new(),
            rbac_stats: std::sync::OnceLock::new(),
            hcm: None,
        }
    }

    /// A plaintext outbound HTTP/1.1 connection from `peer` to `destination` (tests).
    #[cfg(test)]
    pub fn for_tests(proxy: Arc<Proxy>, destination: SocketAddr, peer: SocketAddr) -> Self {
        let config = proxy.config.load_full();
        let key = pool::Key {
            destination,
            source: None,
            version: crate::detect::HttpVersion::Http1,
            tls: 0,
        };
        let timeout = Duration::from_secs(1);
        ConnContext::new(proxy, config, Direction::Outbound, peer, key, timeout)
    }

    /// Resolves once this connection should wind down for draining: inbound only (outbound
    /// keeps serving while draining: the application may still need its peers).
    pub(super) async fn drain_started(&self) {
        match self.direction {
            Direction::Inbound => self.proxy.drain.started().await,
            Direction::Outbound => std::future::pending().await,
        }
    }

    /// Open a new upstream connection to the destination.
    pub(super) async fn connect_upstream(&self) -> Result<Upstream, errors::ProxyError> {
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
    pub(super) fn request_started(&self) -> u64 {
        if let Some(hcm) = &self.hcm {
            hcm.request_started(self.key.version);
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let position = self.started.fetch_add(1, Ordering::Relaxed) + 1;
        if position == 1 {
            // A permit: kept if nothing waits yet.
            self.first_request.notify_one();
        }
        position
    }

    /// Resolves once the connection's first request has started.
    pub(super) async fn first_request_started(&self) {
        if self.started.load(Ordering::Relaxed) == 0 {
            self.first_request.notified().await;
        }
    }

    /// A request reached the router, which made `what` of it (`None`: it did not reach it):
    /// counted on the connection manager.
    pub(super) fn at_router(&self, what: Option<crate::metrics::http_conn_manager::Routed>) {
        if let (Some(hcm), Some(what)) = (&self.hcm, what) {
            hcm.routed(what);
        }
    }

    /// A request whose target is not a path was answered 404: counted on the connection
    /// manager.
    pub(super) fn non_relative_path(&self) {
        if let Some(hcm) = &self.hcm {
            hcm.non_relative_path();
        }
    }

    /// An upgrade its route turns off was refused: counted on the connection manager.
    pub(super) fn upgrade_refused(&self) {
        if let Some(hcm) = &self.hcm {
            hcm.upgrade_refused();
        }
    }

    /// Whether no request is in flight.
    pub(super) fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0
    }

    /// The HTTP/1.1 request head at `head.position` is refused (the IO saw its raw bytes).
    pub(super) fn refuse_head(&self, head: framing::RefusedHead) {
        // Only the first: the IO inspects nothing after it.
        let _ = self.refused_head.set(head);
    }

    /// The head of the request at `position`, if its raw bytes were refused. HTTP/1.1
    /// requests are served in order, so the IO's count of heads and ours of requests agree.
    pub(super) fn refused(&self, position: u64) -> Option<&framing::RefusedHead> {
        self.refused_head.get().filter(|h| h.position == position)
    }

    /// The request at `position` had its body cut for its pace and the client was answered 408.
    pub(super) fn cut_body(&self, position: u64) {
        self.body_cut.store(position, Ordering::Relaxed);
    }

    /// Whether the request at `position` is the one whose body was cut and answered 408.
    pub(super) fn body_was_cut(&self, position: u64) -> bool {
        self.body_cut.load(Ordering::Relaxed) == position
    }

    /// The connection is closed here, for `why`: counted on its connection manager.
    pub(super) fn closed_for(&self, why: crate::metrics::http_conn_manager::ClosedFor) {
        if let Some(hcm) = &self.hcm {
            hcm.closed_for(why);
        }
    }

    pub(super) fn request_ended(&self, status: u16) {
        if let Some(hcm) = &self.hcm {
            hcm.request_ended(status);
        }
        self.served.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether responses should tell HTTP/1.1 clients to close (the proxy is draining).
    pub(super) fn closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// Whether the connect detection started failed, told to the first request that asks:
    /// that connect was its first attempt.
    pub(super) fn take_early_failure(&self) -> bool {
        self.early_failed.load(Ordering::Relaxed)
            && self.early_failed.swap(false, Ordering::Relaxed)
    }

    pub(super) fn count_received(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(super) fn count_sent(&self, n: usize) {
        self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(budget) = self.send_budget.get() {
            budget.written(n);
        }
    }

    /// The bytes the connection carried so far.
    pub(super) fn transfer(&self) -> Transfer {
        Transfer {
            sent: self.bytes_in.load(Ordering::Relaxed),
            received: self.bytes_out.load(Ordering::Relaxed),
            ..Transfer::default()
        }
    }

    pub(super) fn activity(&self) -> u64 {
        self.bytes_in.load(Ordering::Relaxed) + self.bytes_out.load(Ordering::Relaxed)
    }

    /// Pool `sender` again, for `idle` (a routed request's cluster's) or Remora's
    /// `http.pool_idle_timeout`.
    pub(super) fn return_to_pool(
        &self,
        key: pool::Key,
        sender: pool::Sender,
        idle: Option<Duration>,
    ) {
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
    pub(super) fn metrics_peer(&self) -> Option<Arc<crate::tls::Peer>> {
        match (&self.mesh_peer, &self.originate) {
            (Some((peer, _)), _) => Some(Arc::clone(self.described_client.get().unwrap_or(peer))),
            (None, Some(originate)) => originate.server(),
            (None, None) => None,
        }
    }

    /// What the client's sidecar said of itself in a request's `x-envoy-peer-metadata` value:
    /// only a client that proved its identity with mesh TLS is believed, and the first
    /// description that decodes stands (later ones are not decoded).
    pub(super) fn learn_client_value(&self, value: &[u8]) {
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

    pub(super) fn write_log(&self, log: access_log::RequestLog, flags: Flags, sent: u64) {
        let conn = (self.peer, self.key.destination, self.sni.as_deref());
        for sink in self.log_sink.admitting(flags.names()) {
            let line = log.line(flags, sent, sink.format, conn);
            self.proxy.access_log.log_line(line, &sink);
        }
    }

    pub(super) fn logging(&self) -> bool {
        self.log_sink.is_some()
    }

    /// A request's log record, keeping what the loggers' formats read of its headers.
    pub(super) fn request_log(
        &self,
        start: (std::time::SystemTime, std::time::Instant),
        parts: (&http::Method, &http::Uri, http::Version, &http::HeaderMap),
    ) -> Box<access_log::RequestLog> {
        let (m, u, v, h) = parts;
        let mut log = access_log::RequestLog::new(start, m, u, v, h);
        for sink in self.log_sink.sinks() {
            log.keep_headers(sink.format, h);
        }
        Box::new(log)
    }

    /// Whether a logger's format prints this side of the upstream connection.
    pub(super) fn log_wants_upstream_local(&self) -> bool {
        self.log_sink.sinks().any(|s| s.upstream_local())
    }

    /// Whether the log's format reads request headers the HTTP/1.1 fast path does not keep
    /// (an Envoy format's `%REQ(…)%` of another header): hyper's path serves those requests.
    pub(super) fn log_reads_other_headers(&self) -> bool {
        self.log_sink.sinks().any(|s| {
            matches!(s.format,
                crate::access_log::LineFormat::Envoy(f) if !f.extra_request_headers.is_empty())
        })
    }
}
