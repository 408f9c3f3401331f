//! The request a route is matched on, and the route as the HTTP filters before the router
//! find it. Envoy's connection manager chooses a request's route when its headers arrive,
//! before its filters run, and its ext_authz filter charges its outcome to that route's
//! cluster; Remora chooses the route after the filters ([`super::decide`]), so the filter asks
//! here first, by the same matching, the same memo and the same weighted pick
//! ([`RouteBasis::pick`]) as the decision the request then takes.

use super::memo;
use super::RoutedCluster;
use crate::http::ext_authz::RouteBasis;
use crate::http::ConnContext;
use crate::route::{self, HttpDecision};
use http::{HeaderMap, Method, Uri};
use remora_xds::model::cluster::Cluster;
use remora_xds::model::listener::RouteSource;
use remora_xds::model::route::RequestParts;
use std::sync::Arc;

/// Call `f` with the request's Host and its parts as a route matches them: `uri`'s target
/// and `headers` (Host, else the target's authority).
pub(super) fn matched_on<R>(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    f: impl FnOnce(&str, &RequestParts<'_>) -> R,
) -> R {
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .unwrap_or_default();
    let header = |name: &str| match name {
        ":authority" => Some(host),
        ":method" => Some(method.as_str()),
        ":path" => uri.path_and_query().map(|p| p.as_str()),
        _ => headers.get(name).and_then(|v| v.to_str().ok()),
    };
    let values = |name: &str, visit: &mut dyn FnMut(&str) -> bool| match name {
        ":authority" | ":method" | ":path" => header(name).is_some_and(&mut *visit),
        _ => headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(visit),
    };
    let req = RequestParts {
        method: method.as_str(),
        path_and_query: uri.path_and_query().map_or("/", |p| p.as_str()),
        header: &header,
        values: &values,
    };
    f(host, &req)
}

/// What the request's route is, before the router.
#[derive(Debug)]
pub enum RouteTarget {
    /// No route takes it (no table, virtual host or route; or every weight zero).
    None,
    /// A route that answers itself (a direct response, a redirect): no cluster.
    Local,
    /// A route to a cluster: the cluster, resolved (`None`: no such cluster).
    Cluster(Option<Arc<RoutedCluster>>),
}

/// The route of the request `basis` (with `method`) on `ctx`'s connection, found as
/// [`super::decide`] will find it when given the same basis: by the connection's memo, which
/// keeps what it resolves for that decision, so this allocates nothing the decision would
/// not have.
pub fn route_target(ctx: &ConnContext, method: &Method, basis: &RouteBasis) -> RouteTarget {
    let (Some(routes), Some(store)) = (ctx.xds_routes.as_deref(), &ctx.proxy.xds) else {
        return RouteTarget::None;
    };
    matched_on(method, &basis.uri, &basis.headers, |host, req| {
        target_of(ctx, routes, store, host, req, basis.pick)
    })
}

/// The cluster of the request's route, for the access log of a request a filter answers:
/// Envoy's connection manager resolves the route before its filters run, so such a request
/// is logged with its route's cluster (`%UPSTREAM_CLUSTER%`). `None` without one.
pub fn logged_cluster(ctx: &ConnContext, parts: &http::request::Parts) -> Option<Arc<Cluster>> {
    let (Some(routes), Some(store)) = (ctx.xds_routes.as_deref(), &ctx.proxy.xds) else {
        return None;
    };
    let target = matched_on(&parts.method, &parts.uri, &parts.headers, |host, req| {
        target_of(ctx, routes, store, host, req, fastrand::u64(..))
    });
    match target {
        RouteTarget::Cluster(Some(c)) => Some(Arc::clone(&c.model)),
        _ => None,
    }
}

fn target_of(
    ctx: &ConnContext,
    routes: &RouteSource,
    store: &remora_xds::store::Store,
    host: &str,
    req: &RequestParts<'_>,
    pick: u64,
) -> RouteTarget {
    let mut memo = ctx.route_memo.lock();
    let memo = memo::Memo::of(&mut memo, store, routes);
    let Some((Some(table), mut clusters)) = memo.split(store, host.as_bytes()) else {
        return RouteTarget::None;
    };
    match route::http_route_in(table.vhost, req, pick) {
        HttpDecision::Forward { cluster, .. } => RouteTarget::Cluster(clusters.get(ctx, cluster)),
        HttpDecision::Redirect { .. } | HttpDecision::DirectResponse { .. } => RouteTarget::Local,
        HttpDecision::NoRoute | HttpDecision::NoRouteTable => RouteTarget::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::routed::decide_request;
    use remora_config::Config;

    const V1: &str = "outbound|9080|v1|reviews.default.svc.cluster.local";
    const V2: &str = "outbound|9080|v2|reviews.default.svc.cluster.local";

    /// A connection routed by bookinfo's table `9080` (`table` for another).
    fn connection(table: &str) -> ConnContext {
        let mut proxy = crate::proxy::Proxy::for_tests(Config::default());
        Arc::get_mut(&mut proxy).expect("not shared yet").xds =
            Some(Arc::new(crate::route::tests::bookinfo()));
        let dst = "10.96.0.10:9080".parse().expect("address");
        let peer = "10.0.0.9:4000".parse().expect("address");
        let mut ctx = ConnContext::for_tests(proxy, dst, peer);
        ctx.xds_routes = Some(Box::new(RouteSource::Rds(table.into())));
        ctx
    }

    fn basis(host: &str, path: &str, pick: u64) -> RouteBasis {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, host.parse().expect("a host"));
        RouteBasis {
            uri: path.parse().expect("a path"),
            headers,
            pick,
        }
    }

    fn cluster_name(target: &RouteTarget) -> Option<String> {
        match target {
            RouteTarget::Cluster(Some(c)) => Some(c.model.name.clone()),
            _ => None,
        }
    }

    #[test]
    fn the_route_found_before_the_filters_is_the_routers() {
        let ctx = connection("9080");
        let get = Method::GET;
        // A weighted route: the same pick, the same cluster as the router's decision.
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..64u64 {
            let b = basis("reviews", "/split", i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let looked = cluster_name(&route_target(&ctx, &get, &b));
            let routes = ctx.xds_routes.as_deref().expect("routes");
            let decided = matched_on(&get, &b.uri, &b.headers, |host, req| {
                decide_request(&ctx, routes, host.as_bytes(), req, None, b.pick)
            });
            let decided = decided.ok().and_then(|d| {
                let c = d.routed.cluster.as_ref()?;
                Some(c.model.name.clone())
            });
            assert_eq!(looked, decided, "pick {}", b.pick);
            seen.extend(looked);
        }
        assert_eq!(seen, [V1.to_string(), V2.to_string()].into());
        // A header the route matches on.
        let mut jason = basis("reviews", "/", 0);
        jason
            .headers
            .insert("end-user", "jason".parse().expect("a value"));
        assert_eq!(
            cluster_name(&route_target(&ctx, &get, &jason)).as_deref(),
            Some(V2)
        );
        // A cluster that does not exist; a direct response; no route table.
        let missing = route_target(&ctx, &get, &basis("reviews", "/missing", 0));
        assert!(matches!(missing, RouteTarget::Cluster(None)), "{missing:?}");
        let direct = route_target(&ctx, &get, &basis("a.example.com", "/", 0));
        assert!(matches!(direct, RouteTarget::Local), "{direct:?}");
        let none = route_target(&connection("8080"), &get, &basis("reviews", "/", 0));
        assert!(matches!(none, RouteTarget::None), "{none:?}");
    }
}
