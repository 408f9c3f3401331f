//! Route tables: virtual hosts, routes and their matches, actions (weights, retries, hashing,
//! mirrors, redirects, direct responses) and header rewrites.

use super::Table;

/// Message full name → the fields Remora reads in it.
pub(super) const READ: Table = &[
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
    (
        "envoy.config.route.v3.WeightedCluster",
        &["clusters", "total_weight"],
    ),
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
    (
        "envoy.config.route.v3.DirectResponseAction",
        &["status", "body"],
    ),
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
];
