//! The route cases of `xds/tests/cases/` through `remora_xds`: the tables Envoy 1.40 accepts
//! (`cases_envoy.rs`) must send each request where istiod meant it to go, with the timeouts,
//! retries, rewrites, header edits, redirects and direct responses it wrote.

mod cases_support;

use cases_support::*;
use remora_xds::model::route::{
    Action, ClusterTarget, HeaderEdit, Redirect, RequestParts, RetryPolicy, RouteConfiguration,
    DEFAULT_ROUTE_TIMEOUT,
};
use std::sync::Arc;
use std::time::Duration;

const REVIEWS: &str = "reviews.default.svc.cluster.local";

fn reviews(subset: &str) -> String {
    format!("outbound|9080|{subset}|{REVIEWS}")
}

fn table(case: &str, name: &str) -> Arc<RouteConfiguration> {
    snapshot(case)
        .route_configuration(name)
        .cloned()
        .unwrap_or_else(|| panic!("{case}: no route table {name}"))
}

/// istiod's retry policy when the VirtualService sets none (`retry.go`'s default).
fn istiod_default_retry(policy: Option<&RetryPolicy>) {
    let p = policy.expect("istiod's default retry policy");
    assert_eq!(
        p.retry_on,
        [
            "connect-failure",
            "refused-stream",
            "unavailable",
            "cancelled",
            "retriable-status-codes"
        ]
    );
    assert_eq!(p.num_retries, 2);
    assert!(p.avoid_previous_hosts);
    assert_eq!(p.host_selection_retry_max_attempts, 5);
    assert!(p.retriable_status_codes.is_empty());
    assert_eq!(
        (p.per_try_timeout, p.backoff_base, p.backoff_max),
        (None, None, None)
    );
}

fn edit(name: &str, value: &str, append: bool) -> HeaderEdit {
    HeaderEdit {
        name: name.into(),
        value: remora_xds::model::header_format::HeaderFormat::literal(value),
        append,
    }
}

#[test]
fn traffic_split_hosts_reach_their_virtual_host() {
    let rc = table("traffic-split", "9080");
    assert!(rc.ignore_port_in_host_matching && !rc.validate_clusters);
    let vh = |host: &str| rc.virtual_host(host).map(|v| v.name.as_str());
    let main = Some("reviews.default.svc.cluster.local:9080");
    for host in [
        "reviews:9080",
        "reviews",
        "reviews.default",
        "REVIEWS.default.svc:9080",
        "reviews.default.svc.cluster.local:9080",
        "10.96.0.20:9080",
    ] {
        assert_eq!(vh(host), main, "{host}");
    }
    assert_eq!(vh("ratings:9080"), Some("allow_any"));
    assert!(rc
        .virtual_hosts
        .iter()
        .all(|v| v.include_request_attempt_count));
    // Anything else passes through, with no deadline and no retries.
    let r = lookup(&rc, "ratings:9080", &get("/")).expect("allow_any");
    let f = forward(r);
    assert_eq!(
        f.target,
        ClusterTarget::Cluster("PassthroughCluster".into())
    );
    assert_eq!((f.timeout, f.retry_policy.as_ref()), (None, None));
}

#[test]
fn traffic_split_matches_pick_the_subset() {
    let rc = table("traffic-split", "9080");
    let host = "reviews:9080";
    let route = |req: Request| name_of(lookup(&rc, host, &req)).map(str::to_string);
    let at = |s: &str| Some(s.to_string());

    // Header exact match (case matters in the value).
    assert_eq!(route(get("/").header("end-user", "jason")), at("jason"));
    assert_eq!(route(get("/x").header("end-user", "Jason")), at("split"));
    // Regex URI (whole path), a presence match and the method, all needed.
    let api = || get("/api/v2/ratings").method("POST").header("x-canary", "");
    assert_eq!(route(api()), at("api-canary"));
    assert_eq!(
        route(get("/api/v2/ratings").header("x-canary", "1")),
        at("split")
    );
    assert_eq!(route(get("/api/v2/ratings").method("POST")), at("split"));
    assert_eq!(
        route(get("/api/v2").method("POST").header("x-canary", "1")),
        at("split")
    );
    assert_eq!(
        route(get("/x/api/v2/r").method("POST").header("x-canary", "1")),
        at("split")
    );
    // Case-insensitive prefix, a header regex and a query parameter.
    let ff = "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0";
    assert_eq!(
        route(get("/REVIEWS/1?debug=1").header("user-agent", ff)),
        at("firefox-debug")
    );
    assert_eq!(
        route(get("/reviews/1?a=b&debug=1").header("user-agent", ff)),
        at("firefox-debug")
    );
    assert_eq!(
        route(get("/reviews/1?debug=2").header("user-agent", ff)),
        at("split")
    );
    assert_eq!(
        route(get("/reviews/1?debug=1").header("user-agent", "curl/8")),
        at("split")
    );
    assert_eq!(route(get("/reviews/1?debug=1")), at("split"));

    let target = |req: Request| {
        forward(lookup(&rc, host, &req).expect("a route"))
            .target
            .clone()
    };
    assert_eq!(
        target(get("/").header("end-user", "jason")),
        ClusterTarget::Cluster(reviews("v2"))
    );
    assert_eq!(target(api()), ClusterTarget::Cluster(reviews("v3")));
    assert_eq!(
        target(get("/reviews/1?debug=1").header("user-agent", ff)),
        ClusterTarget::Cluster(reviews("v1"))
    );
    // Every cluster the table names is in the case.
    let snap = snapshot("traffic-split");
    for vh in &rc.virtual_hosts {
        for r in &vh.routes {
            match &forward(r).target {
                ClusterTarget::Cluster(c) => assert!(snap.cluster(c).is_some(), "{c}"),
                ClusterTarget::Weighted(w) => w
                    .iter()
                    .for_each(|c| assert!(snap.cluster(&c.name).is_some(), "{}", c.name)),
            }
        }
    }
}

#[test]
fn traffic_split_timeouts_retries_and_weights() {
    let rc = table("traffic-split", "9080");
    let host = "reviews.default.svc.cluster.local";
    let r = lookup(&rc, host, &get("/").header("end-user", "jason")).expect("jason");
    assert_eq!(
        r.decorator.as_deref(),
        Some("reviews.default.svc.cluster.local:9080/*")
    );
    assert_eq!(
        r.istio_config.as_deref(),
        Some("/apis/networking.istio.io/v1alpha3/namespaces/default/virtual-service/reviews")
    );
    let f = forward(r);
    assert_eq!(f.timeout, None, "timeout: 0s is no deadline");
    assert_eq!(
        f.grpc_timeout_header_max,
        Some(Duration::ZERO),
        "max_grpc_timeout: 0s"
    );
    istiod_default_retry(f.retry_policy.as_ref());

    // A 3 s timeout with istiod's default retries (custom retries are a gap: cases_refusals.rs).
    let api = get("/api/v1/x").method("POST").header("x-canary", "yes");
    let f = forward(lookup(&rc, host, &api).expect("api-canary"));
    assert_eq!(f.timeout, Some(Duration::from_secs(3)));
    assert_eq!(f.grpc_timeout_header_max, Some(Duration::from_secs(3)));
    istiod_default_retry(f.retry_policy.as_ref());

    // retries {attempts: 0}: istiod writes no policy.
    let ff = get("/reviews/2?debug=1").header("user-agent", "x Firefox/1");
    let f = forward(lookup(&rc, host, &ff).expect("firefox-debug"));
    assert_eq!((f.timeout, f.retry_policy.as_ref()), (None, None));

    // route: [{v1, weight 80, headers.request.set x-subset}, {v3, weight 20, headers.response.remove}]
    let f = forward(lookup(&rc, host, &get("/productpage")).expect("split"));
    assert_eq!(f.timeout, Some(Duration::from_secs(10)));
    istiod_default_retry(f.retry_policy.as_ref());
    let ClusterTarget::Weighted(w) = &f.target else {
        panic!("not weighted: {:?}", f.target)
    };
    let weights: Vec<_> = w.iter().map(|c| (c.name.clone(), c.weight)).collect();
    assert_eq!(weights, [(reviews("v1"), 80), (reviews("v3"), 20)]);
    assert_eq!(w[0].request_headers_to_add, [edit("x-subset", "v1", false)]);
    assert!(w[0].response_headers_to_remove.is_empty());
    assert_eq!(w[1].response_headers_to_remove, ["x-internal"]);
    assert!(w[1].request_headers_to_add.is_empty());
    let picks: Vec<_> = (0..1000).filter_map(|roll| f.target.pick(roll)).collect();
    let v1 = picks.iter().filter(|p| **p == reviews("v1")).count();
    assert_eq!((picks.len(), v1), (1000, 800));
}

#[test]
fn redirects_and_direct_responses() {
    let rc = table("redirect-rewrite", "8000");
    let host = "httpbin.default:8000";
    let action = |req: Request| lookup(&rc, host, &req).expect("a route").action.clone();
    // redirect {uri: /new, authority: httpbin.org, scheme: https, port: 8443, redirectCode: 302}
    assert_eq!(
        action(get("/old?x=1")),
        Action::Redirect(Redirect {
            scheme: Some("https".into()),
            host: Some("httpbin.org".into()),
            port: Some(8443),
            path: Some("/new".into()),
            prefix_rewrite: None,
            status: 302,
            strip_query: false,
        })
    );
    assert_eq!(
        name_of(lookup(&rc, host, &get("/old/x"))),
        Some("default"),
        "exact path"
    );
    // HTTPRedirect's prefix form, default code: only the prefix changes, 301.
    let Action::Redirect(r) = action(get("/v1/items")) else {
        panic!("not a redirect")
    };
    assert_eq!(
        (r.prefix_rewrite.as_deref(), r.path, r.host, r.status),
        (Some("/v2/"), None, None, 301)
    );
    assert_eq!(
        action(get("/teapot")),
        Action::DirectResponse {
            status: 418,
            body: Some("I'm a teapot".into())
        }
    );
    assert_eq!(
        action(get("/GONE/now")),
        Action::DirectResponse {
            status: 410,
            body: None
        }
    );
}

#[test]
fn rewrites_header_edits_and_separated_prefixes() {
    let rc = table("redirect-rewrite", "8000");
    let host = "httpbin:8000";
    let cluster = ClusterTarget::Cluster("outbound|8000||httpbin.default.svc.cluster.local".into());
    let r = lookup(&rc, host, &get("/status/418")).expect("rewrite");
    assert_eq!(r.name.as_deref(), Some("rewrite"));
    let f = forward(r);
    assert_eq!(f.target, cluster);
    assert_eq!(f.prefix_rewrite.as_deref(), Some("/anything/"));
    assert_eq!(f.host_rewrite.as_deref(), Some("httpbin.internal"));
    assert_eq!(f.timeout, Some(Duration::from_millis(2500)));
    istiod_default_retry(f.retry_policy.as_ref());
    // headers.request.set / add / remove, headers.response.set / remove
    assert_eq!(
        r.request_headers_to_add,
        [
            edit("x-request-source", "mesh", false),
            edit("x-trace", "on", true)
        ]
    );
    assert_eq!(r.request_headers_to_remove, ["x-debug"]);
    assert_eq!(
        r.response_headers_to_add,
        [edit("cache-control", "no-store", false)]
    );
    assert_eq!(r.response_headers_to_remove, ["server"]);

    // GAMMA's path_separated_prefix: `/api` and below, not `/apix`.
    let name = |path: &'static str| name_of(lookup(&rc, host, &get(path))).map(str::to_string);
    assert_eq!(name("/api").as_deref(), Some("gamma-api"));
    assert_eq!(name("/api/v1?q=1").as_deref(), Some("gamma-api"));
    assert_eq!(name("/apix").as_deref(), Some("default"));
    assert_eq!(
        name("/API/v1").as_deref(),
        Some("default"),
        "case-sensitive"
    );
    let f = forward(lookup(&rc, host, &get("/api/v1")).expect("gamma-api"));
    assert_eq!((f.timeout, f.retry_policy.as_ref()), (None, None));

    // A route without any timeout has Envoy's 15 s.
    let f = forward(lookup(&rc, "legacy.example.com", &get("/")).expect("no-timeout"));
    assert_eq!(f.timeout, Some(DEFAULT_ROUTE_TIMEOUT));
    assert_eq!(DEFAULT_ROUTE_TIMEOUT, Duration::from_secs(15));
    assert!(f.retry_policy.is_none());
    // The table has no `*` host: another Host reaches no route (Envoy's 404 NR).
    assert!(lookup(&rc, "elsewhere", &get("/")).is_none());
}

#[test]
fn the_outbound_listener_leads_to_the_route_table() {
    use remora_xds::model::listener::{ChainKind, ConnectionFacts, RouteSource};
    let snap = snapshot("traffic-split");
    let listener = snap.listener("0.0.0.0_9080").expect("0.0.0.0_9080");
    let conn = |alpn: &'static [&'static str]| ConnectionFacts {
        destination: "10.96.0.20:9080".parse().expect("address"),
        server_name: None,
        transport_protocol: "raw_buffer",
        application_protocols: alpn,
    };
    let chain = listener
        .filter_chain(&conn(&["http/1.1"]))
        .expect("the HTTP chain");
    let ChainKind::Http(http) = &chain.kind else {
        panic!("not HTTP: {:?}", chain.kind)
    };
    assert_eq!(http.routes, RouteSource::Rds("9080".into()));
    assert_eq!(
        snap.wanted_routes().into_iter().collect::<Vec<_>>(),
        ["9080"]
    );
    // Through the listener, the table and the virtual host, as the data path looks it up.
    let user = String::from("jason");
    let jason = |name: &str| -> Option<&str> { (name == "end-user").then_some(user.as_str()) };
    let parts = RequestParts {
        method: "GET",
        path_and_query: "/reviews/1",
        header: &jason,
        values: &|name: &str, visit: &mut dyn FnMut(&str) -> bool| {
            jason(name).is_some_and(&mut *visit)
        },
    };
    let route = snap
        .http_route(http, "reviews:9080", &parts)
        .expect("a route");
    assert_eq!(route.name.as_deref(), Some("jason"));
    assert_eq!(forward(route).target, ClusterTarget::Cluster(reviews("v2")));
    // Not HTTP (TLS the sidecar did not originate): the default chain, TCP to PassthroughCluster.
    let tls = listener
        .filter_chain(&ConnectionFacts {
            transport_protocol: "tls",
            ..conn(&[])
        })
        .expect("the default chain");
    assert_eq!(tls.name.as_deref(), Some("PassthroughFilterChain"));
    assert!(matches!(tls.kind, ChainKind::Tcp(_)));
}

#[test]
fn header_prefix_authority_and_query_presence() {
    let rc = table("redirect-rewrite", "8000");
    let name = |host: &str, req: Request| name_of(lookup(&rc, host, &req)).map(str::to_string);
    let fqdn = "httpbin.default.svc.cluster.local:8000";
    let canary = || get("/get?a=1&trace").header("x-env", "canary-7");
    assert_eq!(name(fqdn, canary()).as_deref(), Some("canary-fqdn"));
    assert_eq!(
        name("httpbin.default.svc", canary()).as_deref(),
        Some("canary-fqdn")
    );
    // The short name fails the authority prefix; the rest fail one condition each.
    assert_eq!(name("httpbin:8000", canary()).as_deref(), Some("default"));
    assert_eq!(
        name(fqdn, get("/get?trace=1").header("x-env", "prod")).as_deref(),
        Some("default")
    );
    assert_eq!(
        name(fqdn, get("/get?a=1").header("x-env", "canary-7")).as_deref(),
        Some("default")
    );
    assert_eq!(name(fqdn, get("/get?trace")).as_deref(), Some("default"));
    let f = forward(lookup(&rc, fqdn, &canary()).expect("canary-fqdn"));
    assert_eq!(f.timeout, Some(Duration::from_secs(1)));
}

/// VirtualService `corsPolicy` as istiod writes it: a preflight from an allowed origin (exact,
/// prefix, regex) answered, one from another forwarded or (`unmatchedPreflights: IGNORE`)
/// answered without an allowed origin; a simple request's response headers.
#[test]
fn cors_as_istiod_writes_it() {
    use remora_xds::model::cors::{CorsOutcome, CorsRequest, ALLOW_ORIGIN};
    let preflight = |origin| CorsRequest {
        method: "OPTIONS",
        origin: Some(origin),
        request_method: Some("POST"),
        ..CorsRequest::default()
    };
    let forwarding = table("cors", "cors");
    let cors = forwarding.virtual_hosts[0].routes[0]
        .cors
        .clone()
        .expect("cors");
    for origin in [
        "https://example.com",
        "https://app.x",
        "https://web.example.org",
    ] {
        let CorsOutcome::Preflight(h) = cors.evaluate(&preflight(origin), 0) else {
            panic!("{origin}: not answered");
        };
        assert!(
            h.contains(&(ALLOW_ORIGIN, origin.to_string())),
            "{origin}: {h:?}"
        );
    }
    assert_eq!(
        cors.evaluate(&preflight("https://evil.org"), 0),
        CorsOutcome::Pass
    );
    let get = CorsRequest {
        method: "GET",
        origin: Some("https://example.com"),
        ..CorsRequest::default()
    };
    assert!(matches!(cors.evaluate(&get, 0), CorsOutcome::Response(h) if h.len() == 3));
    let ignoring = table("cors", "cors-ignore-unmatched");
    let cors = ignoring.virtual_hosts[0].routes[0]
        .cors
        .clone()
        .expect("cors");
    let CorsOutcome::Preflight(h) = cors.evaluate(&preflight("https://evil.org"), 0) else {
        panic!("not answered");
    };
    assert!(h.iter().all(|(n, _)| *n != ALLOW_ORIGIN), "{h:?}");
}

/// VirtualService `fault` and `retries` as istiod writes them: the retries with their own
/// conditions, per-try timeout, status codes and back-off; the faults with their fractions.
#[test]
fn faults_and_retries_as_istiod_writes_them() {
    use remora_xds::model::fault::AbortStatus;
    use remora_xds::model::retry::RetryOn;
    let retries = table("faults-retries", "custom-retries");
    let route = &retries.virtual_hosts[0].routes[0];
    let p = forward(route).retry_policy.as_ref().expect("policy");
    assert_eq!(p.num_retries, 3);
    assert!(p.conditions.any(RetryOn::FIVE_XX) && p.conditions.any(RetryOn::GATEWAY_ERROR));
    assert_eq!(&*p.retriable_status_codes, &[503]);
    assert_eq!(p.per_try_timeout, Some(Duration::from_secs(1)));
    assert_eq!(
        (p.backoff_base, p.backoff_max),
        (
            Some(Duration::from_millis(25)),
            Some(Duration::from_millis(250))
        )
    );
    assert_eq!(p.previous_priorities, None);
    // retryRemoteLocalities: Envoy's previous_priorities, istiod's update frequency 2.
    let remote = table("faults-retries", "retry-remote-localities");
    let p = forward(&remote.virtual_hosts[0].routes[0])
        .retry_policy
        .as_ref()
        .expect("policy");
    assert_eq!(p.previous_priorities, Some(2));
    let abort = table("faults-retries", "fault");
    let fault = abort.virtual_hosts[0].routes[0]
        .fault
        .clone()
        .expect("fault");
    let a = fault.abort.as_ref().expect("abort");
    assert_eq!(a.status, AbortStatus::Http(503));
    assert_eq!(a.fraction.per_million(), 100);
    assert!(fault.delay.is_none());
    let both = table("faults-retries", "fault-delay-grpc");
    let fault = both.virtual_hosts[0].routes[0]
        .fault
        .clone()
        .expect("fault");
    let d = fault.delay.as_ref().expect("delay");
    assert_eq!(d.duration, Duration::from_secs(7));
    assert_eq!(d.fraction.per_million(), 1_000_000);
    let a = fault.abort.as_ref().expect("abort");
    assert_eq!(
        (a.status, a.fraction.per_million()),
        (AbortStatus::Grpc(14), 500_000)
    );
}

/// VirtualService `mirror` and `mirrors` as istiod writes them: each policy's cluster and
/// fraction, every copy's authority with `-shadow`.
#[test]
fn mirrors_as_istiod_writes_them() {
    let one = table("mirror", "mirror");
    let f = forward(&one.virtual_hosts[0].routes[0]);
    assert_eq!(f.mirrors.len(), 1);
    assert_eq!(
        f.mirrors[0].cluster,
        "outbound|9080|v2|gaps.default.svc.cluster.local"
    );
    assert_eq!(f.mirrors[0].fraction.per_million(), 1_000_000);
    assert_eq!(f.mirrors[0].shadow_host("gaps:9080"), "gaps-shadow:9080");
    let two = table("mirror", "mirrors");
    let f = forward(&two.virtual_hosts[0].routes[0]);
    let fractions: Vec<u32> = f.mirrors.iter().map(|m| m.fraction.per_million()).collect();
    assert_eq!(fractions, [250_000, 500_000]);
    assert!(f.mirrors.iter().all(|m| m.shadow_suffix));
}

/// DestinationRule `consistentHash` on the route: what each route hashes.
#[test]
fn hash_policies_as_istiod_writes_them() {
    use remora_xds::model::hash::HashKind;
    let kind = |name: &str| {
        let t = table("consistent-hash", name);
        let f = forward(&t.virtual_hosts[0].routes[0]);
        assert_eq!(f.hash_policy.len(), 1, "{name}");
        assert!(!f.hash_policy[0].terminal, "{name}");
        f.hash_policy[0].kind.clone()
    };
    assert_eq!(kind("consistent-hash"), HashKind::Header("x-user".into()));
    assert_eq!(kind("hash-source-ip"), HashKind::SourceIp);
    assert_eq!(kind("hash-query"), HashKind::QueryParameter("user".into()));
    assert_eq!(kind("hash-cookie"), HashKind::Cookie("session".into()));
    assert_eq!(
        kind("hash-cookie-ttl"),
        HashKind::GeneratedCookie(remora_xds::model::hash::GeneratedCookie {
            name: "sticky".into(),
            ttl_seconds: 3600,
            path: "/".into(),
            attributes: vec![],
        })
    );
}
