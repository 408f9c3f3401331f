//! Istio authorization (`AuthorizationPolicy`) on inbound traffic, as an Istio sidecar
//! enforces it: the policies protect this workload, so only what arrives on the inbound
//! listener is decided, after mutual TLS has told who the peer is.
//!
//! Policy files are parsed ([`policy`]), validated and compiled into matchers ([`compile`],
//! `value`, [`matcher`]); [`load`] reads the policy directory, keeps the policies that apply to
//! this workload (its namespace or the root namespace, and its labels) and swaps in a new set
//! when the files change. [`engine`] decides, a pure function of the set and what is known of a
//! request or connection ([`Attributes`]). [`path`] normalises request paths first, so a policy
//! on `/admin` cannot be bypassed with `/./admin`. [`Authorizer`] holds the set in force and
//! counts and logs its decisions.

pub mod compile;
pub mod engine;
pub mod load;
mod locate;
pub mod matcher;
pub mod path;
pub mod policy;
pub mod rbac;
mod value;

use crate::metrics::{AuthzMetrics, AuthzOutcome, AuthzProtocol};
use arc_swap::ArcSwap;
use engine::{PolicySet, Reason};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// What is known of an inbound request or connection.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// The client's address (the peer of the accepted connection).
    pub source: SocketAddr,
    /// Where the client was going (the original destination).
    pub destination: SocketAddr,
    /// The peer's SPIFFE ID (`spiffe://…`), when mutual TLS proved one.
    pub principal: Option<&'a str>,
    /// The peer's certificate, when mutual TLS proved one: what an xDS RBAC `authenticated`
    /// principal matches (its URI SANs, DNS SANs, subject), as Envoy's does.
    pub peer: Option<&'a crate::tls::Peer>,
    /// The TLS server name the client asked for, when it spoke TLS.
    pub sni: Option<&'a str>,
    /// The HTTP request; `None` for a TCP connection.
    pub request: Option<Request<'a>>,
}

/// What an HTTP request adds.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The normalised path, without the query string.
    pub path: &'a str,
    /// The query string, without `?` (Envoy's `:path` header carries it).
    pub query: Option<&'a str>,
    /// `:authority`, or `Host`.
    pub host: Option<&'a str>,
    pub headers: &'a http::HeaderMap,
}

impl Attributes<'_> {
    /// The original client, as Envoy tells it on a sidecar's inbound listener (which does not
    /// use the remote address): the last `x-forwarded-for` address, or the source. A client can
    /// write that header, so `remoteIpBlocks` is only as good as the hops that set it.
    pub fn remote_ip(&self) -> IpAddr {
        self.request
            .and_then(|r| r.headers.get_all("x-forwarded-for").iter().next_back())
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .and_then(|last| last.trim().parse().ok())
            .unwrap_or(self.source.ip())
    }
}

/// Whether a request or connection may go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Denied; Envoy's `response_code_details` for it.
    Denied(String),
}

/// The policies in force, and the counters of their decisions.
#[derive(Debug)]
pub struct Authorizer {
    set: ArcSwap<PolicySet>,
    metrics: AuthzMetrics,
}

impl Authorizer {
    /// No policy yet: everything is allowed.
    pub fn new(metrics: AuthzMetrics) -> Self {
        Authorizer {
            set: ArcSwap::from_pointee(PolicySet::default()),
            metrics,
        }
    }

    /// Put `set` in force for new requests and connections.
    pub fn install(&self, set: PolicySet) {
        let c = set.counts;
        self.metrics.set_policies([
            ("allow", c.allow),
            ("deny", c.deny),
            ("audit", c.audit),
            ("custom", c.custom),
            ("dry_run", c.dry_run),
        ]);
        self.set.store(Arc::new(set));
    }

    /// Whether any policy is in force; without one, nothing needs to be known or decided.
    pub fn is_active(&self) -> bool {
        !self.set.load().is_empty()
    }

    /// The set in force.
    pub fn policies(&self) -> Arc<PolicySet> {
        self.set.load_full()
    }

    /// The metrics it counts in (reloads are counted by [`load`]).
    pub fn metrics(&self) -> &AuthzMetrics {
        &self.metrics
    }

    /// Decide, count and log. With no policy in force nothing is evaluated or counted.
    pub fn check(&self, a: &Attributes<'_>) -> Verdict {
        let set = self.set.load();
        if set.is_empty() {
            return Verdict::Allowed;
        }
        let decision = set.evaluate(a);
        let protocol = match a.request {
            Some(_) => AuthzProtocol::Http,
            None => AuthzProtocol::Tcp,
        };
        let outcome = match decision.reason {
            Reason::DenyMatched(_) => AuthzOutcome::DenyMatched,
            Reason::AllowMatched(_) => AuthzOutcome::AllowMatched,
            Reason::NoAllowMatched => AuthzOutcome::NoAllowMatched,
            Reason::NoAllowPolicy => AuthzOutcome::NoAllowPolicy,
        };
        self.metrics.decided(protocol, outcome);
        let (peer, principal) = (a.source, a.principal.unwrap_or("-"));
        let (method, path) = a.request.map_or(("-", "-"), |r| (r.method, r.path));
        if let Some(rule) = decision.audited {
            self.metrics.audited(protocol);
            tracing::info!(
                %peer, principal, destination = %a.destination, method, path, rule,
                protocol = protocol.as_str(), "authorization audit"
            );
        }
        if let Some(matched) = decision.dry_run_deny {
            self.metrics.dry_run(protocol, true, matched.is_none());
            if let Some(rule) = matched {
                tracing::info!(%peer, principal, method, path, rule, "dry-run DENY policy would deny");
            }
        }
        if let Some(matched) = decision.dry_run_allow {
            self.metrics.dry_run(protocol, false, matched.is_some());
            if matched.is_none() {
                tracing::info!(%peer, principal, method, path, "dry-run ALLOW policies would deny");
            }
        }
        if decision.allowed() {
            return Verdict::Allowed;
        }
        let details = decision.denial_details();
        tracing::debug!(
            %peer, principal, destination = %a.destination, method, path,
            protocol = protocol.as_str(), %details, "denied by authorization policy"
        );
        Verdict::Denied(details)
    }
}

#[cfg(test)]
mod tests;
