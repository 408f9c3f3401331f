//! Envoy's HTTP `ext_authz` filter into [`crate::model::ext_authz`]: the shapes istiod writes
//! for a CUSTOM AuthorizationPolicy's extension provider (`envoyExtAuthzGrpc`: a
//! `grpc_service` on an `envoy_grpc` cluster; `envoyExtAuthzHttp`: an `http_service` with its
//! header lists), switched on by istiod's shadow RBAC filter's metadata. The field check
//! (`read/authz.rs`) has already refused every field not read here.

use super::common::{duration, string_matcher};
use crate::model::ext_authz::{BodySettings, EnabledBy, ExtAuthz, HttpService, Service};
use crate::model::matcher::StringMatcher;
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3 as pb;
use envoy_types::pb::envoy::r#type::matcher::v3 as matcher;
use std::time::Duration;

/// Envoy's default check timeout when the gRPC service sets none.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(200);
/// Envoy's status for a failed check when `status_on_error` names none.
const DEFAULT_STATUS_ON_ERROR: u16 = 403;

/// The HTTP ext_authz filter at `path` (its `typed_config`).
pub fn http(f: &pb::ExtAuthz, path: &str) -> Result<ExtAuthz, Fault> {
    // AUTO (0) and V3 (2); V2 is gone from Envoy.
    if !matches!(f.transport_api_version, 0 | 2) {
        return Err(Fault::new(
            format!("{path}.transport_api_version"),
            "only the V3 authorization API is supported",
        ));
    }
    let (service, timeout) = match &f.services {
        Some(pb::ext_authz::Services::GrpcService(g)) => grpc(g, &format!("{path}.grpc_service"))?,
        Some(pb::ext_authz::Services::HttpService(h)) => {
            http_service(h, &format!("{path}.http_service"))?
        }
        None => return Err(Fault::new(path, "no authorization service")),
    };
    let status_on_error = match &f.status_on_error {
        // Envoy takes an unknown or zero code as its default, 403.
        Some(s) if (200..600).contains(&s.code) => s.code as u16,
        _ => DEFAULT_STATUS_ON_ERROR,
    };
    let with_request_body = f.with_request_body.as_ref().map(|b| BodySettings {
        max_request_bytes: b.max_request_bytes,
        allow_partial_message: b.allow_partial_message,
        pack_as_bytes: b.pack_as_bytes,
    });
    let enabled_by = f
        .filter_enabled_metadata
        .as_ref()
        .map(|m| enabled_by(m, &format!("{path}.filter_enabled_metadata")))
        .transpose()?;
    Ok(ExtAuthz {
        service,
        timeout,
        failure_mode_allow: f.failure_mode_allow,
        status_on_error,
        with_request_body,
        enabled_by,
        clear_route_cache: f.clear_route_cache,
        stat_prefix: f.stat_prefix.clone(),
    })
}

/// The network ext_authz filter at `path` (its `typed_config`): istiod writes it for a
/// CUSTOM policy on a TCP port with a gRPC provider.
pub fn network(
    f: &envoy_types::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz,
    path: &str,
) -> Result<ExtAuthz, Fault> {
    if !matches!(f.transport_api_version, 0 | 2) {
        return Err(Fault::new(
            format!("{path}.transport_api_version"),
            "only the V3 authorization API is supported",
        ));
    }
    let Some(g) = &f.grpc_service else {
        return Err(Fault::new(format!("{path}.grpc_service"), "required"));
    };
    let (service, timeout) = grpc(g, &format!("{path}.grpc_service"))?;
    let enabled_by = f
        .filter_enabled_metadata
        .as_ref()
        .map(|m| enabled_by(m, &format!("{path}.filter_enabled_metadata")))
        .transpose()?;
    Ok(ExtAuthz {
        service,
        timeout,
        failure_mode_allow: f.failure_mode_allow,
        status_on_error: DEFAULT_STATUS_ON_ERROR,
        with_request_body: None,
        enabled_by,
        clear_route_cache: false,
        stat_prefix: f.stat_prefix.clone(),
    })
}

fn grpc(g: &core::GrpcService, path: &str) -> Result<(Service, Duration), Fault> {
    use core::grpc_service::TargetSpecifier;
    let Some(TargetSpecifier::EnvoyGrpc(e)) = &g.target_specifier else {
        return Err(Fault::new(
            path,
            "only envoy_grpc (a cluster) is supported, not google_grpc",
        ));
    };
    if e.cluster_name.is_empty() {
        return Err(Fault::new(
            format!("{path}.envoy_grpc.cluster_name"),
            "empty",
        ));
    }
    let timeout = match &g.timeout {
        Some(d) => duration(d, &format!("{path}.timeout"))?,
        None => DEFAULT_TIMEOUT,
    };
    Ok((
        Service::Grpc {
            cluster: e.cluster_name.clone(),
            authority: e.authority.clone(),
        },
        timeout,
    ))
}

fn http_service(h: &pb::HttpService, path: &str) -> Result<(Service, Duration), Fault> {
    use core::http_uri::HttpUpstreamType;
    let uri_at = format!("{path}.server_uri");
    let Some(uri) = &h.server_uri else {
        return Err(Fault::new(uri_at, "required"));
    };
    let Some(HttpUpstreamType::Cluster(cluster)) = &uri.http_upstream_type else {
        return Err(Fault::new(format!("{uri_at}.cluster"), "required"));
    };
    let timeout = match &uri.timeout {
        Some(d) => duration(d, &format!("{uri_at}.timeout"))?,
        None => return Err(Fault::new(format!("{uri_at}.timeout"), "required")),
    };
    let request = h.authorization_request.clone().unwrap_or_default();
    let response = h.authorization_response.clone().unwrap_or_default();
    let list =
        |l: Option<&matcher::ListStringMatcher>, at: &str| matchers(l, &format!("{path}.{at}"));
    Ok((
        Service::Http(HttpService {
            cluster: cluster.clone(),
            uri: uri.uri.clone(),
            path_prefix: h.path_prefix.clone(),
            allowed_headers: list(
                request.allowed_headers.as_ref(),
                "authorization_request.allowed_headers",
            )?,
            allowed_upstream_headers: list(
                response.allowed_upstream_headers.as_ref(),
                "authorization_response.allowed_upstream_headers",
            )?,
            allowed_client_headers: list(
                response.allowed_client_headers.as_ref(),
                "authorization_response.allowed_client_headers",
            )?,
        }),
        timeout,
    ))
}

fn matchers(
    l: Option<&matcher::ListStringMatcher>,
    path: &str,
) -> Result<Vec<StringMatcher>, Fault> {
    l.map(|l| l.patterns.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, m)| string_matcher(m, &format!("{path}.patterns[{i}]")))
        .collect()
}

/// istiod's `filter_enabled_metadata`: a string matcher on one key of one filter's metadata.
fn enabled_by(m: &matcher::MetadataMatcher, path: &str) -> Result<EnabledBy, Fault> {
    use matcher::metadata_matcher::path_segment::Segment;
    use matcher::value_matcher::MatchPattern as V;
    if m.invert {
        return Err(Fault::new(
            format!("{path}.invert"),
            "an inverted filter_enabled_metadata not supported",
        ));
    }
    let key = match m.path.as_slice() {
        [one] => match &one.segment {
            Some(Segment::Key(k)) => k.clone(),
            None => return Err(Fault::new(format!("{path}.path"), "empty path segment")),
        },
        _ => {
            return Err(Fault::new(
                format!("{path}.path"),
                "only a one-key metadata path is supported (istiod's)",
            ))
        }
    };
    let matcher = match m.value.as_ref().and_then(|v| v.match_pattern.as_ref()) {
        Some(V::StringMatch(s)) => string_matcher(s, &format!("{path}.value.string_match"))?,
        _ => {
            return Err(Fault::new(
                format!("{path}.value"),
                "only a string match is supported (istiod's)",
            ))
        }
    };
    Ok(EnabledBy {
        filter: m.filter.clone(),
        key,
        matcher,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(value: serde_json::Value) -> Result<ExtAuthz, Fault> {
        let f: pb::ExtAuthz = crate::json::from_json_typed(
            &value,
            "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
        )
        .expect("reads");
        http(&f, "p")
    }

    /// The gRPC provider as istiod writes it (the `authz-sidecar` dump's filter).
    #[test]
    fn istiods_grpc_provider_becomes_data() {
        let a = read(json!({
            "grpc_service": {"envoy_grpc": {"cluster_name": "outbound|9191||sample-ext-authz-grpc",
                "authority": "sample-ext-authz-grpc.local"}, "timeout": "600s"},
            "with_request_body": {"max_request_bytes": 8000},
            "transport_api_version": "V3",
            "filter_enabled_metadata": {"filter": "envoy.filters.http.rbac",
                "path": [{"key": "istio_ext_authz_shadow_effective_policy_id"}],
                "value": {"string_match": {"prefix": "istio-ext-authz"}}}
        }))
        .expect("accepted");
        assert_eq!(
            a.service,
            Service::Grpc {
                cluster: "outbound|9191||sample-ext-authz-grpc".into(),
                authority: "sample-ext-authz-grpc.local".into()
            }
        );
        assert_eq!(a.timeout, Duration::from_secs(600));
        assert!(!a.failure_mode_allow);
        assert!(
            !a.clear_route_cache,
            "istiod's: the route chosen before the check"
        );
        assert_eq!(a.status_on_error, 403);
        assert_eq!(
            a.with_request_body,
            Some(BodySettings {
                max_request_bytes: 8000,
                allow_partial_message: false,
                pack_as_bytes: false
            })
        );
        let on = a.enabled_by.expect("metadata");
        assert_eq!(
            (on.filter.as_str(), on.key.as_str()),
            (
                "envoy.filters.http.rbac",
                "istio_ext_authz_shadow_effective_policy_id"
            )
        );
        assert!(on
            .matcher
            .matches("istio-ext-authz-ns[foo]-policy[ext]-rule[0]"));
        assert!(!on.matcher.matches("ns[foo]-policy[ext]-rule[0]"));
    }

    /// The HTTP provider: its header lists, fail-open and status on error.
    #[test]
    fn istiods_http_provider_becomes_data() {
        let a = read(json!({
            "http_service": {
                "server_uri": {"uri": "http://ext-authz.foo.svc.cluster.local",
                    "cluster": "outbound|8000||ext-authz.foo.svc.cluster.local", "timeout": "600s"},
                "path_prefix": "/check",
                "authorization_request": {"allowed_headers": {"patterns": [{"exact": "x-ext-authz"}]}},
                "authorization_response": {
                    "allowed_upstream_headers": {"patterns": [{"exact": "x-ext-authz-check-result"}]},
                    "allowed_client_headers": {"patterns": [{"exact": "x-ext-authz-check-result"}]}}},
            "failure_mode_allow": true,
            "clear_route_cache": true,
            "status_on_error": {"code": 503},
            "transport_api_version": "V3"
        }))
        .expect("accepted");
        let Service::Http(h) = &a.service else {
            panic!("http")
        };
        assert_eq!(h.cluster, "outbound|8000||ext-authz.foo.svc.cluster.local");
        assert_eq!(h.path_prefix, "/check");
        assert!(h.allowed_headers[0].matches("x-ext-authz"));
        assert!(h.allowed_upstream_headers[0].matches("x-ext-authz-check-result"));
        assert_eq!(h.allowed_client_headers.len(), 1);
        assert!(a.failure_mode_allow);
        assert!(a.clear_route_cache);
        assert_eq!(a.status_on_error, 503);
        assert_eq!(a.enabled_by, None);
    }

    /// The network filter istiod writes for a CUSTOM policy on a TCP port.
    #[test]
    fn istiods_network_filter_becomes_data() {
        let f: envoy_types::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz =
            crate::json::from_json_typed(
                &json!({
                    "stat_prefix": "tcp.",
                    "grpc_service": {"envoy_grpc": {"cluster_name": "outbound|9191||authz",
                        "authority": "outbound_.9191_._.authz"}, "timeout": "2s"},
                    "failure_mode_allow": true,
                    "transport_api_version": "V3",
                    "filter_enabled_metadata": {"filter": "envoy.filters.network.rbac",
                        "path": [{"key": "istio_ext_authz_shadow_effective_policy_id"}],
                        "value": {"string_match": {"prefix": "istio-ext-authz"}}}
                }),
                "envoy.extensions.filters.network.ext_authz.v3.ExtAuthz",
            )
            .expect("reads");
        let a = network(&f, "p").expect("accepted");
        assert!(
            matches!(&a.service, Service::Grpc { cluster, .. } if cluster == "outbound|9191||authz")
        );
        assert_eq!(a.timeout, Duration::from_secs(2));
        assert!(a.failure_mode_allow);
        assert_eq!(
            a.enabled_by.map(|e| e.filter),
            Some("envoy.filters.network.rbac".to_string())
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let google =
            read(json!({"grpc_service": {"google_grpc": {"target_uri": "x", "stat_prefix": "x"}}}))
                .expect_err("refused");
        assert!(google.reason.contains("envoy_grpc"), "{google:?}");
        let none = read(json!({"failure_mode_allow": true})).expect_err("refused");
        assert_eq!(none.reason, "no authorization service");
        let inverted = read(json!({
            "grpc_service": {"envoy_grpc": {"cluster_name": "c"}},
            "filter_enabled_metadata": {"filter": "f", "path": [{"key": "k"}],
                "value": {"string_match": {"exact": "x"}}, "invert": true}
        }))
        .expect_err("refused");
        assert_eq!(inverted.path, "p.filter_enabled_metadata.invert");
        let two_keys = read(json!({
            "grpc_service": {"envoy_grpc": {"cluster_name": "c"}},
            "filter_enabled_metadata": {"filter": "f", "path": [{"key": "a"}, {"key": "b"}],
                "value": {"string_match": {"exact": "x"}}}
        }))
        .expect_err("refused");
        assert_eq!(two_keys.path, "p.filter_enabled_metadata.path");
        let no_timeout =
            read(json!({"http_service": {"server_uri": {"uri": "http://a", "cluster": "c"}}}))
                .expect_err("refused");
        assert_eq!(no_timeout.path, "p.http_service.server_uri.timeout");
    }
}
