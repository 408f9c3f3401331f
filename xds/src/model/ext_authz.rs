//! Envoy's `ext_authz` HTTP filter as data: what istiod writes for an AuthorizationPolicy with
//! the CUSTOM action (a mesh `extensionProviders` entry, `envoyExtAuthzGrpc` or
//! `envoyExtAuthzHttp`). Which requests are sent, to which authorizer, and what its answer or
//! its failure does. Calling the authorizer is the proxy's business; this is what to call.

use super::matcher::StringMatcher;
use std::time::Duration;

/// One `envoy.filters.http.ext_authz` filter.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtAuthz {
    /// The authorizer and how it is spoken to.
    pub service: Service,
    /// How long a check may take (`grpc_service.timeout` or `server_uri.timeout`); istiod
    /// writes 600 s, leaving the real bound to the authorizer cluster's settings.
    pub timeout: Duration,
    /// The authorizer failed (unreachable, timed out, a 5xx or a gRPC error): let the request
    /// through (`failure_mode_allow`) rather than answer `status_on_error`.
    pub failure_mode_allow: bool,
    /// The status of the local reply when the authorizer failed and failure is not allowed
    /// (Envoy's default 403).
    pub status_on_error: u16,
    /// The request body is buffered and sent along (`with_request_body`).
    pub with_request_body: Option<BodySettings>,
    /// Only requests whose dynamic metadata matches this are checked (istiod's shadow RBAC
    /// filter names the requests its CUSTOM policies select); `None`: every request.
    pub enabled_by: Option<EnabledBy>,
    /// `clear_route_cache`: the route is chosen again on the request as the authorizer left
    /// it. Unset (istiod's), the route stays the one chosen before the check, on the request
    /// as the client sent it (Envoy's filters before it, RBAC's, have chosen it by then).
    pub clear_route_cache: bool,
    /// `stat_prefix`: the network filter's statistics are `ext_authz.<stat_prefix>.*`
    /// (istiod writes `tcp.`); the HTTP filter's, under its connection manager's.
    pub stat_prefix: String,
}

/// Where the authorizer is and which protocol it speaks.
#[derive(Debug, Clone, PartialEq)]
pub enum Service {
    /// `envoy.service.auth.v3.Authorization/Check` over gRPC (`grpc_service.envoy_grpc`).
    Grpc {
        cluster: String,
        /// The `:authority` of the call; the cluster's name when empty.
        authority: String,
    },
    /// A plain HTTP request per check (`http_service`): the client's method and path (after
    /// `path_prefix`), the allowed headers, an empty body or the buffered one.
    Http(HttpService),
}

/// The HTTP authorizer's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpService {
    /// `server_uri.cluster`.
    pub cluster: String,
    /// `server_uri.uri`: its authority is the check request's `Host` only when the client's
    /// own Host is not among the allowed headers (it always is: Envoy allows `host` by default).
    pub uri: String,
    /// Put before the client's path.
    pub path_prefix: String,
    /// Client headers copied to the check besides Envoy's always-allowed `authorization`,
    /// `:method`, `:path` and `host` (`authorization_request.allowed_headers`).
    pub allowed_headers: Vec<StringMatcher>,
    /// On 200, the authorizer's headers set on the request going upstream
    /// (`authorization_response.allowed_upstream_headers`; none when empty).
    pub allowed_upstream_headers: Vec<StringMatcher>,
    /// On a denial, the authorizer's headers passed to the client
    /// (`authorization_response.allowed_client_headers`; when empty, all but `host`; when
    /// set, these and Envoy's `:status`, `content-length`, `www-authenticate`, `location`).
    pub allowed_client_headers: Vec<StringMatcher>,
}

/// `with_request_body`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodySettings {
    /// At most this much of the body is buffered and sent.
    pub max_request_bytes: u32,
    /// A longer body is cut to `max_request_bytes` and sent anyway; otherwise it is answered
    /// 413.
    pub allow_partial_message: bool,
    /// gRPC: the body goes in `raw_body` (bytes) rather than `body` (a UTF-8 string).
    pub pack_as_bytes: bool,
}

/// `filter_enabled_metadata` as istiod writes it: a string under one key of a filter's
/// dynamic metadata (`envoy.filters.http.rbac`'s `istio_ext_authz_shadow_effective_policy_id`,
/// which the shadow RBAC filter with that stat prefix writes when one of its policies matches).
#[derive(Debug, Clone, PartialEq)]
pub struct EnabledBy {
    /// The metadata namespace (`envoy.filters.http.rbac`).
    pub filter: String,
    /// The key inside it.
    pub key: String,
    pub matcher: StringMatcher,
}
