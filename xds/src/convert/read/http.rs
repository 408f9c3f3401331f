//! The HTTP connection manager and the HTTP filters it runs (router, fault, CORS, gRPC
//! statistics); RBAC and ext_authz are in [`super::authz`].

use super::Table;

/// Message full name → the fields Remora reads in it.
pub(super) const READ: Table = &[
    // HTTP connection manager and its filters.
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        &[
            "stat_prefix",
            "rds",
            "route_config",
            "http_filters",
            "codec_type",
            "stream_idle_timeout",
            "use_remote_address",
            "forward_client_cert_details",
            "set_current_client_cert_details",
            "server_name",
            "upgrade_configs",
            "normalize_path",
            "path_with_escaped_slashes_action",
            "request_id_extension",
            "tracing",
            "http2_protocol_options",
            "access_log",
        ],
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.Rds",
        &["route_config_name", "config_source"],
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter",
        // `config_discovery` is read to be refused by name (ECDS).
        &["name", "typed_config", "config_discovery", "is_optional"],
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.UpgradeConfig",
        &["upgrade_type"],
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.SetCurrentClientCertDetails",
        &["subject", "cert", "chain", "dns", "uri"],
    ),
    // Tracing without a provider emits nothing unless the bootstrap names a tracer, and
    // Remora's never does; a provider is refused (see the converter).
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.Tracing",
        &[
            "client_sampling",
            "random_sampling",
            "overall_sampling",
            "custom_tags",
            "max_path_tag_length",
            "verbose",
        ],
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.RequestIDExtension",
        &["typed_config"],
    ),
    (
        "envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig",
        &["pack_trace_reason", "use_request_id_for_trace_sampling"],
    ),
    (
        "envoy.config.core.v3.Http2ProtocolOptions",
        &["max_concurrent_streams", "allow_connect"],
    ),
    ("envoy.config.core.v3.Http1ProtocolOptions", &[]),
    (
        "envoy.config.core.v3.HttpProtocolOptions",
        &["idle_timeout", "max_requests_per_connection"],
    ),
    ("envoy.extensions.filters.http.router.v3.Router", &[]),
    // Only a route's (per-filter) config may set them: the filter's own is refused whole
    // (`http.rs`).
    ("envoy.extensions.filters.http.fault.v3.HTTPFault", &["delay", "abort"]),
    (
        "envoy.extensions.filters.common.fault.v3.FaultDelay",
        &["fixed_delay", "percentage"],
    ),
    (
        "envoy.extensions.filters.http.fault.v3.FaultAbort",
        &["http_status", "grpc_status", "percentage"],
    ),
    ("envoy.extensions.filters.http.cors.v3.Cors", &[]),
    // A route's, virtual host's or table's cors config (`route/cors.rs`); `shadow_enabled`
    // is not read.
    (
        "envoy.extensions.filters.http.cors.v3.CorsPolicy",
        &[
            "allow_origin_string_match",
            "allow_methods",
            "allow_headers",
            "expose_headers",
            "max_age",
            "allow_credentials",
            "filter_enabled",
            "allow_private_network_access",
            "forward_not_matching_preflights",
        ],
    ),
    (
        "envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
        &["emit_filter_state", "stats_for_all_methods"],
    ),
];
