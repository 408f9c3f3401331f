//! RouteConfiguration (RDS, or inline in an HTTP connection manager) into
//! [`crate::model::route`].

use super::common::{
    duration, filter_metadata, header_edits, header_matcher, regex, string_matcher, struct_string,
    timeout,
};
use super::join;
use crate::model::cors::{Cors, CorsPolicy};
use crate::model::domains::DomainIndex;
use crate::model::fault::FaultPolicy;
use crate::model::route::{
    Action, ClusterTarget, Forward, PathMatch, QueryParameterMatcher, Redirect, Route,
    RouteConfiguration, RouteMatch, Upgrade, VirtualHost, WeightedCluster, DEFAULT_ROUTE_TIMEOUT,
};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::route::v3 as pb;
use fault::per_filter_configs;
use retry::retry_policy;
use std::sync::Arc;

/// Convert a route table (`path` is where it sits: empty for RDS).
pub fn route_configuration(
    rc: &pb::RouteConfiguration,
    path: &str,
) -> Result<RouteConfiguration, Fault> {
    let per_filter = per_filter_configs(
        &rc.typed_per_filter_config,
        &join(path, "typed_per_filter_config"),
    )?;
    let table_cors: Vec<_> = per_filter.cors.into_iter().collect();
    let virtual_hosts: Vec<_> = rc
        .virtual_hosts
        .iter()
        .enumerate()
        .map(|(i, vh)| {
            virtual_host(
                vh,
                &join(path, &format!("virtual_hosts[{i}]")),
                per_filter.fault.as_ref(),
                &table_cors,
            )
        })
        .collect::<Result<_, _>>()?;
    direct_response_bodies_fit(rc, path)?;
    Ok(RouteConfiguration {
        name: rc.name.clone(),
        domains: DomainIndex::of(&virtual_hosts),
        virtual_hosts,
        ignore_port_in_host_matching: rc.ignore_port_in_host_matching,
        validate_clusters: rc.validate_clusters.as_ref().is_some_and(|b| b.value),
        request_headers_to_add: header_edits(
            &rc.request_headers_to_add,
            &join(path, "request_headers_to_add"),
        )?,
        request_headers_to_remove: rc.request_headers_to_remove.clone(),
        response_headers_to_add: header_edits(
            &rc.response_headers_to_add,
            &join(path, "response_headers_to_add"),
        )?,
        response_headers_to_remove: rc.response_headers_to_remove.clone(),
    })
}

/// Envoy's bound on a direct response's body when the table sets none (istiod sets 1 MiB).
const DIRECT_RESPONSE_BODY_MAX: u64 = 4096;

/// Envoy refuses a table whose direct-response bodies exceed its
/// `max_direct_response_body_size_bytes`; so does Remora, which then serves every body it holds.
fn direct_response_bodies_fit(rc: &pb::RouteConfiguration, path: &str) -> Result<(), Fault> {
    let max = rc
        .max_direct_response_body_size_bytes
        .as_ref()
        .map_or(DIRECT_RESPONSE_BODY_MAX, |m| u64::from(m.value));
    for (i, vh) in rc.virtual_hosts.iter().enumerate() {
        for (j, r) in vh.routes.iter().enumerate() {
            let Some(pb::route::Action::DirectResponse(d)) = &r.action else {
                continue;
            };
            let len = match d.body.as_ref().and_then(|b| b.specifier.as_ref()) {
                Some(core::data_source::Specifier::InlineString(s)) => s.len(),
                Some(core::data_source::Specifier::InlineBytes(b)) => b.len(),
                _ => 0,
            };
            if u64::try_from(len).unwrap_or(u64::MAX) > max {
                return Err(Fault::new(
                    join(
                        path,
                        &format!("virtual_hosts[{i}].routes[{j}].direct_response.body"),
                    ),
                    format!(
                        "a body of {len} bytes is over max_direct_response_body_size_bytes ({max})"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A virtual host; `table_fault` is its table's fault config, which its own replaces;
/// `table_cors` its table's cors config, if any, which its own comes before.
fn virtual_host(
    vh: &pb::VirtualHost,
    path: &str,
    table_fault: Option<&Arc<FaultPolicy>>,
    table_cors: &[Arc<CorsPolicy>],
) -> Result<VirtualHost, Fault> {
    let own = per_filter_configs(
        &vh.typed_per_filter_config,
        &format!("{path}.typed_per_filter_config"),
    )?;
    let fault = own.fault.as_ref().or(table_fault);
    let cors: Vec<_> = own
        .cors
        .into_iter()
        .chain(table_cors.iter().cloned())
        .collect();
    let routes = vh
        .routes
        .iter()
        .enumerate()
        .map(|(i, r)| route(r, &format!("{path}.routes[{i}]"), fault, &cors).map(Arc::new))
        .collect::<Result<_, _>>()?;
    Ok(VirtualHost {
        name: vh.name.clone(),
        domains: vh.domains.clone(),
        routes,
        retry_policy: vh
            .retry_policy
            .as_ref()
            .map(|r| retry_policy(r, &format!("{path}.retry_policy")))
            .transpose()?,
        include_request_attempt_count: vh.include_request_attempt_count,
        request_headers_to_add: header_edits(
            &vh.request_headers_to_add,
            &format!("{path}.request_headers_to_add"),
        )?,
        request_headers_to_remove: vh.request_headers_to_remove.clone(),
        response_headers_to_add: header_edits(
            &vh.response_headers_to_add,
            &format!("{path}.response_headers_to_add"),
        )?,
        response_headers_to_remove: vh.response_headers_to_remove.clone(),
    })
}

/// A route; `vhost_fault` is the fault config it inherits, which its own replaces;
/// `vhost_cors` the cors configs it inherits (most specific first), which its own comes before.
fn route(
    r: &pb::Route,
    path: &str,
    vhost_fault: Option<&Arc<FaultPolicy>>,
    vhost_cors: &[Arc<CorsPolicy>],
) -> Result<Route, Fault> {
    let own = per_filter_configs(
        &r.typed_per_filter_config,
        &format!("{path}.typed_per_filter_config"),
    )?;
    let fault = own.fault.or_else(|| vhost_fault.cloned());
    let policies: Vec<_> = own
        .cors
        .into_iter()
        .chain(vhost_cors.iter().cloned())
        .collect();
    let cors = (!policies.is_empty()).then(|| Arc::new(Cors { policies }));
    let matcher = route_match(
        r.r#match
            .as_ref()
            .ok_or_else(|| Fault::new(path, "no match"))?,
        &format!("{path}.match"),
    )?;
    let action = match &r.action {
        Some(pb::route::Action::Route(a)) => Action::Forward(Box::new(forward(
            a,
            &format!("{path}.route"),
            fault.as_ref(),
        )?)),
        Some(pb::route::Action::Redirect(r)) => {
            Action::Redirect(redirect(r, &format!("{path}.redirect"))?)
        }
        Some(pb::route::Action::DirectResponse(d)) => {
            let at = format!("{path}.direct_response");
            // Envoy's constraint on the field: a final status, [200, 600).
            let status = u16::try_from(d.status)
                .ok()
                .filter(|s| (200..600).contains(s))
                .ok_or_else(|| {
                    Fault::new(
                        format!("{at}.status"),
                        format!("status {} is not in [200, 600)", d.status),
                    )
                })?;
            let body = match d.body.as_ref().and_then(|b| b.specifier.as_ref()) {
                None => None,
                Some(core::data_source::Specifier::InlineString(s)) => Some(s.clone()),
                Some(core::data_source::Specifier::InlineBytes(b)) => {
                    Some(String::from_utf8_lossy(b).into_owned())
                }
                Some(_) => {
                    return Err(Fault::new(
                        format!("{at}.body"),
                        "only inline bodies are supported",
                    ))
                }
            };
            Action::DirectResponse { status, body }
        }
        _ => return Err(Fault::new(path, "route action not supported")),
    };
    let fault_per_cluster = match &action {
        Action::Forward(f) => match &f.target {
            ClusterTarget::Weighted(set) => set
                .iter()
                .any(|c| c.fault.as_ref().map(Arc::as_ptr) != fault.as_ref().map(Arc::as_ptr)),
            ClusterTarget::Cluster(_) => false,
        },
        _ => false,
    };
    let istio_config =
        filter_metadata(r.metadata.as_ref(), "istio").and_then(|s| struct_string(s, "config"));
    Ok(Route {
        name: (!r.name.is_empty()).then(|| r.name.clone()),
        matcher,
        action,
        decorator: r.decorator.as_ref().map(|d| d.operation.clone()),
        istio_config,
        fault,
        fault_per_cluster,
        cors,
        request_headers_to_add: header_edits(
            &r.request_headers_to_add,
            &format!("{path}.request_headers_to_add"),
        )?,
        request_headers_to_remove: r.request_headers_to_remove.clone(),
        response_headers_to_add: header_edits(
            &r.response_headers_to_add,
            &format!("{path}.response_headers_to_add"),
        )?,
        response_headers_to_remove: r.response_headers_to_remove.clone(),
    })
}

fn route_match(m: &pb::RouteMatch, path: &str) -> Result<RouteMatch, Fault> {
    use pb::route_match::PathSpecifier as P;
    let path_match = match &m.path_specifier {
        Some(P::Prefix(p)) => PathMatch::Prefix(p.clone()),
        Some(P::Path(p)) => PathMatch::Exact(p.clone()),
        Some(P::SafeRegex(r)) => PathMatch::Regex(regex(r, &format!("{path}.safe_regex"))?),
        Some(P::PathSeparatedPrefix(p)) => PathMatch::PathSeparatedPrefix(p.clone()),
        Some(P::ConnectMatcher(_)) => PathMatch::Connect,
        _ => return Err(Fault::new(path, "path match kind not supported")),
    };
    let headers = m
        .headers
        .iter()
        .enumerate()
        .map(|(i, h)| header_matcher(h, &format!("{path}.headers[{i}]")))
        .collect::<Result<_, _>>()?;
    let query_parameters = m
        .query_parameters
        .iter()
        .enumerate()
        .map(|(i, q)| {
            use pb::query_parameter_matcher::QueryParameterMatchSpecifier as Q;
            let at = format!("{path}.query_parameters[{i}]");
            let value = match &q.query_parameter_match_specifier {
                Some(Q::StringMatch(s)) => Some(string_matcher(s, &format!("{at}.string_match"))?),
                Some(Q::PresentMatch(true)) | None => None,
                Some(Q::PresentMatch(false)) => {
                    return Err(Fault::new(
                        format!("{at}.present_match"),
                        "present_match false not supported",
                    ))
                }
            };
            Ok(QueryParameterMatcher {
                name: q.name.clone(),
                value,
            })
        })
        .collect::<Result<_, Fault>>()?;
    Ok(RouteMatch {
        path: path_match,
        case_sensitive: m.case_sensitive.as_ref().is_none_or(|b| b.value),
        headers,
        query_parameters,
        grpc: m.grpc.is_some(),
    })
}

fn forward(
    a: &pb::RouteAction,
    path: &str,
    route_fault: Option<&Arc<FaultPolicy>>,
) -> Result<Forward, Fault> {
    use pb::route_action::ClusterSpecifier as C;
    let target = match &a.cluster_specifier {
        Some(C::Cluster(c)) => ClusterTarget::Cluster(c.clone()),
        Some(C::WeightedClusters(w)) => ClusterTarget::Weighted(weighted(
            w,
            &format!("{path}.weighted_clusters"),
            route_fault,
        )?),
        _ => {
            return Err(Fault::new(
                path,
                "cluster specifier not supported (cluster or weighted_clusters only)",
            ))
        }
    };
    let host_rewrite = match &a.host_rewrite_specifier {
        None => None,
        Some(pb::route_action::HostRewriteSpecifier::HostRewriteLiteral(h)) => Some(h.clone()),
        Some(_) => {
            return Err(Fault::new(
                path,
                "host rewrite kind not supported (literal only)",
            ))
        }
    };
    let (max_stream_duration, mut grpc_timeout_header_max) = match &a.max_stream_duration {
        None => (None, None),
        Some(m) => {
            let at = format!("{path}.max_stream_duration");
            if m.grpc_timeout_header_offset.is_some() {
                return Err(Fault::new(
                    format!("{at}.grpc_timeout_header_offset"),
                    "not supported",
                ));
            }
            (
                timeout(
                    m.max_stream_duration.as_ref(),
                    None,
                    &format!("{at}.max_stream_duration"),
                )?,
                m.grpc_timeout_header_max
                    .as_ref()
                    .map(|d| duration(d, &format!("{at}.grpc_timeout_header_max")))
                    .transpose()?,
            )
        }
    };
    #[allow(deprecated)]
    if let Some(d) = &a.max_grpc_timeout {
        // The older field for the same bound; the newer one wins when both are set.
        if grpc_timeout_header_max.is_none() {
            grpc_timeout_header_max = Some(duration(d, &format!("{path}.max_grpc_timeout"))?);
        }
    }
    let upgrades = a
        .upgrade_configs
        .iter()
        .enumerate()
        .map(|(i, u)| {
            if u.connect_config.is_some() {
                return Err(Fault::new(
                    format!("{path}.upgrade_configs[{i}].connect_config"),
                    "CONNECT termination not supported",
                ));
            }
            Ok(Upgrade {
                upgrade_type: u.upgrade_type.clone(),
                enabled: u.enabled.as_ref().is_none_or(|b| b.value),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Forward {
        target,
        timeout: timeout(
            a.timeout.as_ref(),
            Some(DEFAULT_ROUTE_TIMEOUT),
            &format!("{path}.timeout"),
        )?,
        idle_timeout: a
            .idle_timeout
            .as_ref()
            .map(|d| duration(d, &format!("{path}.idle_timeout")))
            .transpose()?,
        retry_policy: a
            .retry_policy
            .as_ref()
            .map(|r| retry_policy(r, &format!("{path}.retry_policy")))
            .transpose()?,
        upgrades,
        max_stream_duration,
        grpc_timeout_header_max,
        prefix_rewrite: (!a.prefix_rewrite.is_empty()).then(|| a.prefix_rewrite.clone()),
        host_rewrite,
        mirrors: mirror::mirror_policies(&a.request_mirror_policies, path)?.into(),
        hash_policy: hash::hash_policies(a, path)?,
    })
}

fn weighted(
    w: &pb::WeightedCluster,
    path: &str,
    route_fault: Option<&Arc<FaultPolicy>>,
) -> Result<Vec<WeightedCluster>, Fault> {
    if w.random_value_specifier.is_some() || !w.runtime_key_prefix.is_empty() {
        return Err(Fault::new(path, "runtime-driven weights not supported"));
    }
    let clusters: Vec<WeightedCluster> = w
        .clusters
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let at = format!("{path}.clusters[{i}]");
            if !c.cluster_header.is_empty() {
                return Err(Fault::new(
                    &at,
                    "cluster_header in weighted clusters not supported",
                ));
            }
            let own = per_filter_configs(
                &c.typed_per_filter_config,
                &format!("{at}.typed_per_filter_config"),
            )?;
            if own.cors.is_some() {
                return Err(Fault::new(
                    format!("{at}.typed_per_filter_config[{}]", cors::CORS_FILTER),
                    "a weighted cluster's cors config not supported (a route's or virtual host's only)",
                ));
            }
            Ok(WeightedCluster {
                name: c.name.clone(),
                weight: c.weight.as_ref().map_or(0, |w| w.value),
                fault: own.fault.or_else(|| route_fault.cloned()),
                request_headers_to_add: header_edits(
                    &c.request_headers_to_add,
                    &format!("{at}.request_headers_to_add"),
                )?,
                request_headers_to_remove: c.request_headers_to_remove.clone(),
                response_headers_to_add: header_edits(
                    &c.response_headers_to_add,
                    &format!("{at}.response_headers_to_add"),
                )?,
                response_headers_to_remove: c.response_headers_to_remove.clone(),
            })
        })
        .collect::<Result<_, _>>()?;
    // Envoy refuses a set that can pick nothing.
    if clusters.iter().all(|c| c.weight == 0) {
        return Err(Fault::new(
            path,
            "the sum of the weights must be greater than 0",
        ));
    }
    // The deprecated total must be the sum (Envoy refuses it otherwise); the weights alone
    // are what the model keeps.
    if let Some(total) = &w.total_weight {
        let sum: u64 = clusters.iter().map(|c| u64::from(c.weight)).sum();
        if u64::from(total.value) != sum {
            return Err(Fault::new(
                format!("{path}.total_weight"),
                format!(
                    "total_weight {} is not the sum of the weights ({sum})",
                    total.value
                ),
            ));
        }
    }
    Ok(clusters)
}

fn redirect(r: &pb::RedirectAction, path: &str) -> Result<Redirect, Fault> {
    use pb::redirect_action::{PathRewriteSpecifier as P, SchemeRewriteSpecifier as S};
    let (redirect_path, prefix_rewrite) = match &r.path_rewrite_specifier {
        None => (None, None),
        Some(P::PathRedirect(p)) => (Some(p.clone()), None),
        Some(P::PrefixRewrite(p)) => (None, Some(p.clone())),
        Some(_) => return Err(Fault::new(path, "regex path redirects not supported")),
    };
    let status = match r.response_code {
        0 => 301,
        1 => 302,
        2 => 303,
        3 => 307,
        4 => 308,
        _ => {
            return Err(Fault::new(
                format!("{path}.response_code"),
                "unknown redirect code",
            ))
        }
    };
    Ok(Redirect {
        scheme: match &r.scheme_rewrite_specifier {
            Some(S::HttpsRedirect(true)) => Some("https".into()),
            Some(S::SchemeRedirect(s)) => Some(s.clone()),
            _ => None,
        },
        host: (!r.host_redirect.is_empty()).then(|| r.host_redirect.clone()),
        port: match r.port_redirect {
            0 => None,
            p => {
                Some(u16::try_from(p).map_err(|_| {
                    Fault::new(format!("{path}.port_redirect"), "port out of range")
                })?)
            }
        },
        path: redirect_path,
        prefix_rewrite,
        status,
        strip_query: r.strip_query,
    })
}

mod cors;
mod fault;
mod hash;
mod mirror;
mod retry;
#[cfg(test)]
mod tests;
