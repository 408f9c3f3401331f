//! The route decision, when xDS configures the proxy: pure functions from a snapshot and what
//! is known of a connection (or a request) to where it goes. Outbound, the original destination
//! picks istiod's listener, the connection's facts pick its filter chain, and the chain says
//! TCP (a cluster) or HTTP (a route table: the virtual host by Host, the route by path, headers
//! and query, then a cluster, a redirect or a direct response). Which endpoint of the cluster,
//! and over what transport, is the upstream layer's ([`crate::upstream`]).
//!
//! Nothing here does I/O or keeps state: the random numbers that weighted choices need are
//! passed in, so every decision is reproducible in a test.

use remora_xds::model::listener::{
    ChainKind, ConnectionFacts, Direction, DownstreamTls, FilterChain, HttpChain, HttpFilter,
    Listener, NetworkFilter, RouteSource, TcpTarget,
};
use remora_xds::model::rbac::Rbac;
use remora_xds::model::route::{
    Action, ClusterTarget, Forward, Redirect, RequestParts, RetryPolicy, Route, RouteConfiguration,
    VirtualHost,
};
use remora_xds::snapshot::Snapshot;
use std::sync::Arc;

/// What a connection's filter chain makes of it.
#[derive(Debug)]
pub enum ChainDecision<'s> {
    /// `tcp_proxy` to this cluster.
    Tcp {
        chain: &'s FilterChain,
        cluster: &'s str,
    },
    /// The HTTP connection manager: each request is routed by [`http_route`].
    Http {
        chain: &'s FilterChain,
        http: &'s HttpChain,
    },
    /// No listener or no chain takes it: Envoy closes the connection (flag `NR`).
    NoChain,
}

/// The outbound chain for a connection, as Envoy's `virtualOutbound` hands it on: the
/// listener of its original destination, then the chain its facts select. `pick` is a random
/// number for a weighted TCP target.
pub fn outbound<'s>(
    snapshot: &'s Snapshot,
    facts: &ConnectionFacts<'_>,
    pick: u64,
) -> ChainDecision<'s> {
    let Some(listener) = snapshot.outbound_listener(facts.destination) else {
        return ChainDecision::NoChain;
    };
    let Some(chain) = listener.filter_chain(facts) else {
        return ChainDecision::NoChain;
    };
    chain_decision(chain, pick)
}

/// What an inbound connection's `virtualInbound` chain says: whether mesh TLS is terminated
/// (istiod writes a TLS chain per port for mTLS and, in PERMISSIVE mode, a plaintext one
/// beside it; STRICT has no plaintext chain, so plaintext finds none), and then TCP to a
/// cluster or HTTP.
#[derive(Debug)]
pub struct Inbound<'s> {
    /// Terminate TLS with this context (the workload certificate, client certificates
    /// required when it says so).
    pub terminate: Option<&'s DownstreamTls>,
    pub decision: ChainDecision<'s>,
    /// The chain, for what the connection keeps of it (its RBAC filters).
    pub chain: Option<ChainRef>,
}

/// The inbound chain for a connection: `None` when no inbound listener is held (before the
/// first LDS: Envoy has no 15006 yet, so the connection is refused); a decision of
/// [`ChainDecision::NoChain`] when no chain takes it (Envoy closes it, `NR`).
pub fn inbound<'s>(
    snapshot: &'s Snapshot,
    facts: &ConnectionFacts<'_>,
    pick: u64,
) -> Option<Inbound<'s>> {
    let listener = snapshot.inbound_listener()?;
    Some(match listener.filter_chain(facts) {
        None => Inbound {
            terminate: None,
            decision: ChainDecision::NoChain,
            chain: None,
        },
        Some(chain) => Inbound {
            terminate: chain.tls.as_ref(),
            decision: chain_decision(chain, pick),
            chain: ChainRef::new(listener, chain),
        },
    })
}

/// A filter chain of a listener held in a snapshot, kept by the connection it took: the
/// listener stays alive (an `Arc`) as long as the connection, whatever the store does meanwhile,
/// as Envoy drains a connection on the chain it started on.
#[derive(Debug, Clone)]
pub struct ChainRef {
    listener: Arc<Listener>,
    /// Position in [`Listener::all_chains`].
    index: usize,
}

impl ChainRef {
    /// The reference to `chain`, one of `listener`'s chains.
    pub fn new(listener: &Arc<Listener>, chain: &FilterChain) -> Option<ChainRef> {
        let index = listener.all_chains().position(|c| std::ptr::eq(c, chain))?;
        Some(ChainRef {
            listener: Arc::clone(listener),
            index,
        })
    }

    /// Identifies the chain as held: the same for every connection that took it from the
    /// same listener version.
    pub fn key(&self) -> (usize, usize) {
        (Arc::as_ptr(&self.listener) as usize, self.index)
    }

    pub fn chain(&self) -> Option<&FilterChain> {
        self.listener.all_chains().nth(self.index)
    }

    /// Whether `snapshot` still has this chain as it was, in the listener it came from
    /// (`virtualInbound`, or the outbound listener of that name): Envoy drains the connections
    /// of a chain an update changed or removed, and keeps the others.
    pub fn is_current(&self, snapshot: &Snapshot) -> bool {
        let now = match self.listener.direction {
            Direction::Inbound => snapshot.inbound_listener(),
            _ => snapshot.listener(&self.listener.name),
        };
        let Some(now) = now else {
            return false;
        };
        if Arc::ptr_eq(now, &self.listener) {
            return true;
        }
        self.chain()
            .is_some_and(|mine| now.all_chains().any(|c| c == mine))
    }

    /// The chain's network RBAC filters before its first network ext_authz filter (all of
    /// them when it has none), in order.
    pub fn network_rbac(&self) -> impl Iterator<Item = &Rbac> {
        self.network_filters()
            .take_while(|f| !matches!(f, NetworkFilter::ExtAuthz(_)))
            .filter_map(|f| match f {
                NetworkFilter::Rbac(r) => Some(r),
                _ => None,
            })
    }

    /// Every network RBAC filter of the chain, before its ext_authz filters and after.
    pub fn all_network_rbac(&self) -> impl Iterator<Item = &Rbac> {
        self.network_filters().filter_map(|f| match f {
            NetworkFilter::Rbac(r) => Some(r),
            _ => None,
        })
    }

    /// The chain's network filters from its first ext_authz filter on (none without one).
    pub fn network_from_ext_authz(&self) -> impl Iterator<Item = &NetworkFilter> {
        self.network_filters()
            .skip_while(|f| !matches!(f, NetworkFilter::ExtAuthz(_)))
    }

    fn network_filters(&self) -> impl Iterator<Item = &NetworkFilter> {
        self.chain().into_iter().flat_map(|c| c.filters.iter())
    }

    /// The HTTP RBAC filters of the chain's connection manager before its first ext_authz
    /// filter (all of them when it has none), in order (none for TCP): what decides a
    /// request before any external authorizer is asked.
    pub fn http_rbac(&self) -> impl Iterator<Item = &Rbac> {
        self.http_filters()
            .take_while(|f| !matches!(f, HttpFilter::ExtAuthz(_)))
            .filter_map(|f| match f {
                HttpFilter::Rbac(r) => Some(r),
                _ => None,
            })
    }

    /// Every HTTP RBAC filter of the chain, before its ext_authz filters and after.
    pub fn all_http_rbac(&self) -> impl Iterator<Item = &Rbac> {
        self.http_filters().filter_map(|f| match f {
            HttpFilter::Rbac(r) => Some(r),
            _ => None,
        })
    }

    /// The stat prefix of the chain's HTTP connection manager (none on a TCP chain).
    pub fn http_stat_prefix(&self) -> Option<&str> {
        match &self.chain()?.kind {
            ChainKind::Http(http) => Some(&http.stat_prefix),
            ChainKind::Tcp(_) => None,
        }
    }

    /// The chain's HTTP filters from its first ext_authz filter on (none without one).
    pub fn from_ext_authz(&self) -> impl Iterator<Item = &HttpFilter> {
        self.http_filters()
            .skip_while(|f| !matches!(f, HttpFilter::ExtAuthz(_)))
    }

    /// Whether the chain calls an external authorizer (AuthorizationPolicy CUSTOM).
    pub fn has_ext_authz(&self) -> bool {
        self.from_ext_authz().next().is_some()
    }

    fn http_filters(&self) -> impl Iterator<Item = &HttpFilter> {
        self.chain()
            .into_iter()
            .filter_map(|c| match &c.kind {
                ChainKind::Http(http) => Some(http),
                ChainKind::Tcp(_) => None,
            })
            .flat_map(|http| http.http_filters.iter())
    }
}

/// What one chain does.
pub fn chain_decision(chain: &FilterChain, pick: u64) -> ChainDecision<'_> {
    match &chain.kind {
        ChainKind::Tcp(tcp) => {
            let cluster = match &tcp.target {
                TcpTarget::Cluster(name) => Some(name.as_str()),
                TcpTarget::Weighted(set) => {
                    weighted(set.iter().map(|(name, w)| (name.as_str(), *w)), pick)
                }
            };
            match cluster {
                Some(cluster) => ChainDecision::Tcp { chain, cluster },
                None => ChainDecision::NoChain,
            }
        }
        ChainKind::Http(http) => ChainDecision::Http { chain, http },
    }
}

/// What an HTTP request gets.
#[derive(Debug, PartialEq)]
pub enum HttpDecision<'s> {
    /// Forward to this cluster (whether it exists is the upstream layer's to say: 503 `NC`).
    Forward {
        cluster: &'s str,
        route: &'s Arc<Route>,
        forward: &'s Forward,
        /// The route's retry policy, else its virtual host's (`None`: no retries, as Envoy).
        retry: Option<&'s RetryPolicy>,
        /// The virtual host, for its header edits.
        vhost: &'s VirtualHost,
    },
    /// A redirect, or a direct response: answered here, with the route's (and its virtual
    /// host's) response header edits.
    Redirect {
        redirect: &'s Redirect,
        route: &'s Arc<Route>,
        vhost: &'s VirtualHost,
    },
    DirectResponse {
        status: u16,
        body: Option<&'s str>,
        route: &'s Arc<Route>,
        vhost: &'s VirtualHost,
    },
    /// No virtual host or no route: 404 with flag `NR`.
    NoRoute,
    /// The chain names an RDS table that has not arrived: as Envoy, 404 `NR`.
    NoRouteTable,
}

/// The route table an HTTP chain uses, once it is held.
pub fn route_table<'s>(
    snapshot: &'s Snapshot,
    source: &'s RouteSource,
) -> Option<&'s Arc<RouteConfiguration>> {
    snapshot.routes_of(source)
}

/// Route one request through a table: the virtual host by `host` (the port ignored as the
/// table says), the first route that matches, then its action. `pick` is a random number for
/// weighted clusters.
pub fn http_route<'s>(
    table: &'s RouteConfiguration,
    host: &str,
    req: &RequestParts<'_>,
    pick: u64,
) -> HttpDecision<'s> {
    http_route_in(table.virtual_host(host), req, pick)
}

/// [`http_route`] once the virtual host is known (`None`: none takes the request's Host).
pub fn http_route_in<'s>(
    vhost: Option<&'s VirtualHost>,
    req: &RequestParts<'_>,
    pick: u64,
) -> HttpDecision<'s> {
    let Some(vhost) = vhost else {
        return HttpDecision::NoRoute;
    };
    // Envoy matches a CONNECT request only against routes with a `connect_matcher`, which
    // Remora refuses: none takes it (404 `NR`), where a path match would forward it.
    if req.method == "CONNECT" {
        return HttpDecision::NoRoute;
    }
    let Some(route) = vhost.route(req) else {
        return HttpDecision::NoRoute;
    };
    match &route.action {
        Action::Forward(forward) => {
            let cluster = match &forward.target {
                ClusterTarget::Cluster(name) => Some(name.as_str()),
                ClusterTarget::Weighted(set) => {
                    weighted(set.iter().map(|c| (c.name.as_str(), c.weight)), pick)
                }
            };
            match cluster {
                Some(cluster) => HttpDecision::Forward {
                    cluster,
                    route,
                    forward,
                    retry: forward
                        .retry_policy
                        .as_ref()
                        .or(vhost.retry_policy.as_ref()),
                    vhost,
                },
                // Every weight zero: Envoy has nowhere to send it either.
                None => HttpDecision::NoRoute,
            }
        }
        Action::Redirect(redirect) => HttpDecision::Redirect {
            redirect,
            route,
            vhost,
        },
        Action::DirectResponse { status, body } => HttpDecision::DirectResponse {
            status: *status,
            body: body.as_deref(),
            route,
            vhost,
        },
    }
}

/// One of `items` in proportion to its weight, `pick` being uniformly random; `None` when every
/// weight is zero.
pub fn weighted<T: Copy>(items: impl Iterator<Item = (T, u32)> + Clone, pick: u64) -> Option<T> {
    let total: u64 = items.clone().map(|(_, w)| u64::from(w)).sum();
    if total == 0 {
        return None;
    }
    let mut at = pick % total;
    for (item, w) in items {
        let w = u64::from(w);
        if at < w {
            return Some(item);
        }
        at -= w;
    }
    None
}

pub mod rewrite;

#[cfg(test)]
pub(crate) mod tests;
