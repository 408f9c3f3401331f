//! Authorization: the RBAC and ext_authz filters (HTTP and network), RBAC policies, and the
//! matchers they use (string, metadata, filter state).

use super::Table;

/// Message full name → the fields Remora reads in it.
pub(super) const READ: Table = &[
    (
        "envoy.extensions.filters.http.rbac.v3.RBAC",
        &["rules", "shadow_rules", "shadow_rules_stat_prefix"],
    ),
    (
        "envoy.extensions.filters.network.rbac.v3.RBAC",
        &[
            "rules",
            "shadow_rules",
            "stat_prefix",
            "shadow_rules_stat_prefix",
        ],
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
    (
        "envoy.config.core.v3.GrpcService",
        &["envoy_grpc", "timeout"],
    ),
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
    (
        "envoy.config.core.v3.HttpUri",
        &["uri", "cluster", "timeout"],
    ),
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
        &[
            "max_request_bytes",
            "allow_partial_message",
            "pack_as_bytes",
        ],
    ),
    ("envoy.type.matcher.v3.ListStringMatcher", &["patterns"]),
    // RBAC policies.
    ("envoy.config.rbac.v3.RBAC", &["action", "policies"]),
    (
        "envoy.config.rbac.v3.Policy",
        &["permissions", "principals"],
    ),
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
    (
        "envoy.config.rbac.v3.Principal.Authenticated",
        &["principal_name"],
    ),
    (
        "envoy.type.matcher.v3.FilterStateMatcher",
        &["key", "string_match"],
    ),
    (
        "envoy.type.matcher.v3.MetadataMatcher",
        &["filter", "path", "value", "invert"],
    ),
    (
        "envoy.type.matcher.v3.ValueMatcher",
        &["string_match", "list_match"],
    ),
    ("envoy.type.matcher.v3.ListMatcher", &["one_of"]),
    ("envoy.type.matcher.v3.PathMatcher", &["path"]),
    (
        "envoy.type.matcher.v3.StringMatcher",
        &[
            "exact",
            "prefix",
            "suffix",
            "contains",
            "safe_regex",
            "ignore_case",
        ],
    ),
    (
        "envoy.type.matcher.v3.RegexMatcher",
        &["regex", "google_re2"],
    ),
];
