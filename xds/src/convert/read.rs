//! Which fields of Envoy's messages Remora reads: the list [`super::fields::check`] holds every
//! resource to. A field not listed for its message is refused by name; a message not listed
//! is a value its converter reads whole. Adding a field here is a promise that the converter
//! honours it (or refuses the values it cannot).

/// Message full name → the fields Remora reads in it.
pub const READ: &[(&str, &[&str])] = &[
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
    ("envoy.config.core.v3.TransportSocket", &["name", "typed_config"]),
    ("envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector", &[]),
    ("envoy.extensions.filters.listener.http_inspector.v3.HttpInspector", &[]),
    ("envoy.extensions.filters.listener.original_dst.v3.OriginalDst", &[]),
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
    (
        "envoy.extensions.filters.http.rbac.v3.RBAC",
        &["rules", "shadow_rules", "shadow_rules_stat_prefix"],
    ),
    (
        "envoy.extensions.filters.network.rbac.v3.RBAC",
        &["rules", "shadow_rules", "stat_prefix", "shadow_rules_stat_prefix"],
    ),
    // ext_authz (AuthorizationPolicy CUSTOM).
    (
        "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
        &[
            "grpc_service",
            "http_service",
            "transport_api_version",
            "failure_mode_allow",
            "status_on_error",
            "with_request_body",
            "filter_enabled_metadata",
            "clear_route_cache",
        ],
    ),
    (
        "envoy.extensions.filters.network.ext_authz.v3.ExtAuthz",
        &[
            "stat_prefix",
            "grpc_service",
            "failure_mode_allow",
            "transport_api_version",
            "filter_enabled_metadata",
        ],
    ),
    ("envoy.config.core.v3.GrpcService", &["envoy_grpc", "timeout"]),
    (
        "envoy.config.core.v3.GrpcService.EnvoyGrpc",
        &["cluster_name", "authority"],
    ),
    (
        "envoy.extensions.filters.http.ext_authz.v3.HttpService",
        &[
            "server_uri",
            "path_prefix",
            "authorization_request",
            "authorization_response",
        ],
    ),
    ("envoy.config.core.v3.HttpUri", &["uri", "cluster", "timeout"]),
    (
        "envoy.extensions.filters.http.ext_authz.v3.AuthorizationRequest",
        &["allowed_headers"],
    ),
    (
        "envoy.extensions.filters.http.ext_authz.v3.AuthorizationResponse",
        &["allowed_upstream_headers", "allowed_client_headers"],
    ),
    (
        "envoy.extensions.filters.http.ext_authz.v3.BufferSettings",
        &["max_request_bytes", "allow_partial_message", "pack_as_bytes"],
    ),
    ("envoy.type.matcher.v3.ListStringMatcher", &["patterns"]),
    // RBAC policies.
    ("envoy.config.rbac.v3.RBAC", &["action", "policies"]),
    ("envoy.config.rbac.v3.Policy", &["permissions", "principals"]),
    (
        "envoy.config.rbac.v3.Permission",
        &[
            "any",
            "and_rules",
            "or_rules",
            "not_rule",
            "header",
            "url_path",
            "destination_ip",
            "destination_port",
            "destination_port_range",
            "requested_server_name",
        ],
    ),
    (
        "envoy.config.rbac.v3.Principal",
        &[
            "any",
            "and_ids",
            "or_ids",
            "not_id",
            "authenticated",
            "direct_remote_ip",
            "remote_ip",
            "source_ip",
            "header",
            "filter_state",
            "metadata",
        ],
    ),
    ("envoy.config.rbac.v3.Principal.Authenticated", &["principal_name"]),
    ("envoy.type.matcher.v3.FilterStateMatcher", &["key", "string_match"]),
    (
        "envoy.type.matcher.v3.MetadataMatcher",
        &["filter", "path", "value", "invert"],
    ),
    ("envoy.type.matcher.v3.ValueMatcher", &["string_match", "list_match"]),
    ("envoy.type.matcher.v3.ListMatcher", &["one_of"]),
    ("envoy.type.matcher.v3.PathMatcher", &["path"]),
    (
        "envoy.type.matcher.v3.StringMatcher",
        &["exact", "prefix", "suffix", "contains", "safe_regex", "ignore_case"],
    ),
    ("envoy.type.matcher.v3.RegexMatcher", &["regex", "google_re2"]),
    // Routes.
    (
        "envoy.config.route.v3.RouteConfiguration",
        &[
            "name",
            "virtual_hosts",
            "max_direct_response_body_size_bytes",
            "validate_clusters",
            "ignore_port_in_host_matching",
            "request_headers_to_add",
            "request_headers_to_remove",
            "response_headers_to_add",
            "response_headers_to_remove",
            "typed_per_filter_config",
        ],
    ),
    (
        "envoy.config.route.v3.VirtualHost",
        &[
            "name",
            "domains",
            "routes",
            "retry_policy",
            "include_request_attempt_count",
            "request_headers_to_add",
            "request_headers_to_remove",
            "response_headers_to_add",
            "response_headers_to_remove",
            "typed_per_filter_config",
        ],
    ),
    (
        "envoy.config.route.v3.Route",
        &[
            "name",
            "match",
            "route",
            "redirect",
            "direct_response",
            "decorator",
            "metadata",
            "request_headers_to_add",
            "request_headers_to_remove",
            "response_headers_to_add",
            "response_headers_to_remove",
            "typed_per_filter_config",
        ],
    ),
    (
        "envoy.config.route.v3.RouteMatch",
        &[
            "prefix",
            "path",
            "safe_regex",
            "path_separated_prefix",
            "connect_matcher",
            "case_sensitive",
            "headers",
            "query_parameters",
            "grpc",
        ],
    ),
    (
        "envoy.config.route.v3.RouteAction",
        &[
            "cluster",
            "weighted_clusters",
            "timeout",
            "idle_timeout",
            "retry_policy",
            "max_stream_duration",
            "max_grpc_timeout",
            "upgrade_configs",
            "prefix_rewrite",
            "host_rewrite_literal",
            "request_mirror_policies",
            "hash_policy",
        ],
    ),
    // Consistent hashing: filter_state and a header's regex_rewrite are left out, refused.
    (
        "envoy.config.route.v3.RouteAction.HashPolicy",
        &[
            "header",
            "cookie",
            "connection_properties",
            "query_parameter",
            "terminal",
        ],
    ),
    (
        "envoy.config.route.v3.RouteAction.HashPolicy.Header",
        &["header_name"],
    ),
    (
        "envoy.config.route.v3.RouteAction.HashPolicy.Cookie",
        &["name", "ttl", "path", "attributes"],
    ),
    (
        "envoy.config.route.v3.RouteAction.HashPolicy.CookieAttribute",
        &["name", "value"],
    ),
    (
        "envoy.config.route.v3.RouteAction.HashPolicy.ConnectionProperties",
        &["source_ip"],
    ),
    (
        "envoy.config.route.v3.RouteAction.HashPolicy.QueryParameter",
        &["name"],
    ),
    (
        "envoy.config.route.v3.RouteAction.RequestMirrorPolicy",
        &[
            "cluster",
            "runtime_fraction",
            "trace_sampled",
            "disable_shadow_host_suffix_append",
        ],
    ),
    (
        "envoy.config.core.v3.RuntimeFractionalPercent",
        &["default_value"],
    ),
    (
        "envoy.config.route.v3.RouteAction.MaxStreamDuration",
        &["max_stream_duration", "grpc_timeout_header_max"],
    ),
    (
        "envoy.config.route.v3.RouteAction.UpgradeConfig",
        &["upgrade_type", "enabled"],
    ),
    (
        "envoy.config.route.v3.RetryPolicy",
        &[
            "retry_on",
            "num_retries",
            "per_try_timeout",
            "retry_host_predicate",
            "retry_priority",
            "host_selection_retry_max_attempts",
            "retriable_status_codes",
            "retry_back_off",
        ],
    ),
    (
        "envoy.config.route.v3.RetryPolicy.RetryHostPredicate",
        &["name", "typed_config"],
    ),
    (
        "envoy.config.route.v3.RetryPolicy.RetryBackOff",
        &["base_interval", "max_interval"],
    ),
    (
        "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate",
        &[],
    ),
    (
        "envoy.config.route.v3.RetryPolicy.RetryPriority",
        &["name", "typed_config"],
    ),
    (
        "envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
        &["update_frequency"],
    ),
    ("envoy.config.route.v3.WeightedCluster", &["clusters", "total_weight"]),
    (
        "envoy.config.route.v3.WeightedCluster.ClusterWeight",
        &[
            "name",
            "weight",
            "request_headers_to_add",
            "request_headers_to_remove",
            "response_headers_to_add",
            "response_headers_to_remove",
            "typed_per_filter_config",
        ],
    ),
    (
        "envoy.config.route.v3.RedirectAction",
        &[
            "scheme_redirect",
            "https_redirect",
            "host_redirect",
            "port_redirect",
            "path_redirect",
            "prefix_rewrite",
            "response_code",
            "strip_query",
        ],
    ),
    ("envoy.config.route.v3.DirectResponseAction", &["status", "body"]),
    ("envoy.config.route.v3.Decorator", &["operation"]),
    ("envoy.config.core.v3.Metadata", &["filter_metadata"]),
    (
        "envoy.config.core.v3.HeaderValueOption",
        &["header", "append", "append_action"],
    ),
    ("envoy.config.core.v3.HeaderValue", &["key", "value"]),
    (
        "envoy.config.route.v3.HeaderMatcher",
        &[
            "name",
            "exact_match",
            "prefix_match",
            "suffix_match",
            "contains_match",
            "safe_regex_match",
            "present_match",
            "string_match",
            "invert_match",
        ],
    ),
    (
        "envoy.config.route.v3.QueryParameterMatcher",
        &["name", "string_match", "present_match"],
    ),
    // Access logs: Envoy's file logger to /dev/stdout in Istio's default formats, with a
    // response flag filter (see `access_log.rs`); other filters and format options are refused.
    ("envoy.config.accesslog.v3.AccessLog", &["name", "typed_config", "filter"]),
    ("envoy.config.accesslog.v3.AccessLogFilter", &["response_flag_filter"]),
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
    ("envoy.config.core.v3.JsonFormatOptions", &["sort_properties"]),
    // Clusters.
    (
        "envoy.config.cluster.v3.Cluster.RingHashLbConfig",
        &["minimum_ring_size", "maximum_ring_size", "hash_function"],
    ),
    ("envoy.config.cluster.v3.Cluster.MaglevLbConfig", &["table_size"]),
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
    ("envoy.config.cluster.v3.Cluster.CommonLbConfig.LocalityWeightedLbConfig", &[]),
    // The DNS resolver: c-ares on the system's resolv.conf. The converter refuses what changes
    // resolution (custom resolvers, unroutable-family filtering, resolver options);
    // `udp_max_queries` (istiod's, on every DNS cluster) and a fallback flag without resolvers
    // change nothing of what a name resolves to.
    ("envoy.config.core.v3.TypedExtensionConfig", &["name", "typed_config"]),
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
    ("envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer", &[]),
    // TLS.
    (
        "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        &["common_tls_context", "sni"],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        &["common_tls_context", "require_client_certificate"],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.CommonTlsContext",
        &[
            "tls_params",
            "alpn_protocols",
            "tls_certificate_sds_secret_configs",
            "combined_validation_context",
            "validation_context",
            "validation_context_sds_secret_config",
        ],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.TlsParameters",
        &[
            "tls_minimum_protocol_version",
            "tls_maximum_protocol_version",
            "cipher_suites",
        ],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.CommonTlsContext.CombinedCertificateValidationContext",
        &["default_validation_context", "validation_context_sds_secret_config"],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.CertificateValidationContext",
        &[
            "match_subject_alt_names",
            "match_typed_subject_alt_names",
            // Only in SDS secrets; a transport socket's own is refused by the converter.
            "trusted_ca",
            "custom_validator_config",
        ],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.SubjectAltNameMatcher",
        &["san_type", "matcher"],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.SdsSecretConfig",
        &["name", "sds_config"],
    ),
    // SDS secrets (istiod's `credentialName` ones; `remora xds validate`'s `secrets.json`).
    // A CRL or an OCSP staple is refused by name: Remora checks no revocation, staples none.
    (
        "envoy.extensions.transport_sockets.tls.v3.Secret",
        &["name", "tls_certificate", "validation_context"],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.TlsCertificate",
        &["certificate_chain", "private_key"],
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
        &["locality", "lb_endpoints", "load_balancing_weight", "priority"],
    ),
    (
        "envoy.config.endpoint.v3.LbEndpoint",
        &["endpoint", "health_status", "metadata", "load_balancing_weight"],
    ),
    ("envoy.config.endpoint.v3.Endpoint", &["address", "health_check_config"]),
    // Envoy's config dump prints its own default as `health_check_config: {}`; anything set in
    // it is a health check Remora does not run.
    ("envoy.config.endpoint.v3.Endpoint.HealthCheckConfig", &[]),
];
