//! A route's `hash_policy` into [`crate::model::hash`].

use super::super::common::duration;
use crate::model::hash::{GeneratedCookie, HashKind, HashPolicy};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::route::v3 as pb;

/// Convert a route action's hash policies (at `path`, the action's).
pub fn hash_policies(a: &pb::RouteAction, path: &str) -> Result<Vec<HashPolicy>, Fault> {
    use pb::route_action::hash_policy::PolicySpecifier as P;
    let mut out = Vec::with_capacity(a.hash_policy.len());
    for (i, h) in a.hash_policy.iter().enumerate() {
        let at = format!("{path}.hash_policy[{i}]");
        let kind = match &h.policy_specifier {
            Some(P::Header(header)) => {
                if header.header_name.is_empty() {
                    return Err(Fault::new(format!("{at}.header.header_name"), "empty"));
                }
                HashKind::Header(header.header_name.to_ascii_lowercase())
            }
            Some(P::Cookie(c)) => {
                if c.name.is_empty() {
                    return Err(Fault::new(format!("{at}.cookie.name"), "empty"));
                }
                match &c.ttl {
                    // Without a TTL, `path` and `attributes` are of no use (no cookie is made).
                    None => HashKind::Cookie(c.name.clone()),
                    Some(ttl) => {
                        let ttl = duration(ttl, &format!("{at}.cookie.ttl"))?;
                        HashKind::GeneratedCookie(GeneratedCookie {
                            name: c.name.clone(),
                            // Envoy takes the TTL's whole seconds for Max-Age.
                            ttl_seconds: ttl.as_secs(),
                            path: c.path.clone(),
                            attributes: c
                                .attributes
                                .iter()
                                .map(|a| (a.name.clone(), a.value.clone()))
                                .collect(),
                        })
                    }
                }
            }
            // Envoy adds no method for `source_ip: false`: the policy yields nothing.
            Some(P::ConnectionProperties(p)) if !p.source_ip => continue,
            Some(P::ConnectionProperties(_)) => HashKind::SourceIp,
            Some(P::QueryParameter(q)) => {
                if q.name.is_empty() {
                    return Err(Fault::new(format!("{at}.query_parameter.name"), "empty"));
                }
                HashKind::QueryParameter(q.name.clone())
            }
            Some(P::FilterState(_)) => {
                return Err(Fault::new(
                    format!("{at}.filter_state"),
                    "filter state hashing not supported",
                ))
            }
            None => return Err(Fault::new(at, "no policy specifier")),
        };
        out.push(HashPolicy {
            kind,
            terminal: h.terminal,
        });
    }
    Ok(out)
}
