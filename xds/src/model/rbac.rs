//! Envoy's RBAC filter config as data (network and HTTP alike): the policies istiod writes for
//! AuthorizationPolicies, kept whole so the authorization step can enforce them as Envoy does.
//! Enforcing is not done here; this is what to enforce.

use super::matcher::{CidrRange, HeaderMatcher, StringMatcher};
use std::collections::BTreeMap;

/// One RBAC filter: the enforced rules, the shadow (dry-run) rules, or both.
#[derive(Debug, Clone, PartialEq)]
pub struct Rbac {
    /// Enforced; `None` lets everything through (Envoy's RBAC with no `rules`).
    pub rules: Option<Rules>,
    /// Evaluated and counted, never enforced.
    pub shadow_rules: Option<Rules>,
    /// The stat prefix of the shadow rules (`istio_dry_run_allow_`), which names its metrics
    /// and the dynamic metadata Istio's tracing tags read.
    pub shadow_rules_stat_prefix: String,
    /// The filter's own stat prefix (network RBAC).
    pub stat_prefix: String,
}

/// A set of policies and what a match means.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    pub action: Action,
    /// By name (istiod's `ns[…]-policy[…]-rule[…]`), in name order as Envoy evaluates a map.
    pub policies: BTreeMap<String, Policy>,
}

/// What matching a policy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Only requests that match some policy pass.
    Allow,
    /// Requests that match some policy are denied.
    Deny,
    /// Matching requests are logged (dynamic metadata), all pass.
    Log,
}

/// A policy matches when some permission and some principal match.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub permissions: Vec<Permission>,
    pub principals: Vec<Principal>,
}

/// What the request asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Permission {
    Any,
    And(Vec<Permission>),
    Or(Vec<Permission>),
    Not(Box<Permission>),
    Header(HeaderMatcher),
    /// The path, without the query.
    UrlPath(StringMatcher),
    DestinationIp(CidrRange),
    DestinationPort(u16),
    /// Inclusive-exclusive, as Envoy's `Int32Range`.
    DestinationPortRange {
        start: u16,
        end: u16,
    },
    RequestedServerName(StringMatcher),
}

/// Who asks.
#[derive(Debug, Clone, PartialEq)]
pub enum Principal {
    Any,
    And(Vec<Principal>),
    Or(Vec<Principal>),
    Not(Box<Principal>),
    /// The peer certificate's URI SAN (or subject) matches; `None` = any authenticated peer.
    Authenticated(Option<StringMatcher>),
    /// The downstream connection's source address.
    DirectRemoteIp(CidrRange),
    /// The client address after `x-forwarded-for` processing.
    RemoteIp(CidrRange),
    /// Deprecated `source_ip`: the connection's address.
    SourceIp(CidrRange),
    Header(HeaderMatcher),
    /// A string in the connection's filter state, as `io.istio.peer_principal`, which
    /// Istio's `istio_authn` sets to the peer's SPIFFE ID.
    FilterState {
        key: String,
        matcher: StringMatcher,
    },
    /// A value in the dynamic metadata (`istio_authn`'s `request.auth.claims`): the value
    /// at `path` under `filter` must be a string that matches, or a list holding one.
    Metadata {
        filter: String,
        path: Vec<String>,
        matcher: StringMatcher,
        /// The value is a list and one element must match (`list_match.one_of`).
        in_list: bool,
        invert: bool,
    },
}
