//! Envoy's RBAC filters as istiod writes them into `virtualInbound` (network RBAC before a
//! chain's `tcp_proxy`, HTTP RBAC in its connection manager), enforced as Envoy enforces them:
//! the filters run in order; each one's shadow rules are evaluated and only counted; its rules,
//! when set, decide: an ALLOW filter lets through only what some policy matches, a DENY filter
//! stops what some policy matches, a LOG filter (istiod's AUDIT) only reports. The first filter
//! that denies ends the request (403 `RBAC: access denied`) or the connection.
//!
//! This is the xDS twin of [`super::engine`], which evaluates the policy files' rules: the same
//! [`Attributes`], the same [`super::Verdict`], the same counters and log lines, so an operator
//! sees one authorization whichever way the policies arrived. The converter
//! (`remora_xds::convert::rbac`) refuses, by name, every permission and principal kind evaluated
//! here as anything but what Envoy would make of it.

use super::{Attributes, Authorizer, Verdict};
use crate::metrics::rbac_filters::ChainRbac;
use crate::metrics::{AuthzOutcome, AuthzProtocol};
use remora_xds::model::matcher::HeaderMatcher;
use remora_xds::model::rbac::{Action, Permission, Principal, Rbac, Rules};

/// The filter-state key `istio_authn` fills with the peer's SPIFFE ID (with `spiffe://`).
pub const PEER_PRINCIPAL: &str = "io.istio.peer_principal";
/// The dynamic-metadata namespace of Istio's authentication filters (JWT claims, request
/// principals). Remora validates no JWT and istiod's `jwt_authn` filter is refused, so nothing
/// is ever found under it: a metadata principal there never matches, as in Envoy without a JWT.
pub const ISTIO_AUTHN: &str = "istio_authn";

/// The first policy (in name order, as Envoy's map) of `rules` that matches, if any.
pub fn matched<'r>(rules: &'r Rules, a: &Attributes<'_>) -> Option<&'r str> {
    rules
        .policies
        .iter()
        .find(|(_, p)| {
            p.permissions.iter().any(|x| permission(x, a))
                && p.principals.iter().any(|x| principal(x, a))
        })
        .map(|(name, _)| name.as_str())
}

/// The dynamic-metadata namespace Envoy's HTTP RBAC filters write their results under.
pub const HTTP_RBAC_METADATA: &str = "envoy.filters.http.rbac";
/// The same for the network RBAC filters.
pub const NETWORK_RBAC_METADATA: &str = "envoy.filters.network.rbac";

/// The string value `filters` leave under `key` of [`HTTP_RBAC_METADATA`] (network filters:
/// [`NETWORK_RBAC_METADATA`]), as Envoy's RBAC
/// filter writes it for its shadow rules: `<shadow_rules_stat_prefix>shadow_effective_policy_id`
/// (the shadow policy that matched; not written when none did) and
/// `<shadow_rules_stat_prefix>shadow_engine_result` (`allowed` or `denied`). A later filter's
/// value replaces an earlier one's. This is how istiod's shadow RBAC filter names the requests
/// its CUSTOM policies send to the external authorizer.
pub fn shadow_metadata<'r>(
    filters: impl IntoIterator<Item = &'r Rbac>,
    a: &Attributes<'_>,
    key: &str,
) -> Option<&'r str> {
    let mut value = None;
    for filter in filters {
        let Some(shadow) = &filter.shadow_rules else {
            continue;
        };
        let Some(field) = key.strip_prefix(filter.shadow_rules_stat_prefix.as_str()) else {
            continue;
        };
        let hit = matched(shadow, a);
        match field {
            "shadow_effective_policy_id" if hit.is_some() => value = hit,
            "shadow_engine_result" => {
                let allowed = match shadow.action {
                    Action::Allow => hit.is_some(),
                    Action::Deny => hit.is_none(),
                    Action::Log => true,
                };
                value = Some(if allowed { "allowed" } else { "denied" });
            }
            _ => {}
        }
    }
    value
}

/// What the filters decided, before it is counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<'r> {
    /// `None`: no filter has enforced rules (nothing is counted as decided).
    pub decided: Option<AuthzOutcome>,
    /// The policy that decided (the matched DENY or ALLOW policy).
    pub policy: Option<&'r str>,
    /// LOG (AUDIT) policies that matched.
    pub logged: Vec<&'r str>,
    /// Shadow rules: their action is DENY, and whether they would have allowed.
    pub shadow: Vec<(bool, bool, Option<&'r str>)>,
}

impl Outcome<'_> {
    pub fn allowed(&self) -> bool {
        !matches!(
            self.decided,
            Some(AuthzOutcome::DenyMatched | AuthzOutcome::NoAllowMatched)
        )
    }
}

/// Run `filters` in order, as Envoy's filter chain runs them.
pub fn evaluate<'r>(
    filters: impl IntoIterator<Item = &'r Rbac>,
    a: &Attributes<'_>,
) -> Outcome<'r> {
    evaluate_counted(filters, a, None)
}

/// [`evaluate`], and count each filter's decisions as Envoy's filter counts them: its rules'
/// (`allowed` or `denied`) and its shadow rules' under its `shadow_rules_stat_prefix`.
pub fn evaluate_counted<'r>(
    filters: impl IntoIterator<Item = &'r Rbac>,
    a: &Attributes<'_>,
    counts: Option<&ChainRbac>,
) -> Outcome<'r> {
    let mut out = Outcome {
        decided: None,
        policy: None,
        logged: Vec::new(),
        shadow: Vec::new(),
    };
    for filter in filters {
        if let Some(shadow) = &filter.shadow_rules {
            let hit = matched(shadow, a);
            let deny = shadow.action == Action::Deny;
            let allowed = match shadow.action {
                Action::Allow => hit.is_some(),
                Action::Deny => hit.is_none(),
                Action::Log => true,
            };
            out.shadow.push((deny, allowed, hit));
            if let Some(c) = counts {
                c.shadow(filter, allowed);
            }
        }
        let Some(rules) = &filter.rules else {
            continue;
        };
        let hit = matched(rules, a);
        if let Some(c) = counts {
            // A LOG (AUDIT) filter lets everything through, and Envoy counts it so.
            let denied = matches!(
                (rules.action, hit),
                (Action::Deny, Some(_)) | (Action::Allow, None)
            );
            c.enforced(filter, !denied);
        }
        match (rules.action, hit) {
            (Action::Deny, Some(p)) => {
                out.decided = Some(AuthzOutcome::DenyMatched);
                out.policy = Some(p);
                return out;
            }
            (Action::Allow, None) => {
                out.decided = Some(AuthzOutcome::NoAllowMatched);
                out.policy = None;
                return out;
            }
            (Action::Allow, Some(p)) => {
                out.decided = Some(AuthzOutcome::AllowMatched);
                out.policy = Some(p);
            }
            (Action::Deny, None) => {
                if out.decided.is_none() {
                    out.decided = Some(AuthzOutcome::NoAllowPolicy);
                }
            }
            (Action::Log, hit) => out.logged.extend(hit),
        }
    }
    out
}

impl Authorizer {
    /// Decide by xDS RBAC `filters`, count and log as [`Authorizer::check`] does for the
    /// policy files. With no filter, nothing is evaluated or counted.
    /// `counts`: the counters of the connection's chain's RBAC filters (Envoy's
    /// `http.<prefix>.rbac.*`, or the network filters' `tcp.rbac.*`).
    pub fn check_rbac<'r>(
        &self,
        filters: impl IntoIterator<Item = &'r Rbac>,
        a: &Attributes<'_>,
        counts: Option<&ChainRbac>,
    ) -> Verdict {
        let mut filters = filters.into_iter().peekable();
        if filters.peek().is_none() {
            return Verdict::Allowed;
        }
        let outcome = evaluate_counted(filters, a, counts);
        let protocol = match a.request {
            Some(_) => AuthzProtocol::Http,
            None => AuthzProtocol::Tcp,
        };
        let metrics = self.metrics();
        metrics.xds_rbac_decided();
        if let Some(decided) = outcome.decided {
            metrics.decided(protocol, decided);
        }
        let (peer, principal) = (a.source, a.principal.unwrap_or("-"));
        let (method, path) = a.request.map_or(("-", "-"), |r| (r.method, r.path));
        for rule in &outcome.logged {
            metrics.audited(protocol);
            tracing::info!(
                %peer, principal, destination = %a.destination, method, path, rule,
                protocol = protocol.as_str(), "authorization audit"
            );
        }
        for (deny, allowed, hit) in &outcome.shadow {
            metrics.dry_run(protocol, *deny, *allowed);
            if !allowed {
                tracing::info!(%peer, principal, method, path, rule = hit.unwrap_or("none"), "dry-run RBAC rules would deny");
            }
        }
        if outcome.allowed() {
            return Verdict::Allowed;
        }
        let details = format!(
            "rbac_access_denied_matched_policy[{}]",
            outcome.policy.unwrap_or("none")
        );
        tracing::debug!(
            %peer, principal, destination = %a.destination, method, path,
            protocol = protocol.as_str(), %details, "denied by xDS RBAC"
        );
        Verdict::Denied(details)
    }
}

/// Whether the request or connection has this permission.
pub fn permission(p: &Permission, a: &Attributes<'_>) -> bool {
    match p {
        Permission::Any => true,
        Permission::And(all) => all.iter().all(|x| permission(x, a)),
        Permission::Or(any) => any.iter().any(|x| permission(x, a)),
        Permission::Not(x) => !permission(x, a),
        Permission::Header(h) => header(h, a),
        // A TCP connection has no path: Envoy's path matcher finds none.
        Permission::UrlPath(m) => a.request.is_some_and(|r| m.matches(r.path)),
        Permission::DestinationIp(c) => c.contains(a.destination.ip()),
        Permission::DestinationPort(p) => a.destination.port() == *p,
        Permission::DestinationPortRange { start, end } => {
            (*start..*end).contains(&a.destination.port())
        }
        // Envoy matches the connection's requested server name, empty without SNI.
        Permission::RequestedServerName(m) => m.matches(a.sni.unwrap_or("")),
    }
}

/// Whether the peer is this principal.
pub fn principal(p: &Principal, a: &Attributes<'_>) -> bool {
    match p {
        Principal::Any => true,
        Principal::And(all) => all.iter().all(|x| principal(x, a)),
        Principal::Or(any) => any.iter().any(|x| principal(x, a)),
        Principal::Not(x) => !principal(x, a),
        // Envoy: any peer that mutual TLS authenticated; with a name, one of its certificate's
        // URI SANs, else one of its DNS SANs, else its subject (RFC 2253, as Envoy prints it).
        Principal::Authenticated(None) => a.peer.is_some(),
        Principal::Authenticated(Some(m)) => a.peer.is_some_and(|peer| {
            peer.uri_sans.iter().any(|u| m.matches(u))
                || peer.dns_sans.iter().any(|d| m.matches(d))
                || m.matches(&peer.subject)
        }),
        Principal::FilterState { key, matcher } if key == PEER_PRINCIPAL => {
            a.principal.is_some_and(|id| matcher.matches(id))
        }
        // Refused by the converter; nothing else sets filter state here.
        Principal::FilterState { .. } => false,
        Principal::DirectRemoteIp(c) | Principal::SourceIp(c) => c.contains(a.source.ip()),
        Principal::RemoteIp(c) => c.contains(a.remote_ip()),
        Principal::Header(h) => header(h, a),
        // Nothing writes dynamic metadata here (no JWT is validated): the value is absent, so
        // only an inverted matcher matches, as Envoy's metadata matcher on a missing value.
        Principal::Metadata { invert, .. } => *invert,
    }
}

/// Envoy's header matcher over the request (pseudo-headers included; a repeated header's
/// values each on its own, as Envoy 1.40 matches them: [`HeaderMatcher::matches_each`]); a
/// TCP connection has no headers.
fn header(h: &HeaderMatcher, a: &Attributes<'_>) -> bool {
    let Some(r) = a.request else {
        return h.matches(None);
    };
    h.matches_each(|visit| match h.name.as_str() {
        ":method" => visit(r.method),
        ":authority" | "host" => r.host.is_some_and(&mut *visit),
        ":path" => match r.query {
            Some(q) => visit(&format!("{}?{q}", r.path)),
            None => visit(r.path),
        },
        name => r
            .headers
            .get_all(name)
            .iter()
            .any(|v| visit(&String::from_utf8_lossy(v.as_bytes()))),
    })
}

#[cfg(test)]
mod tests;
