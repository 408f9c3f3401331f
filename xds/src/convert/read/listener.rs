//! Listeners, their filter chains and listener filters, the TCP proxy, and the access
//! logs that listeners, the TCP proxy and the HTTP connection manager write.

use super::Table;

/// Message full name → the fields Remora reads in it.
pub(super) const READ: Table = &[
    // Listeners.
    (
        "envoy.config.listener.v3.Listener",
        &[
            "name",
            "address",
            "filter_chains",
            "default_filter_chain",
            "traffic_direction",
            "bind_to_port",
            "use_original_dst",
            "listener_filters",
            "listener_filters_timeout",
            "continue_on_listener_filters_timeout",
            "access_log",
        ],
    ),
    (
        "envoy.config.listener.v3.FilterChain",
        &["name", "filter_chain_match", "filters", "transport_socket"],
    ),
    (
        "envoy.config.listener.v3.FilterChainMatch",
        &[
            "destination_port",
            "prefix_ranges",
            "server_names",
            "transport_protocol",
            "application_protocols",
        ],
    ),
    (
        "envoy.config.listener.v3.ListenerFilter",
        &["name", "typed_config", "filter_disabled"],
    ),
    (
        "envoy.config.listener.v3.ListenerFilterChainMatchPredicate",
        &["destination_port_range", "or_match"],
    ),
    ("envoy.config.listener.v3.Filter", &["name", "typed_config"]),
    (
        "envoy.config.core.v3.SocketAddress",
        &["address", "port_value", "ipv4_compat"],
    ),
    (
        "envoy.config.core.v3.TransportSocket",
        &["name", "typed_config"],
    ),
    (
        "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
        &[],
    ),
    (
        "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector",
        &[],
    ),
    (
        "envoy.extensions.filters.listener.original_dst.v3.OriginalDst",
        &[],
    ),
    // TCP.
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        &[
            "stat_prefix",
            "cluster",
            "weighted_clusters",
            "idle_timeout",
            "access_log",
            "hash_policy",
        ],
    ),
    // `tcp_proxy`'s hash policy: the source IP only (filter_state refused).
    ("envoy.type.v3.HashPolicy", &["source_ip"]),
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.WeightedCluster.ClusterWeight",
        &["name", "weight"],
    ),
    // Access logs: Envoy's file logger to /dev/stdout in Istio's default formats, with a
    // response flag filter (see `access_log.rs`); other filters and format options are refused.
    (
        "envoy.config.accesslog.v3.AccessLog",
        &["name", "typed_config", "filter"],
    ),
    (
        "envoy.config.accesslog.v3.AccessLogFilter",
        &["response_flag_filter"],
    ),
    ("envoy.config.accesslog.v3.ResponseFlagFilter", &["flags"]),
    (
        "envoy.extensions.access_loggers.file.v3.FileAccessLog",
        &["path", "log_format"],
    ),
    (
        "envoy.config.core.v3.SubstitutionFormatString",
        &["text_format_source", "json_format", "json_format_options"],
    ),
    // Key order only: Remora writes its own.
    (
        "envoy.config.core.v3.JsonFormatOptions",
        &["sort_properties"],
    ),
];
