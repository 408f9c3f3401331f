//! Clusters (load balancing, circuit breakers, outlier detection, DNS, upstream HTTP options)
//! and their endpoints (EDS).

use super::Table;

/// Message full name → the fields Remora reads in it.
pub(super) const READ: Table = &[
    // Clusters.
    (
        "envoy.config.cluster.v3.Cluster.RingHashLbConfig",
        &["minimum_ring_size", "maximum_ring_size", "hash_function"],
    ),
    (
        "envoy.config.cluster.v3.Cluster.MaglevLbConfig",
        &["table_size"],
    ),
    (
        "envoy.config.cluster.v3.Cluster",
        &[
            "name",
            "type",
            "eds_cluster_config",
            "connect_timeout",
            "lb_policy",
            "least_request_lb_config",
            "ring_hash_lb_config",
            "maglev_lb_config",
            "circuit_breakers",
            "metadata",
            "filters",
            "transport_socket",
            "transport_socket_matches",
            "load_assignment",
            "typed_extension_protocol_options",
            "cleanup_interval",
            "upstream_bind_config",
            "original_dst_lb_config",
            "dns_lookup_family",
            "dns_refresh_rate",
            "respect_dns_ttl",
            "typed_dns_resolver_config",
            "dns_jitter",
            "alt_stat_name",
            "common_lb_config",
            "outlier_detection",
            "upstream_connection_options",
        ],
    ),
    // DestinationRule `connectionPool.tcp.tcpKeepalive`; happy eyeballs and interface names
    // are not read.
    (
        "envoy.config.cluster.v3.UpstreamConnectionOptions",
        &["tcp_keepalive"],
    ),
    (
        "envoy.config.core.v3.TcpKeepalive",
        &["keepalive_probes", "keepalive_time", "keepalive_interval"],
    ),
    // Only what istiod writes: the panic threshold (with outlier detection) and locality
    // weights (a locality `distribute` setting), both kept in the model.
    (
        "envoy.config.cluster.v3.Cluster.CommonLbConfig",
        &["healthy_panic_threshold", "locality_weighted_lb_config"],
    ),
    (
        "envoy.config.cluster.v3.Cluster.CommonLbConfig.LocalityWeightedLbConfig",
        &[],
    ),
    // The DNS resolver: c-ares on the system's resolv.conf. The converter refuses what changes
    // resolution (custom resolvers, unroutable-family filtering, resolver options);
    // `udp_max_queries` (istiod's, on every DNS cluster) and a fallback flag without resolvers
    // change nothing of what a name resolves to.
    (
        "envoy.config.core.v3.TypedExtensionConfig",
        &["name", "typed_config"],
    ),
    (
        "envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
        &[
            "resolvers",
            "use_resolvers_as_fallback",
            "filter_unroutable_families",
            "dns_resolver_options",
            "udp_max_queries",
        ],
    ),
    (
        "envoy.config.cluster.v3.Cluster.EdsClusterConfig",
        &["eds_config", "service_name"],
    ),
    (
        "envoy.config.cluster.v3.Cluster.LeastRequestLbConfig",
        &["choice_count"],
    ),
    (
        "envoy.config.cluster.v3.Cluster.OriginalDstLbConfig",
        &["use_http_header", "upstream_port_override"],
    ),
    (
        "envoy.config.cluster.v3.Cluster.TransportSocketMatch",
        &["name", "match", "transport_socket"],
    ),
    (
        "envoy.config.cluster.v3.CircuitBreakers",
        &["thresholds", "per_host_thresholds"],
    ),
    (
        "envoy.config.cluster.v3.CircuitBreakers.Thresholds",
        &[
            "priority",
            "max_connections",
            "max_pending_requests",
            "max_requests",
            "max_retries",
            "track_remaining",
        ],
    ),
    // Outlier detection (see `cluster/limits.rs`): the consecutive-failure detectors are
    // honoured; success-rate and failure-percentage settings only where they eject nothing.
    (
        "envoy.config.cluster.v3.OutlierDetection",
        &[
            "consecutive_5xx",
            "interval",
            "base_ejection_time",
            "max_ejection_percent",
            "enforcing_consecutive_5xx",
            "enforcing_success_rate",
            "success_rate_minimum_hosts",
            "success_rate_request_volume",
            "success_rate_stdev_factor",
            "consecutive_gateway_failure",
            "enforcing_consecutive_gateway_failure",
            "split_external_local_origin_errors",
            "consecutive_local_origin_failure",
            "enforcing_consecutive_local_origin_failure",
            "enforcing_local_origin_success_rate",
            "failure_percentage_threshold",
            "enforcing_failure_percentage",
            "enforcing_failure_percentage_local_origin",
            "failure_percentage_minimum_hosts",
            "failure_percentage_request_volume",
            "max_ejection_time",
            "max_ejection_time_jitter",
            "successful_active_health_check_uneject_host",
            "always_eject_one_host",
            "detect_degraded_hosts",
        ],
    ),
    ("envoy.config.cluster.v3.Filter", &["name", "typed_config"]),
    ("envoy.config.core.v3.BindConfig", &["source_address"]),
    (
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        &[
            "common_http_protocol_options",
            "upstream_http_protocol_options",
            "explicit_http_config",
            "use_downstream_protocol_config",
        ],
    ),
    // istiod's for a DestinationRule's TLS without `sni` (`setAutoSniAndAutoSanValidation`);
    // `override_auto_sni_header` is refused.
    (
        "envoy.config.core.v3.UpstreamHttpProtocolOptions",
        &["auto_sni", "auto_san_validation"],
    ),
    (
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions.ExplicitHttpConfig",
        &["http_protocol_options", "http2_protocol_options"],
    ),
    (
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions.UseDownstreamHttpConfig",
        &["http_protocol_options", "http2_protocol_options"],
    ),
    (
        "envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer",
        &[],
    ),
    // Endpoints.
    (
        "envoy.config.endpoint.v3.ClusterLoadAssignment",
        &["cluster_name", "endpoints", "policy"],
    ),
    (
        "envoy.config.endpoint.v3.ClusterLoadAssignment.Policy",
        &["overprovisioning_factor"],
    ),
    (
        "envoy.config.endpoint.v3.LocalityLbEndpoints",
        &[
            "locality",
            "lb_endpoints",
            "load_balancing_weight",
            "priority",
        ],
    ),
    (
        "envoy.config.endpoint.v3.LbEndpoint",
        &[
            "endpoint",
            "health_status",
            "metadata",
            "load_balancing_weight",
        ],
    ),
    (
        "envoy.config.endpoint.v3.Endpoint",
        &["address", "health_check_config"],
    ),
    // Envoy's config dump prints its own default as `health_check_config: {}`; anything set in
    // it is a health check Remora does not run.
    ("envoy.config.endpoint.v3.Endpoint.HealthCheckConfig", &[]),
];
