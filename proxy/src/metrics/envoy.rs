//! Envoy's own statistics, named as Envoy names them, for the dashboards, alerts and the Istio
//! agent that read them: dotted on the admin `/stats` page (`server.state`,
//! `listener.0.0.0.0_15001.downstream_cx_total`), and in Prometheus form as an Envoy in an
//! Istio sidecar prints them: the tags of pilot-agent's bootstrap taken out of the dotted name
//! as labels, the rest `envoy_`-prefixed (`envoy_listener_downstream_cx_total{listener_address=…}`,
//! `envoy_http_outbound_0_0_0_0_80_downstream_rq_total`; [`tags`]).
//!
//! Values are read from the data path's counters at scrape time; nothing here is on the data
//! path. Envoy counters whose names do not end in `_total` keep Envoy's exact names, which
//! queries use: they are written as gauges in OpenMetrics (where a counter's samples must end in
//! `_total`) and typed counter in the 0.0.4 text `/stats/prometheus` serves, as Envoy types them.

mod clusters;
mod control_plane;
mod filters;
mod managers;
mod tags;

use super::DirectionMetrics;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Envoy's `server.state` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ServerState {
    Live = 0,
    Draining = 1,
    PreInitializing = 2,
    Initializing = 3,
}

impl ServerState {
    /// The word Envoy's admin `/ready` and `/server_info` use.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerState::Live => "LIVE",
            ServerState::Draining => "DRAINING",
            ServerState::PreInitializing => "PRE_INITIALIZING",
            ServerState::Initializing => "INITIALIZING",
        }
    }
}

/// Process-wide facts the server stats report; set by start-up and shutdown.
#[derive(Debug)]
pub struct ServerStats {
    state: AtomicU8,
    health_check_failed: AtomicBool,
    started: Instant,
    concurrency: AtomicU32,
    listeners_active: AtomicU32,
}

impl Default for ServerStats {
    fn default() -> Self {
        ServerStats {
            state: AtomicU8::new(ServerState::PreInitializing as u8),
            health_check_failed: AtomicBool::new(false),
            started: Instant::now(),
            concurrency: AtomicU32::new(0),
            listeners_active: AtomicU32::new(0),
        }
    }
}

impl ServerStats {
    /// Record a state change.
    pub fn set_state(&self, s: ServerState) {
        self.state.store(s as u8, Ordering::Release);
    }

    /// Fail (or pass again) the health check, as Envoy's `/healthcheck/fail` and `/ok` do.
    pub fn fail_health_check(&self, failed: bool) {
        self.health_check_failed.store(failed, Ordering::Release);
    }

    /// Whether `/healthcheck/fail` is in force.
    pub fn health_check_failed(&self) -> bool {
        self.health_check_failed.load(Ordering::Acquire)
    }

    /// The current state. A live server whose health check was failed is draining, as Envoy
    /// reports it (`server.state` 1, `/ready` 503 `DRAINING`).
    pub fn state(&self) -> ServerState {
        match self.state.load(Ordering::Acquire) {
            0 if self.health_check_failed() => ServerState::Draining,
            0 => ServerState::Live,
            1 => ServerState::Draining,
            3 => ServerState::Initializing,
            _ => ServerState::PreInitializing,
        }
    }

    /// Seconds since start.
    pub fn uptime_secs(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Record the worker count and the number of bound data-path listeners.
    pub fn set_workers(&self, concurrency: u32, listeners: u32) {
        self.concurrency.store(concurrency, Ordering::Relaxed);
        self.listeners_active.store(listeners, Ordering::Relaxed);
    }
}

/// Where a stat lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Server,
    ListenerManager,
    ClusterManager,
    /// A listener, by Envoy's stat prefix for it (`0.0.0.0_15001`).
    Listener(String),
    /// A cluster by its stat name.
    Cluster(String),
    /// A filter's counters in the scope of a cluster, by the part of their names after
    /// `cluster.` (`inbound|8080||.ext_authz`: the HTTP ext_authz filter's, on the request's
    /// route cluster).
    ClusterFilter(String),
    /// An HTTP connection manager, by its stat prefix (`inbound_0.0.0.0_15006`).
    HttpConnManager(String),
    /// Istio's network RBAC filter (stat prefix `tcp.`).
    Tcp,
    /// A `tcp_proxy` filter, by its stat prefix (istiod's cluster name).
    TcpProxy(String),
    /// A network ext_authz filter, by its stat prefix (istiod's `tcp.`).
    ExtAuthz(String),
    /// An HTTP ext_authz filter, by the part of its names after `http.`
    /// (`inbound_0.0.0.0_8080.ext_authz`).
    HttpExtAuthz(String),
    /// An HTTP RBAC filter's counters under xDS, by the part of their names after `http.`
    /// (`inbound_0.0.0.0_8080.rbac`, `inbound_0.0.0.0_8080.rbac.istio_dry_run_allow_`).
    HttpRbac(String),
    /// A network RBAC filter's counters under xDS, by their names' first part (`tcp.rbac`,
    /// `tcp.rbac.istio_dry_run_allow_`).
    NetworkRbac(String),
    /// The xDS connection (`control_plane.`).
    ControlPlane,
    /// A subscription, by Envoy's prefix (`cluster_manager.cds`, `listener_manager.lds`).
    Subscription(&'static str),
    /// One SDS secret's subscription, by its stat name (`kubernetes_client-credential`).
    Secret(String),
    /// One RDS route table's subscription, in the scope of the connection manager that first
    /// names it (`http.<stat prefix>.rds.<name>.`).
    Rds {
        prefix: String,
        name: String,
    },
}

/// Counter or gauge, as Envoy types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One statistic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyStat {
    pub scope: Scope,
    pub stat: &'static str,
    /// A response code or class the name ends in (`upstream_rq` + `200`: `upstream_rq_200`),
    /// which Istio's bootstrap turns into a `response_code` or `response_code_class` tag.
    pub code: Option<String>,
    pub kind: Kind,
    pub value: u64,
}

impl EnvoyStat {
    /// A statistic whose name ends in no response code.
    pub fn new(kind: Kind, scope: Scope, stat: &'static str, value: u64) -> EnvoyStat {
        EnvoyStat {
            scope,
            stat,
            code: None,
            kind,
            value,
        }
    }

    /// The dotted name Envoy's `/stats` prints.
    pub fn dotted_name(&self) -> String {
        let name = self.scope_name();
        match &self.code {
            Some(code) => format!("{name}_{code}"),
            None => name,
        }
    }

    fn scope_name(&self) -> String {
        match &self.scope {
            Scope::Server => format!("server.{}", self.stat),
            Scope::ListenerManager => format!("listener_manager.{}", self.stat),
            Scope::ClusterManager => format!("cluster_manager.{}", self.stat),
            Scope::Listener(a) => format!("listener.{a}.{}", self.stat),
            Scope::Cluster(c) | Scope::ClusterFilter(c) => format!("cluster.{c}.{}", self.stat),
            Scope::HttpConnManager(p) => format!("http.{p}.{}", self.stat),
            Scope::Tcp => format!("tcp.{}", self.stat),
            Scope::TcpProxy(p) => format!("tcp.{p}.{}", self.stat),
            // Envoy puts a dot after the prefix even when it ends in one (`ext_authz.tcp..ok`).
            Scope::ExtAuthz(p) => format!("ext_authz.{p}.{}", self.stat),
            Scope::HttpExtAuthz(stem) | Scope::HttpRbac(stem) => {
                format!("http.{stem}.{}", self.stat)
            }
            Scope::NetworkRbac(stem) => format!("{stem}.{}", self.stat),
            Scope::ControlPlane => format!("control_plane.{}", self.stat),
            Scope::Subscription(p) => format!("{p}.{}", self.stat),
            Scope::Secret(name) => format!("sds.{name}.{}", self.stat),
            Scope::Rds { prefix, name } => format!("http.{prefix}.rds.{name}.{}", self.stat),
        }
    }

    /// The Prometheus name and labels Envoy's `/stats/prometheus` prints for this stat in an
    /// Istio sidecar ([`tags`]).
    pub(crate) fn prometheus(&self) -> (String, Vec<(&'static str, String)>) {
        tags::prometheus(&self.dotted_name())
    }
}

/// The counters behind Envoy's stats, and the names of what they describe.
#[derive(Debug, Clone)]
pub struct EnvoyStats {
    pub server: Arc<ServerStats>,
    /// Authorization decisions, for the RBAC filters' stats.
    pub authz: super::AuthzMetrics,
    /// Mesh TLS handshakes, for the inbound listener's `ssl.*` stats.
    pub tls: super::TlsMetrics,
    /// Connections refused at the connection limits, for the listeners' overflow stats.
    pub overload: super::OverloadMetrics,
    pub outbound: DirectionMetrics,
    pub inbound: DirectionMetrics,
    /// Envoy's stat prefixes of the outbound and inbound listeners.
    pub outbound_listener: String,
    pub inbound_listener: String,
    /// The ADS client's counters and what it delivered, once istiod mode starts it.
    pub control_plane: Arc<OnceLock<ControlPlane>>,
    /// The xDS clusters' state (circuit breakers, outlier detection, request counts), for
    /// their `cluster.<name>.*` stats.
    pub clusters: Arc<OnceLock<Arc<crate::upstream::Upstreams>>>,
    /// The fault filters' counters, for their `http.<prefix>.fault.*` stats.
    pub faults: Arc<crate::http::fault::FaultStats>,
    /// The cors filters' counters, for their `http.<prefix>.cors.*` stats.
    pub cors: Arc<crate::http::cors_stats::CorsStats>,
    /// The network ext_authz filters' counters, for their `ext_authz.<prefix>.*` stats.
    pub network_ext_authz: Arc<crate::http::ext_authz::network::NetworkStats>,
    /// The HTTP ext_authz filters' counters, for their `http.<prefix>.ext_authz.*` stats.
    pub http_ext_authz: Arc<crate::http::ext_authz::HttpStats>,
    /// The RBAC filters' counters under xDS, for their `http.<prefix>.rbac.*` and
    /// `<prefix>rbac.*` (network: `tcp.rbac.*`) stats.
    pub rbac_filters: Arc<super::rbac_filters::RbacFilterStats>,
    /// The `tcp_proxy` filters' counters under xDS, for their `tcp.<prefix>.*` stats.
    pub tcp_proxy: Arc<super::tcp_proxy::TcpProxyStats>,
    /// The HTTP connection managers' counters under xDS, for their `http.<prefix>.downstream_*`
    /// stats.
    pub http_conn_managers: Arc<super::http_conn_manager::HcmStats>,
    /// The connections of the listeners `virtualOutbound` hands them to, for their
    /// `listener.<address>.downstream_cx_*` stats (and to take out of virtualOutbound's own).
    pub listeners: Arc<super::listeners::ListenerStats>,
    /// The xDS resources in force (istiod's or the files'), for the statistics Envoy makes
    /// when it loads a listener.
    pub xds: Arc<OnceLock<Arc<remora_xds::store::Store>>>,
}

/// What istiod mode shares with the stats.
#[derive(Debug)]
pub struct ControlPlane {
    pub stats: Arc<remora_xds::ads::Stats>,
    /// istiod's clusters, counted as Envoy's `cluster_manager.active_clusters`.
    pub store: Arc<remora_xds::store::Store>,
    /// Resources whose last update was refused, for `/config_dump`'s `error_state`.
    pub refusals: Arc<crate::istiod::xds::Refusals>,
    /// The xDS channel's connections to istiod, counted as Envoy's `xds-grpc` cluster's.
    pub connection: Arc<crate::istiod::connection::ConnectionStats>,
}

/// Envoy's cluster for traffic to an original destination, and Istio's for inbound passthrough.
const OUTBOUND_CLUSTER: &str = "PassthroughCluster";
const INBOUND_CLUSTER: &str = "InboundPassthroughCluster";

impl EnvoyStats {
    /// Every stat, now.
    pub fn snapshot(&self) -> Vec<EnvoyStat> {
        let state = self.server.state();
        let g = |scope: Scope, stat, value: u64| EnvoyStat {
            scope,
            stat,
            code: None,
            kind: Kind::Gauge,
            value,
        };
        let c = |scope: Scope, stat, value: u64| EnvoyStat {
            scope,
            stat,
            code: None,
            kind: Kind::Counter,
            value,
        };
        let active = |d: &DirectionMetrics| u64::try_from(d.active.get()).unwrap_or(0);
        let mut stats = vec![
            g(Scope::Server, "state", state as u64),
            g(Scope::Server, "live", u64::from(state == ServerState::Live)),
            g(Scope::Server, "uptime", self.server.uptime_secs()),
            g(
                Scope::Server,
                "concurrency",
                u64::from(self.server.concurrency.load(Ordering::Relaxed)),
            ),
            g(
                Scope::Server,
                "total_connections",
                active(&self.outbound) + active(&self.inbound),
            ),
        ];
        stats.extend(
            super::process::envoy_memory()
                .into_iter()
                .map(|(stat, value)| g(Scope::Server, stat, value)),
        );
        self.manager_stats(&mut stats, state);
        if let Some(store) = self.xds.get() {
            // The listeners connections may be handed to, at 0 while in force.
            let snapshot = store.current();
            self.listeners.make(
                snapshot
                    .listeners()
                    .filter(|l| !l.bind_to_port && !l.use_original_dst)
                    .map(|l| l.address),
            );
        }
        let handed = self.listeners.each();
        for (name, counters) in &handed {
            let (opened, closed) = counters.counts();
            let l = || Scope::Listener(name.clone());
            stats.push(c(l(), "downstream_cx_total", opened));
            stats.push(c(l(), "downstream_cx_destroy", closed));
            stats.push(g(
                l(),
                "downstream_cx_active",
                opened.saturating_sub(closed),
            ));
            // Refused before a hand-off: counted on virtualOutbound, as Envoy counts them.
            stats.push(c(l(), "downstream_cx_overflow", 0));
            stats.push(c(l(), "downstream_global_cx_overflow", 0));
        }
        for (listener, cluster, d, dir) in [
            (
                &self.outbound_listener,
                OUTBOUND_CLUSTER,
                &self.outbound,
                crate::Direction::Outbound,
            ),
            (
                &self.inbound_listener,
                INBOUND_CLUSTER,
                &self.inbound,
                crate::Direction::Inbound,
            ),
        ] {
            let l = || Scope::Listener(listener.clone());
            // Envoy counts a connection handed on by original destination on the listener
            // that took it: virtualOutbound keeps the rest.
            let (handed, handed_closed) = match dir {
                crate::Direction::Outbound => handed.iter().fold((0, 0), |(o, c), (_, h)| {
                    let (opened, closed) = h.counts();
                    (o + opened, c + closed)
                }),
                crate::Direction::Inbound => (0, 0),
            };
            let active = |d: &DirectionMetrics| {
                active(d).saturating_sub(handed.saturating_sub(handed_closed))
            };
            stats.push(c(
                l(),
                "downstream_cx_total",
                d.opened.get().saturating_sub(handed),
            ));
            stats.push(c(
                l(),
                "downstream_cx_overflow",
                self.overload.listener_overflow(dir).get(),
            ));
            stats.push(c(
                l(),
                "downstream_global_cx_overflow",
                self.overload.global_overflow(dir).get(),
            ));
            stats.push(g(l(), "downstream_cx_active", active(d)));
            stats.push(c(
                l(),
                "downstream_cx_destroy",
                d.closed.get().saturating_sub(handed_closed),
            ));
            let cl = || Scope::Cluster(cluster.to_string());
            stats.push(c(
                cl(),
                "upstream_cx_connect_fail",
                d.connect_failures.get(),
            ));
            stats.push(c(cl(), "upstream_cx_tx_bytes_total", d.sent_bytes.get()));
            stats.push(c(
                cl(),
                "upstream_cx_rx_bytes_total",
                d.received_bytes.get(),
            ));
        }
        let inbound_tls = |result| self.tls.handshakes(crate::Direction::Inbound, result);
        let l = || Scope::Listener(self.inbound_listener.clone());
        for (stat, results) in INBOUND_SSL_STATS {
            let value = results.iter().map(|r| inbound_tls(r)).sum();
            stats.push(c(l(), stat, value));
        }
        // Inbound authorization, as Istio's RBAC filters count it. Under xDS each filter counts
        // its own (per connection manager, or under a network filter's stat prefix); the
        // policy files once, under virtualInbound's connection manager and `tcp.`, and only
        // once policies are in force, as Envoy only has the filters then.
        if self.xds.get().is_none() && self.authz.policies_in_force() {
            let http = Scope::HttpConnManager(format!("inbound_{}", self.inbound_listener));
            for (scope, p) in [
                (http, super::AuthzProtocol::Http),
                (Scope::Tcp, super::AuthzProtocol::Tcp),
            ] {
                for (stat, v) in RBAC_STATS.into_iter().zip(self.authz.envoy_rbac(p)) {
                    stats.push(c(scope.clone(), stat, v));
                }
            }
        }
        if let Some(cp) = self.control_plane.get() {
            control_plane::stats(&mut stats, cp);
        }
        if let Some(upstreams) = self.clusters.get() {
            clusters::cluster_stats(&mut stats, upstreams, self.xds.get().map(Arc::as_ref));
        }
        self.filter_stats(&mut stats);
        stats
    }
}

/// The inbound listener's TLS statistics as Envoy counts them on its mesh TLS filter chains,
/// from the handshake results (`TlsMetrics::handshake`): every failed handshake is a
/// `connection_error`, and a failed verification of the client's certificate also counts by
/// what failed. A client certificate is always required, so `no_certificate` (a handshake that
/// succeeded without one) stays 0.
const INBOUND_SSL_STATS: [(&str, &[&str]); 5] = [
    ("ssl.handshake", &["ok"]),
    (
        "ssl.connection_error",
        &[
            "no_client_certificate",
            "unknown_ca",
            "expired",
            "wrong_san",
            "refused_by_peer",
            "timeout",
            "error",
        ],
    ),
    ("ssl.fail_verify_no_cert", &["no_client_certificate"]),
    ("ssl.fail_verify_error", &["unknown_ca", "expired"]),
    ("ssl.fail_verify_san", &["wrong_san"]),
];

/// Envoy's RBAC filter statistics, in [`super::AuthzMetrics::envoy_rbac`]'s order.
const RBAC_STATS: [&str; 4] = [
    "rbac.allowed",
    "rbac.denied",
    "rbac.shadow_allowed",
    "rbac.shadow_denied",
];

/// One Prometheus sample: its scope label, if any, and its value.
type Sample = (Vec<(&'static str, String)>, u64);

impl Collector for EnvoyStats {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // One descriptor per name, with every labelled sample under it.
        let mut families: BTreeMap<String, (Kind, Vec<Sample>)> = BTreeMap::new();
        for s in self.snapshot() {
            let (name, labels) = s.prometheus();
            // Envoy counters without `_total` keep their name as gauges here (see the module doc).
            let kind = if s.kind == Kind::Counter && name.ends_with("_total") {
                Kind::Counter
            } else {
                Kind::Gauge
            };
            families
                .entry(name)
                .or_insert_with(|| (kind, Vec::new()))
                .1
                .push((labels, s.value));
        }
        for (name, (kind, samples)) in families {
            match kind {
                Kind::Counter => {
                    let base = name.trim_end_matches("_total");
                    let probe = ConstCounter::new(0u64);
                    let mut m = encoder.encode_descriptor(
                        base,
                        "Envoy statistic",
                        None,
                        probe.metric_type(),
                    )?;
                    if let [(ref labels, v)] = samples[..] {
                        if labels.is_empty() {
                            ConstCounter::new(v).encode(m)?;
                            continue;
                        }
                    }
                    for (labels, v) in samples {
                        ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
                    }
                }
                Kind::Gauge => {
                    let probe = ConstGauge::new(0i64);
                    let mut m = encoder.encode_descriptor(
                        &name,
                        "Envoy statistic",
                        None,
                        probe.metric_type(),
                    )?;
                    let gauge = |v: u64| ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
                    if let [(ref labels, v)] = samples[..] {
                        if labels.is_empty() {
                            gauge(v).encode(m)?;
                            continue;
                        }
                    }
                    for (labels, v) in samples {
                        gauge(v).encode(m.encode_family(&labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}
