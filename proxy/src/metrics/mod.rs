//! Counters for the data path, exposed in Prometheus text on `/stats/prometheus`.
//!
//! Counters are resolved once at start-up, so the data path increments an atomic and never
//! looks up a label set. Three vocabularies share one registry: Istio's standard metrics
//! (`istio`), process metrics (`process`), and Remora's own `remora_*` counters, which carry only
//! a direction and are what Remora's tests and alerts read.

mod authz;
mod connection;
mod dns;
mod envoy;
pub mod exposition;
pub mod http_conn_manager;
mod istio;
mod istio_http;
pub mod listeners;
pub use listeners::ListenerNames;
mod overload;
pub mod per_prefix;
mod process;
pub mod rbac_filters;
pub mod tcp_proxy;
mod tls;

pub use authz::{AuthzMetrics, Outcome as AuthzOutcome, Protocol as AuthzProtocol};
pub use connection::{DirectionMetrics, IstioOpen};
pub use dns::DnsMetrics;
pub use envoy::{
    ControlPlane, EnvoyStat, Kind as StatKind, Scope as StatScope, ServerState, ServerStats,
};
pub use istio::{IstioLabels, IstioTcp, FLAGS};
pub use istio_http::{RequestOutcome, SeriesCache};
pub use overload::{OverloadMetrics, ACCEPTING_LISTENERS};
pub use process::{sample as process_sample, Sample as ProcessSample};
pub use tls::TlsMetrics;

use crate::workload::Workload;
use crate::Direction;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

type Labels = Vec<(&'static str, &'static str)>;

/// The `result` values of `remora_protocol_detection_total`.
pub const DETECTION_RESULTS: [&str; 9] = [
    "http1",
    "http2",
    "tls",
    "opaque",
    "server_first",
    "timeout",
    "client_closed",
    "client_failed",
    "upstream_failed",
];

/// Every metric Remora exports, with its registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    outbound: DirectionMetrics,
    inbound: DirectionMetrics,
    /// Connections refused because they would loop, by guard.
    pub loop_refused_own_listener: Counter,
    pub loop_refused_own_upstream: Counter,
    /// Config reloads that took effect.
    pub reloads_ok: Counter,
    /// Config reloads refused (the running config stayed).
    pub reloads_failed: Counter,
    /// Access-log lines dropped: the writer fell behind, or the file could not be written.
    pub access_log_dropped: Counter,
    /// xDS resources from files refused (each time a file is applied), and files unreadable.
    pub xds_file_refusals: Counter,
    /// Upstream connections that needed mesh TLS by xDS with no workload identity held.
    pub xds_tls_without_identity: Counter,
    /// HTTP/1.1 requests served by Remora's own exchange (`http::h1`), not hyper.
    pub http1_fast_path: Counter,
    /// Shadow copies of requests (route mirror policies).
    pub mirror: crate::http::mirror::MirrorStats,
    /// Envoy's fault filter statistics, per connection manager.
    pub faults: Arc<crate::http::fault::FaultStats>,
    /// Envoy's cors filter statistics, per connection manager.
    pub cors: Arc<crate::http::cors_stats::CorsStats>,
    /// Envoy's network ext_authz filter statistics, per stat prefix.
    pub network_ext_authz: Arc<crate::http::ext_authz::network::NetworkStats>,
    /// Envoy's HTTP ext_authz filter statistics, per connection manager.
    pub http_ext_authz: Arc<crate::http::ext_authz::HttpStats>,
    /// Envoy's RBAC filter statistics under xDS, per connection manager or stat prefix.
    pub rbac_filters: Arc<rbac_filters::RbacFilterStats>,
    /// Envoy's `tcp_proxy` statistics under xDS, per stat prefix.
    pub tcp_proxy: Arc<tcp_proxy::TcpProxyStats>,
    /// Envoy's HTTP connection manager statistics under xDS, per stat prefix.
    pub http_conn_managers: Arc<http_conn_manager::HcmStats>,
    /// Envoy's connection statistics of the listeners `virtualOutbound` hands connections to.
    pub listeners: Arc<listeners::ListenerStats>,
    pub ext_authz: crate::http::ext_authz::ExtAuthzStats,
    /// Protocol detection outcomes, by `DETECTION_RESULTS` index, and how long they took.
    detections: Vec<Counter>,
    detection_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Server state, uptime and workers, for Envoy's `server.*` stats.
    pub server: Arc<ServerStats>,
    requests: istio_http::RequestMetrics,
    /// The DNS forwarder.
    pub dns: DnsMetrics,
    /// Mesh TLS: certificate expiry and rotations, handshakes.
    pub tls: TlsMetrics,
    /// Authorization decisions and the policies in force.
    pub authz: AuthzMetrics,
    /// Connections refused at the connection limits, and failed accepts.
    pub overload: OverloadMetrics,
    envoy: envoy::EnvoyStats,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(&Workload::default(), ListenerNames::default())
    }
}

impl Metrics {
    /// Register every metric; `own` fills Istio's labels for this side of each connection.
    pub fn new(own: &Workload, listeners: ListenerNames) -> Self {
        let mut registry = Registry::default();
        let istio_tcp = istio::TcpFamilies::register(&mut registry);
        let requests = istio_http::RequestMetrics::register(&mut registry, own);
        let detection_family = Family::<Labels, Counter>::default();
        registry.register(
            "remora_protocol_detection",
            "Connections by what protocol detection decided",
            detection_family.clone(),
        );
        let detections = DETECTION_RESULTS
            .iter()
            .map(|r| {
                detection_family
                    .get_or_create(&vec![("result", *r)])
                    .clone()
            })
            .collect();
        // From 100 µs (the client's first packet was already there) to the 5 s default timeout.
        let detection_seconds = prometheus_client::metrics::histogram::Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(0.0001, 4.0, 9),
        );
        registry.register(
            "remora_protocol_detection_duration_seconds",
            "Time protocol detection took",
            detection_seconds.clone(),
        );
        let build = Family::<IstioLabels, Gauge>::default();
        registry.register("istio_build", "Istio component build info", build.clone());
        build
            .get_or_create(&vec![
                ("component", "proxy".to_string()),
                ("tag", env!("CARGO_PKG_VERSION").to_string()),
            ])
            .set(1);
        registry.register_collector(Box::new(process::ProcessCollector::new()));
        let loop_refused = Family::<Labels, Counter>::default();
        let reloads = Family::<Labels, Counter>::default();
        let dropped = Counter::default();
        let xds_file_refusals = Counter::default();
        let xds_tls_without_identity = Counter::default();
        let http1_fast_path = Counter::default();
        let mirror = crate::http::mirror::MirrorStats::register(&mut registry);
        let ext_authz = crate::http::ext_authz::ExtAuthzStats::register(&mut registry);
        registry.register(
            "remora_http1_fast_path_requests",
            "HTTP/1.1 requests served by the fast path (the rest of HTTP is served by hyper)",
            http1_fast_path.clone(),
        );
        registry.register(
            "remora_xds_file_refusals",
            "xDS resources from xds.resources_dir refused, and files that could not be read",
            xds_file_refusals.clone(),
        );
        registry.register(
            "remora_xds_tls_without_identity",
            "Upstream connections xDS sends with mesh TLS refused for want of a workload identity",
            xds_tls_without_identity.clone(),
        );

        let connections = connection::Families::register(&mut registry);
        registry.register(
            "remora_loop_refused",
            "Connections refused because they would loop into Remora",
            loop_refused.clone(),
        );
        registry.register(
            "remora_config_reloads",
            "Config reloads by result",
            reloads.clone(),
        );
        registry.register(
            "remora_access_log_dropped",
            "Access-log lines dropped: the writer fell behind, or the file could not be written",
            dropped.clone(),
        );

        let outbound = connections.direction(&istio_tcp, own, Direction::Outbound);
        let inbound = connections.direction(&istio_tcp, own, Direction::Inbound);
        let guard = |g: &'static str| loop_refused.get_or_create(&vec![("guard", g)]).clone();
        let result = |r: &'static str| reloads.get_or_create(&vec![("result", r)]).clone();
        let server = Arc::new(ServerStats::default());
        let authz = AuthzMetrics::register(&mut registry);
        let dns = DnsMetrics::register(&mut registry);
        let tls = TlsMetrics::register(&mut registry);
        let overload = OverloadMetrics::register(&mut registry);
        let envoy = envoy::EnvoyStats {
            overload: overload.clone(),
            authz: authz.clone(),
            tls: tls.clone(),
            server: Arc::clone(&server),
            outbound: outbound.clone(),
            inbound: inbound.clone(),
            outbound_listener: listeners.outbound,
            inbound_listener: listeners.inbound,
            control_plane: Arc::default(),
            clusters: Arc::default(),
            faults: Arc::default(),
            cors: Arc::default(),
            network_ext_authz: Arc::default(),
            http_ext_authz: Arc::default(),
            rbac_filters: Arc::default(),
            tcp_proxy: Arc::default(),
            http_conn_managers: Arc::default(),
            listeners: Arc::default(),
            xds: Arc::default(),
        };
        registry.register_collector(Box::new(envoy.clone()));
        Metrics {
            faults: Arc::clone(&envoy.faults),
            cors: Arc::clone(&envoy.cors),
            network_ext_authz: Arc::clone(&envoy.network_ext_authz),
            http_ext_authz: Arc::clone(&envoy.http_ext_authz),
            rbac_filters: Arc::clone(&envoy.rbac_filters),
            tcp_proxy: Arc::clone(&envoy.tcp_proxy),
            http_conn_managers: Arc::clone(&envoy.http_conn_managers),
            listeners: Arc::clone(&envoy.listeners),
            detections,
            detection_seconds,
            tls,
            authz,
            overload,
            requests,
            server,
            dns,
            envoy,
            registry,
            outbound,
            inbound,
            loop_refused_own_listener: guard("own_listener"),
            loop_refused_own_upstream: guard("own_upstream"),
            reloads_ok: result("success"),
            reloads_failed: result("failure"),
            access_log_dropped: dropped,
            xds_file_refusals,
            xds_tls_without_identity,
            http1_fast_path,
            mirror,
            ext_authz,
        }
    }

    /// The metrics of one direction.
    pub fn direction(&self, d: Direction) -> &DirectionMetrics {
        match d {
            Direction::Outbound => &self.outbound,
            Direction::Inbound => &self.inbound,
        }
    }

    /// Record what protocol detection decided (one of [`DETECTION_RESULTS`]) and how long it
    /// took.
    pub fn detection_finished(&self, result: &str, took: std::time::Duration) {
        let i = DETECTION_RESULTS
            .iter()
            .position(|r| *r == result)
            .unwrap_or(0);
        if let Some(c) = self.detections.get(i) {
            c.inc();
        }
        self.detection_seconds.observe(took.as_secs_f64());
    }

    /// Record one finished HTTP or gRPC request in Istio's request metrics; `series` is its
    /// connection's.
    pub fn request_finished(&self, series: &SeriesCache, outcome: &RequestOutcome) {
        self.requests.record_cached(series, outcome);
    }

    /// Export the ADS client's statistics as Envoy's control-plane stats, and count the
    /// clusters it delivers (istiod mode; set once, before the client runs).
    pub fn set_control_plane(&self, cp: ControlPlane) {
        if self.envoy.control_plane.set(cp).is_err() {
            tracing::warn!("control-plane statistics already set; the first kept");
        }
    }

    /// Export the xDS clusters' statistics (set once, at start-up).
    pub fn set_clusters(&self, upstreams: Arc<crate::upstream::Upstreams>) {
        if self.envoy.clusters.set(upstreams).is_err() {
            tracing::warn!("cluster statistics already set; the first kept");
        }
    }

    /// Export the statistics Envoy makes when it loads a listener (the HTTP ext_authz
    /// filters') for the xDS resources in `store`, istiod's or the files' (set once).
    pub fn set_xds_store(&self, store: Arc<remora_xds::store::Store>) {
        if self.envoy.xds.set(store).is_err() {
            tracing::warn!("xDS store for the statistics already set; the first kept");
        }
    }

    /// The ADS client's statistics and refusals, when there is one.
    pub fn control_plane(&self) -> Option<&ControlPlane> {
        self.envoy.control_plane.get()
    }

    /// Envoy's statistics, now, for the admin `/stats` page.
    pub fn envoy_stats(&self) -> Vec<EnvoyStat> {
        self.envoy.snapshot()
    }

    /// The dotted names and values of Envoy's statistics whose name `keep` takes (for tests).
    #[cfg(test)]
    pub(crate) fn dotted_stats(&self, keep: impl Fn(&str) -> bool) -> Vec<(String, u64)> {
        let all = self.envoy_stats().into_iter();
        all.map(|s| (s.dotted_name(), s.value))
            .filter(|(n, _)| keep(n))
            .collect()
    }

    /// Every metric in Prometheus text format 0.0.4, as Envoy serves it.
    pub fn encode(&self) -> String {
        // Envoy types its counters counter whatever their name; OpenMetrics cannot (a counter
        // there ends in `_total`), so they are written as gauges and retyped here.
        let counters: Vec<String> = self
            .envoy_stats()
            .iter()
            .filter(|s| s.kind == StatKind::Counter)
            .map(|s| s.prometheus().0)
            .filter(|name| !name.ends_with("_total"))
            .collect();
        exposition::openmetrics_to_text(&self.encode_openmetrics(), &counters)
    }

    /// The samples a scrape's `filter` and `usedonly` select, in Prometheus text format 0.0.4.
    pub fn encode_selected(&self, sel: &exposition::Selection) -> String {
        exposition::select(&self.encode(), sel)
    }

    /// Every metric in OpenMetrics text, for scrapers that ask for it.
    pub fn encode_openmetrics(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `name`'s sample for `reporter` and no response flag, if any.
    fn sample(text: &str, name: &str, reporter: &str) -> Option<f64> {
        let reporter = format!("reporter=\"{reporter}\"");
        text.lines()
            .find(|l| {
                l.starts_with(name) && l.contains(&reporter) && l.contains("response_flags=\"-\"")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    #[test]
    fn the_ads_clients_counters_are_envoys_control_plane_stats() {
        use remora_xds::sink::type_url;
        use std::sync::atomic::Ordering;
        let m = Metrics::default();
        assert!(!m.encode().contains("envoy_control_plane"));
        let stats = Arc::new(remora_xds::ads::Stats::default());
        m.set_control_plane(ControlPlane {
            stats: Arc::clone(&stats),
            store: Arc::default(),
            refusals: Arc::default(),
            connection: Arc::default(),
        });
        stats.connected_state.store(1, Ordering::Relaxed);
        let bump = |t, n| {
            if let Some(s) = stats.of(t) {
                s.update_success.fetch_add(n, Ordering::Relaxed);
                s.update_rejected.fetch_add(1, Ordering::Relaxed);
            }
        };
        bump(type_url::CLUSTER, 2);
        bump(type_url::LISTENER, 3);
        let dotted: Vec<(String, u64)> = m
            .envoy_stats()
            .into_iter()
            .map(|s| (s.dotted_name(), s.value))
            .collect();
        for (name, value) in [
            ("control_plane.connected_state", 1),
            ("cluster_manager.cds.update_success", 2),
            ("listener_manager.lds.update_success", 3),
            ("listener_manager.lds.update_rejected", 1),
            ("cluster_manager.active_clusters", 0),
            ("cluster_manager.warming_clusters", 0),
            ("cluster.xds-grpc;.upstream_cx_total", 0),
            ("cluster.xds-grpc;.upstream_cx_active", 0),
        ] {
            assert!(
                dotted.contains(&(name.to_string(), value)),
                "{name} {value}: {dotted:?}"
            );
        }
        // EDS and RDS are counted per cluster and per route table, as Envoy counts them:
        // there are no per-type sums, which Envoy does not have.
        assert!(
            !dotted
                .iter()
                .any(|(n, _)| n.starts_with("rds.") || n.starts_with("eds.")),
            "{dotted:?}"
        );
        let text = m.encode();
        for line in [
            "envoy_control_plane_connected_state 1\n",
            "envoy_cluster_manager_cds_update_success 2\n",
            "envoy_listener_manager_lds_update_rejected 1\n",
            "# TYPE envoy_cluster_manager_cds_update_attempt counter\n",
            "envoy_cluster_upstream_cx_connect_fail{cluster_name=\"xds-grpc\"} 0\n",
            "# TYPE envoy_cluster_upstream_cx_active gauge\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }

    #[test]
    fn each_sds_secret_has_envoys_stats_under_its_stat_name() {
        let m = Metrics::default();
        let stats = Arc::new(remora_xds::ads::Stats::default());
        m.set_control_plane(ControlPlane {
            stats: Arc::clone(&stats),
            store: Arc::default(),
            refusals: Arc::default(),
            connection: Arc::default(),
        });
        let name = "kubernetes://client-credential".to_string();
        stats
            .secrets
            .resubscribed(&Default::default(), &[name.clone()].into());
        let none = std::collections::BTreeSet::new();
        stats
            .secrets
            .answered([(&name, Some(1))], "v1", false, &none, &none);
        let refused = [&name].into();
        stats
            .secrets
            .answered([(&name, Some(2))], "v2", true, &refused, &refused);
        let dotted: Vec<(String, u64)> = m
            .envoy_stats()
            .into_iter()
            .map(|s| (s.dotted_name(), s.value))
            .collect();
        for (stat, value) in [
            ("update_attempt", 4),
            ("update_success", 1),
            ("update_rejected", 1),
            ("update_failure", 0),
            ("init_fetch_timeout", 0),
            ("key_rotation_failed", 0),
        ] {
            let name = format!("sds.kubernetes_client-credential.{stat}");
            assert!(
                dotted.contains(&(name, value)),
                "{stat} {value}: {dotted:?}"
            );
        }
        let text = m.encode();
        // Under Istio's tags (no default ones) the secret's name stays in the name.
        let line = "envoy_sds_kubernetes_client_credential_update_success 1\n";
        assert!(text.contains(line), "{text}");
    }

    #[test]
    fn inbound_handshakes_give_the_listeners_envoy_ssl_stats() {
        let m = Metrics::default();
        for result in ["ok", "ok", "unknown_ca", "no_client_certificate", "timeout"] {
            m.tls.handshake(Direction::Inbound, result);
        }
        // Outbound handshakes and plaintext refused in STRICT are no inbound TLS handshake.
        m.tls.handshake(Direction::Outbound, "ok");
        m.tls.handshake(Direction::Inbound, "mtls_required");
        let stats: Vec<(String, u64)> = m
            .envoy_stats()
            .into_iter()
            .filter(|s| s.stat.starts_with("ssl."))
            .map(|s| (s.dotted_name(), s.value))
            .collect();
        let at = |name: &str| {
            let name = format!("listener.0.0.0.0_15006.ssl.{name}");
            stats.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
        };
        assert_eq!(at("handshake"), Some(2), "{stats:?}");
        assert_eq!(at("connection_error"), Some(3), "{stats:?}");
        assert_eq!(at("fail_verify_no_cert"), Some(1), "{stats:?}");
        assert_eq!(at("fail_verify_error"), Some(1), "{stats:?}");
        assert_eq!(at("fail_verify_san"), Some(0), "{stats:?}");
        let text = m.encode();
        assert!(
            text.contains("envoy_listener_ssl_handshake{listener_address=\"0.0.0.0_15006\"} 2\n"),
            "{text}"
        );
    }

    #[test]
    fn http_connections_stay_out_of_istios_tcp_series() {
        let m = Metrics::default();
        let inbound = m.direction(Direction::Inbound);
        for istio in [IstioOpen::NotTcp, IstioOpen::NotTcp, IstioOpen::Pending] {
            inbound.connection_opened();
            inbound.connection_closed(&istio, "-", 100, 1000);
        }
        let text = m.encode();
        let opened = "istio_tcp_connections_opened_total";
        let closed = "istio_tcp_connections_closed_total";
        // Envoy's listener counts every connection; Istio's TCP metrics only the TCP one.
        assert!(
            text.contains(
                "envoy_listener_downstream_cx_total{listener_address=\"0.0.0.0_15006\"} 3"
            ),
            "{text}"
        );
        assert_eq!(sample(&text, opened, "destination"), Some(1.0), "{text}");
        assert_eq!(sample(&text, closed, "destination"), Some(1.0), "{text}");
        assert_eq!(
            sample(&text, "istio_tcp_sent_bytes_total", "destination"),
            Some(1000.0),
            "{text}"
        );
    }

    #[test]
    fn counters_appear_with_direction_labels() {
        let m = Metrics::default();
        m.direction(Direction::Outbound).connection_opened();
        m.direction(Direction::Inbound).connection_opened();
        m.direction(Direction::Inbound).connection_opened();
        m.loop_refused_own_upstream.inc();
        let text = m.encode();
        assert!(
            text.contains("remora_connections_opened_total{direction=\"outbound\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("remora_connections_opened_total{direction=\"inbound\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("remora_loop_refused_total{guard=\"own_upstream\"} 1"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
        assert!(
            text.contains(
                "envoy_listener_downstream_cx_total{listener_address=\"0.0.0.0_15006\"} 2"
            ),
            "{text}"
        );
        // Typed counter without `_total`, as Envoy types it; Istio's `cluster_name` tag
        // wants a `;` that PassthroughCluster's name has not, so the name keeps it.
        assert!(
            text.contains(
                "# TYPE envoy_cluster_PassthroughCluster_upstream_cx_connect_fail counter"
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE envoy_server_state gauge"), "{text}");
        assert!(text.contains("envoy_server_state 2\n"), "{text}");
        assert!(
            text.contains("# TYPE remora_connections_opened_total counter"),
            "{text}"
        );
        assert!(text.contains("istio_build{component=\"proxy\""), "{text}");
        m.detection_finished("server_first", std::time::Duration::from_millis(2));
        let text = m.encode();
        assert!(
            text.contains("remora_protocol_detection_total{result=\"server_first\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("remora_protocol_detection_duration_seconds_count 1"),
            "{text}"
        );
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
        // Istio's TCP series appear with their first connection, as in Istio's sidecars.
        assert!(
            !text.contains("istio_tcp_connections_opened_total{"),
            "{text}"
        );
        let inbound = m.direction(Direction::Inbound);
        let open = inbound.istio_opened(None);
        inbound.connection_closed(&open, "-", 1, 2);
        assert!(
            m.encode()
                .contains("istio_tcp_connections_opened_total{reporter=\"destination\""),
            "{text}"
        );
    }
}
