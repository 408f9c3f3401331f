//! Route tables: which virtual host a Host header reaches, which route of it a request takes,
//! and what that route does (cluster or weighted clusters, timeout, retries, header edits).

use super::domains::DomainIndex;
use super::fault::FaultPolicy;
use super::matcher::{HeaderMatcher, Pattern, StringMatcher};
use std::sync::Arc;
use std::time::Duration;

/// Envoy's route timeout when a route sets none.
pub const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(15);

/// A route table (RDS, or inline in a listener's HTTP connection manager).
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfiguration {
    pub name: String,
    pub virtual_hosts: Vec<VirtualHost>,
    /// Match `Host: reviews:9080` against `reviews` (istiod sets it; its domains have no port).
    pub ignore_port_in_host_matching: bool,
    /// Envoy refuses a table naming unknown clusters when set; Remora answers 503 `NC` per
    /// request instead, which is what Envoy does when it is unset, as istiod leaves it.
    pub validate_clusters: bool,
    pub request_headers_to_add: Vec<HeaderEdit>,
    pub request_headers_to_remove: Vec<String>,
    pub response_headers_to_add: Vec<HeaderEdit>,
    pub response_headers_to_remove: Vec<String>,
    /// `virtual_hosts`' domains, indexed ([`DomainIndex::of`] them).
    pub domains: DomainIndex,
}

/// A virtual host: domains and their routes.
#[derive(Debug, Clone, PartialEq)]
pub struct VirtualHost {
    pub name: String,
    /// Envoy's forms: `exact.host`, `*.suffix`, `prefix.*`, `*`.
    pub domains: Vec<String>,
    pub routes: Vec<Arc<Route>>,
    /// A route's own policy wins over this one.
    pub retry_policy: Option<RetryPolicy>,
    /// Send `x-envoy-attempt-count` upstream.
    pub include_request_attempt_count: bool,
    pub request_headers_to_add: Vec<HeaderEdit>,
    pub request_headers_to_remove: Vec<String>,
    pub response_headers_to_add: Vec<HeaderEdit>,
    pub response_headers_to_remove: Vec<String>,
}

/// One route.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub name: Option<String>,
    pub matcher: RouteMatch,
    pub action: Action,
    /// The operation name in traces (istiod's `host:port/path`).
    pub decorator: Option<String>,
    /// Istio's `filter_metadata.istio.config` (the VirtualService it came from).
    pub istio_config: Option<String>,
    /// The fault filter's config for this route: its own, else its virtual host's, else its
    /// table's (Envoy's most specific per-filter config).
    pub fault: Option<Arc<FaultPolicy>>,
    /// Some weighted cluster of the route has a fault config of its own
    /// ([`WeightedCluster::fault`] then says which applies).
    pub fault_per_cluster: bool,
    /// The cors filter's configs for this route: its own, its virtual host's and its
    /// table's, most specific first; `None` when no level has one.
    pub cors: Option<Arc<super::cors::Cors>>,
    pub request_headers_to_add: Vec<HeaderEdit>,
    pub request_headers_to_remove: Vec<String>,
    pub response_headers_to_add: Vec<HeaderEdit>,
    pub response_headers_to_remove: Vec<String>,
}

impl Route {
    /// The fault config for a request of this route that goes to `cluster`: the picked
    /// weighted cluster's own when it has one, else the route's.
    pub fn fault_for(&self, cluster: &str) -> Option<&Arc<FaultPolicy>> {
        if self.fault_per_cluster {
            if let Action::Forward(f) = &self.action {
                if let ClusterTarget::Weighted(set) = &f.target {
                    return set
                        .iter()
                        .find(|c| c.name == cluster)
                        .and_then(|c| c.fault.as_ref());
                }
            }
        }
        self.fault.as_ref()
    }
}

/// How the path is matched.
#[derive(Debug, Clone, PartialEq)]
pub enum PathMatch {
    Prefix(String),
    Exact(String),
    Regex(Pattern),
    /// A prefix that ends at a `/` boundary (`/api` matches `/api` and `/api/x`, not `/apix`).
    PathSeparatedPrefix(String),
    /// An HTTP CONNECT request (any path).
    Connect,
}

/// A query parameter's condition.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryParameterMatcher {
    pub name: String,
    /// `None`: present with any value.
    pub value: Option<StringMatcher>,
}

/// What a request must be for a route to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteMatch {
    pub path: PathMatch,
    /// Applies to `Prefix`, `Exact` and `PathSeparatedPrefix` (default true).
    pub case_sensitive: bool,
    pub headers: Vec<HeaderMatcher>,
    pub query_parameters: Vec<QueryParameterMatcher>,
    /// Only gRPC requests (`content-type: application/grpc…`).
    pub grpc: bool,
}

/// What a route does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Forward(Box<Forward>),
    Redirect(Redirect),
    DirectResponse { status: u16, body: Option<String> },
}

/// Where a forwarded request goes.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterTarget {
    Cluster(String),
    /// Picked per request in proportion to the weights.
    Weighted(Vec<WeightedCluster>),
}

impl ClusterTarget {
    /// The cluster for a request, given a uniform random `roll`: each weighted cluster in
    /// proportion to its weight. `None` when every weight is zero.
    pub fn pick(&self, roll: u64) -> Option<&str> {
        match self {
            ClusterTarget::Cluster(name) => Some(name),
            ClusterTarget::Weighted(clusters) => {
                pick_weighted(clusters.iter().map(|c| (c.name.as_str(), c.weight)), roll)
            }
        }
    }
}

/// Pick from `(name, weight)` pairs in proportion to the weights, by `roll`.
pub fn pick_weighted<'a>(
    items: impl Iterator<Item = (&'a str, u32)> + Clone,
    roll: u64,
) -> Option<&'a str> {
    let total: u64 = items.clone().map(|(_, w)| u64::from(w)).sum();
    if total == 0 {
        return None;
    }
    let mut point = roll % total;
    for (name, weight) in items {
        let weight = u64::from(weight);
        if point < weight {
            return Some(name);
        }
        point -= weight;
    }
    None
}

/// One cluster of a weighted set.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedCluster {
    pub name: String,
    pub weight: u32,
    /// The fault config when this cluster is picked: its own, else its route's.
    pub fault: Option<Arc<FaultPolicy>>,
    pub request_headers_to_add: Vec<HeaderEdit>,
    pub request_headers_to_remove: Vec<String>,
    pub response_headers_to_add: Vec<HeaderEdit>,
    pub response_headers_to_remove: Vec<String>,
}

/// A route to upstream clusters.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    pub target: ClusterTarget,
    /// The whole request's deadline: `Some` of the route's value, [`DEFAULT_ROUTE_TIMEOUT`]
    /// when unset, `None` when the route says `0s` (no deadline).
    pub timeout: Option<Duration>,
    /// Stream idle timeout for this route (`None` keeps the connection manager's).
    pub idle_timeout: Option<Duration>,
    pub retry_policy: Option<RetryPolicy>,
    /// Upgrades allowed on this route beyond the connection manager's (`websocket`, `CONNECT`).
    pub upgrades: Vec<Upgrade>,
    /// `max_stream_duration`: the longest a stream may live (`None`: no bound).
    pub max_stream_duration: Option<Duration>,
    /// gRPC's `grpc-timeout` header bounds the timeout, at most this much (`Some(ZERO)`: no
    /// cap; `None`: the header is ignored).
    pub grpc_timeout_header_max: Option<Duration>,
    pub prefix_rewrite: Option<String>,
    pub host_rewrite: Option<String>,
    /// `request_mirror_policies`: each a copy of the request sent, fire-and-forget, to
    /// another cluster (Istio's VirtualService `mirror` / `mirrors`). Empty for nearly every
    /// route (shared: a request of a mirrored route holds them without a copy).
    pub mirrors: Arc<[MirrorPolicy]>,
    /// What a consistent-hash cluster hashes of the request (empty: nothing, a random pick).
    pub hash_policy: Vec<super::hash::HashPolicy>,
}

/// One of a route's `request_mirror_policies`: a copy of a share of its requests sent to
/// `cluster`, its response discarded.
#[derive(Debug, Clone, PartialEq)]
pub struct MirrorPolicy {
    pub cluster: String,
    /// The share of requests mirrored (`runtime_fraction.default_value`; unset: all).
    pub fraction: super::fault::Fraction,
    /// Whether the copy's authority gets `-shadow` before its port (`host-shadow:port`), as
    /// Envoy does unless `disable_shadow_host_suffix_append` says not to.
    pub shadow_suffix: bool,
}

impl MirrorPolicy {
    /// The copy's authority for the request's `host`: `-shadow` inserted before the port
    /// (`reviews:9080` → `reviews-shadow:9080`, `[::1]:80` → `[::1]-shadow:80`), as Envoy's
    /// router writes it; unchanged without the suffix.
    pub fn shadow_host(&self, host: &str) -> String {
        if !self.shadow_suffix {
            return host.to_string();
        }
        let (name, port) = match host.rfind(':') {
            // A colon inside brackets is part of an IPv6 address, not a port.
            Some(i) if !host[i..].contains(']') => host.split_at(i),
            _ => (host, ""),
        };
        format!("{name}-shadow{port}")
    }
}

/// An upgrade a route allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgrade {
    pub upgrade_type: String,
    pub enabled: bool,
}

/// A redirect response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub path: Option<String>,
    pub prefix_rewrite: Option<String>,
    pub status: u16,
    pub strip_query: bool,
}

pub use super::retry::{RetryOn, RetryPolicy};

/// A header to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderEdit {
    pub name: String,
    pub value: super::header_format::HeaderFormat,
    /// Append to an existing value instead of replacing it.
    pub append: bool,
}

impl RouteConfiguration {
    /// The virtual host for a request's Host (or `:authority`), chosen as Envoy chooses:
    /// an exact domain, then the longest `*.suffix`, then the longest `prefix.*`, then `*`.
    pub fn virtual_host(&self, host: &str) -> Option<&VirtualHost> {
        self.virtual_host_index(host)
            .and_then(|at| self.virtual_hosts.get(at))
    }

    /// [`RouteConfiguration::virtual_host`]'s position in `virtual_hosts`.
    pub fn virtual_host_index(&self, host: &str) -> Option<usize> {
        // Envoy retries without the port only when ignore_port is set; without it a
        // `Host: a:80` must name `a:80` or fall to a wildcard.
        let host = if self.ignore_port_in_host_matching {
            strip_port(host)
        } else {
            host
        };
        self.domains.find(host)
    }
}

/// Whether `s` starts with `prefix`, ignoring ASCII case.
fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// `host:port` → `host`; `[v6]:port` → `[v6]`; a bare IPv6 address stays whole.
fn strip_port(host: &str) -> &str {
    let b = host.as_bytes();
    let digits = b.iter().rev().take_while(|c| c.is_ascii_digit()).count();
    let colon = b.len() - digits;
    // The common forms, in one look at each byte: `name:port`, and `name`.
    let plain = |s: &[u8]| !s.iter().any(|&c| c == b':' || c == b']');
    if colon > 0 && b[colon - 1] == b':' && plain(&b[..colon - 1]) {
        return &host[..colon - 1];
    }
    if plain(b) {
        return host;
    }
    if let Some(end) = host.rfind(']') {
        return &host[..=end];
    }
    match host.rsplit_once(':') {
        Some((h, port)) if !h.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// What the route matcher needs of a request.
#[derive(Clone, Copy)]
pub struct RequestParts<'a> {
    pub method: &'a str,
    /// Path with query (`/a/b?x=1`).
    pub path_and_query: &'a str,
    /// A header's first value by lower-case name (pseudo-headers `:method`, `:authority` too).
    pub header: &'a dyn Fn(&str) -> Option<&'a str>,
    /// A header's values by lower-case name (pseudo-headers too), each as sent (a repeated
    /// header is several values), handed in order to the visitor until it returns true;
    /// whether it did. Header matchers read these ([`HeaderMatcher::matches_each`]).
    pub values: &'a HeaderValues<'a>,
}

/// How a request's header values are visited: `(name, visitor)`, see [`RequestParts::values`].
pub type HeaderValues<'a> = dyn Fn(&str, &mut dyn FnMut(&str) -> bool) -> bool + 'a;

impl VirtualHost {
    /// The first route that matches, as Envoy takes them: in order.
    pub fn route(&self, req: &RequestParts<'_>) -> Option<&Arc<Route>> {
        self.routes.iter().find(|r| r.matcher.matches(req))
    }
}

impl RouteMatch {
    /// Whether a request matches.
    pub fn matches(&self, req: &RequestParts<'_>) -> bool {
        // A byte search (`?` is ASCII): `str::split_once` costs several times more on the
        // short paths nearly every request has.
        let (path, query) = match req.path_and_query.bytes().position(|b| b == b'?') {
            Some(at) => (
                &req.path_and_query[..at],
                Some(&req.path_and_query[at + 1..]),
            ),
            None => (req.path_and_query, None),
        };
        // Per request: compare in place, never allocate.
        let prefix = |p: &str| {
            if self.case_sensitive {
                path.starts_with(p)
            } else {
                starts_with_ignore_case(path, p)
            }
        };
        let exact = |p: &str| {
            if self.case_sensitive {
                path == p
            } else {
                path.eq_ignore_ascii_case(p)
            }
        };
        let path_ok = match &self.path {
            PathMatch::Prefix(p) => prefix(p),
            PathMatch::Exact(p) => exact(p),
            PathMatch::Regex(re) => re.is_match(path),
            PathMatch::PathSeparatedPrefix(p) => {
                prefix(p) && (path.len() == p.len() || path.as_bytes()[p.len()] == b'/')
            }
            PathMatch::Connect => req.method.eq_ignore_ascii_case("CONNECT"),
        };
        if !path_ok {
            return false;
        }
        if self.grpc
            && !(req.header)("content-type").is_some_and(|v| v.starts_with("application/grpc"))
        {
            return false;
        }
        if !self
            .headers
            .iter()
            .all(|h| h.matches_each(|visit| (req.values)(&h.name, visit)))
        {
            return false;
        }
        self.query_parameters.iter().all(|q| {
            let value = query
                .and_then(|query| form_pairs(query).find_map(|(k, v)| (k == q.name).then_some(v)));
            match (&q.value, value) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(m), Some(v)) => m.matches(v),
            }
        })
    }
}

fn form_pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vh(name: &str, domains: &[&str]) -> VirtualHost {
        VirtualHost {
            name: name.into(),
            domains: domains.iter().map(|d| d.to_string()).collect(),
            routes: vec![],
            retry_policy: None,
            include_request_attempt_count: false,
            request_headers_to_add: vec![],
            request_headers_to_remove: vec![],
            response_headers_to_add: vec![],
            response_headers_to_remove: vec![],
        }
    }

    fn table(ignore_port: bool) -> RouteConfiguration {
        let virtual_hosts = vec![
            vh("all", &["*"]),
            vh("reviews", &["reviews", "reviews.default.svc.cluster.local"]),
            vh("suffix", &["*.example.com"]),
            vh("prefix", &["api.*"]),
        ];
        RouteConfiguration {
            name: "9080".into(),
            domains: DomainIndex::of(&virtual_hosts),
            virtual_hosts,
            ignore_port_in_host_matching: ignore_port,
            validate_clusters: false,
            request_headers_to_add: vec![],
            request_headers_to_remove: vec![],
            response_headers_to_add: vec![],
            response_headers_to_remove: vec![],
        }
    }

    #[test]
    fn virtual_host_by_host_as_envoy_orders_domains() {
        let t = table(true);
        let name = |h: &str| t.virtual_host(h).map(|v| v.name.as_str());
        assert_eq!(name("reviews:9080"), Some("reviews"));
        assert_eq!(name("REVIEWS"), Some("reviews"));
        assert_eq!(name("www.example.com"), Some("suffix"));
        assert_eq!(name("api.internal"), Some("prefix"));
        assert_eq!(name("other"), Some("all"));
        let strict = table(false);
        assert_eq!(
            strict.virtual_host("reviews:9080").map(|v| v.name.as_str()),
            Some("all")
        );
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("::1"), "::1");
        for (host, stripped) in [
            ("reviews:9080", "reviews"),
            ("reviews", "reviews"),
            ("reviews:", "reviews"),
            ("reviews:90a", "reviews:90a"),
            ("a:b:80", "a:b:80"),
            ("[::1]", "[::1]"),
            ("[::1]:8080", "[::1]"),
            ("", ""),
            ("80", "80"),
        ] {
            assert_eq!(strip_port(host), stripped, "{host}");
        }
    }

    fn matcher(path: PathMatch, case_sensitive: bool) -> RouteMatch {
        RouteMatch {
            path,
            case_sensitive,
            headers: vec![],
            query_parameters: vec![],
            grpc: false,
        }
    }

    fn req<'a>(
        method: &'a str,
        path: &'a str,
        header: &'a dyn Fn(&str) -> Option<&'a str>,
    ) -> RequestParts<'a> {
        // A header's one value, as `header` gives it (no test here repeats a header); leaked,
        // a few bytes per test, to live as long as the parts.
        let values = Box::leak(Box::new(
            move |name: &str, visit: &mut dyn FnMut(&str) -> bool| header(name).is_some_and(visit),
        ));
        RequestParts {
            method,
            path_and_query: path,
            header,
            values,
        }
    }

    #[test]
    fn weighted_clusters_are_picked_in_proportion() {
        let w = |name: &str, weight| WeightedCluster {
            name: name.into(),
            weight,
            fault: None,
            request_headers_to_add: vec![],
            request_headers_to_remove: vec![],
            response_headers_to_add: vec![],
            response_headers_to_remove: vec![],
        };
        let target = ClusterTarget::Weighted(vec![w("v1", 90), w("v2", 0), w("v3", 10)]);
        let picks: Vec<_> = (0..100).filter_map(|roll| target.pick(roll)).collect();
        assert_eq!(picks.iter().filter(|p| **p == "v1").count(), 90);
        assert_eq!(picks.iter().filter(|p| **p == "v3").count(), 10);
        assert_eq!(target.pick(150), Some("v1"), "the roll wraps");
        assert_eq!(ClusterTarget::Weighted(vec![w("x", 0)]).pick(1), None);
        assert_eq!(ClusterTarget::Cluster("c".into()).pick(7), Some("c"));
    }

    #[test]
    fn paths_queries_and_case() {
        let none = |_: &str| None;
        let exact = matcher(PathMatch::Exact("/productpage".into()), true);
        assert!(exact.matches(&req("GET", "/productpage?u=1", &none)));
        assert!(!exact.matches(&req("GET", "/Productpage", &none)));
        let insensitive = matcher(PathMatch::Exact("/productpage".into()), false);
        assert!(insensitive.matches(&req("GET", "/ProductPage", &none)));
        let sep = matcher(PathMatch::PathSeparatedPrefix("/api".into()), true);
        assert!(sep.matches(&req("GET", "/api/x", &none)));
        assert!(!sep.matches(&req("GET", "/apix", &none)));
        let connect = matcher(PathMatch::Connect, true);
        assert!(connect.matches(&req("CONNECT", "", &none)));
        assert!(!connect.matches(&req("GET", "/", &none)));
        let mut q = matcher(PathMatch::Prefix("/".into()), true);
        q.query_parameters = vec![QueryParameterMatcher {
            name: "debug".into(),
            value: Some(StringMatcher::exact("1")),
        }];
        assert!(q.matches(&req("GET", "/a?x=2&debug=1", &none)));
        assert!(!q.matches(&req("GET", "/a?debug=2", &none)));
        let grpc_header = |n: &str| (n == "content-type").then_some("application/grpc+proto");
        let mut g = matcher(PathMatch::Prefix("/".into()), true);
        g.grpc = true;
        assert!(g.matches(&req("POST", "/svc/M", &grpc_header)));
        assert!(!g.matches(&req("POST", "/svc/M", &none)));
    }
}
