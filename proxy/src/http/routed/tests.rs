use super::*;
use http::Request;
use remora_xds::model::header_format::HeaderFormat;
use remora_xds::model::route::HeaderEdit;

fn test_request(parts: &Parts) -> header_format::Request<'_> {
    header_format::Request {
        remote: "10.0.0.7:5000".parse().expect("addr"),
        local: "10.0.0.9:9080".parse().expect("addr"),
        started: SystemTime::UNIX_EPOCH,
        parts,
    }
}

/// Formatted values are filled in from the request; empty ones are not added (Envoy's
/// `keep_empty_value: false`).
#[test]
fn formatted_values_are_filled_in_and_empty_ones_dropped() {
    let parsed =
        |v: &str| remora_xds::convert::header_format::header_format(v, "v").expect("parsed");
    let add = [
        HeaderEdit {
            name: "x-client".into(),
            value: parsed("%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"),
            append: false,
        },
        HeaderEdit {
            name: "x-missing".into(),
            value: parsed("%REQ(x-absent)%"),
            append: false,
        },
    ];
    let (parts, ()) = Request::new(()).into_parts();
    let edits = Edits::of([(&add[..], &[][..])], &test_request(&parts));
    let mut headers = HeaderMap::new();
    edits.apply(&mut headers);
    assert_eq!(headers["x-client"], "10.0.0.7");
    assert!(headers.get("x-missing").is_none());
}

#[test]
fn a_clusters_idle_timeout_bounds_its_pooled_connections() {
    let remora = Duration::from_secs(30);
    assert_eq!(pool_idle_timeout(None, remora), remora);
    assert_eq!(pool_idle_timeout(Some(Duration::ZERO), remora), remora);
    assert_eq!(
        pool_idle_timeout(Some(Duration::from_secs(3600)), remora),
        remora
    );
    assert_eq!(
        pool_idle_timeout(Some(Duration::from_secs(5)), remora),
        Duration::from_secs(5)
    );
}

#[test]
fn grpc_timeout_header_max_and_max_stream_duration_bound_the_deadline() {
    let s = Duration::from_secs;
    let snapshot = crate::route::tests::bookinfo().snapshot();
    let cluster = snapshot
        .cluster("outbound|9080||reviews.default.svc.cluster.local")
        .expect("bookinfo's reviews");
    let routed = |timeout, header_max, stream| {
        Routed::of(Arc::new(RoutePlan {
            timeout,
            grpc_timeout_header_max: header_max,
            max_stream_duration: stream,
            ..reviews_plan(&snapshot, cluster)
        }))
    };
    // No header max: the header is not read.
    assert_eq!(
        routed(Some(s(15)), None, None).deadline(true, Some(s(2))),
        Some(s(15))
    );
    // istiod's 0s: the header as it is, only for gRPC; a zero header is no deadline.
    let r = routed(Some(s(15)), Some(s(0)), None);
    assert_eq!(r.deadline(true, Some(s(2))), Some(s(2)));
    assert_eq!(r.deadline(false, Some(s(2))), Some(s(15)));
    assert_eq!(r.deadline(true, Some(s(0))), None);
    assert_eq!(r.deadline(true, None), Some(s(15)));
    // A maximum bounds the header, and stands for a zero one.
    let r = routed(None, Some(s(5)), None);
    assert_eq!(r.deadline(true, Some(s(9))), Some(s(5)));
    assert_eq!(r.deadline(true, Some(s(0))), Some(s(5)));
    // max_stream_duration bounds everything.
    let r = routed(Some(s(15)), None, Some(s(3)));
    assert_eq!(r.deadline(false, None), Some(s(3)));
    assert_eq!(
        routed(None, None, Some(s(3))).deadline(false, None),
        Some(s(3))
    );
}

#[test]
fn redirect_locations_keep_or_strip_the_query_as_envoy_does() {
    use remora_xds::model::route::{PathMatch, Redirect};
    let redirect = |path: Option<&str>, prefix: Option<&str>, strip: bool| Redirect {
        scheme: Some("https".into()),
        host: None,
        port: Some(8443),
        path: path.map(str::to_string),
        prefix_rewrite: prefix.map(str::to_string),
        status: 301,
        strip_query: strip,
    };
    let matched = PathMatch::Prefix("/old".into());
    let at = |r: &Redirect| {
        let req = RedirectRequest {
            host: "web:80",
            path_and_query: "/old/x?a=1",
            scheme: "http",
        };
        rewrite::redirect_location(r, &matched, req)
    };
    assert_eq!(
        at(&redirect(None, None, false)),
        "https://web:8443/old/x?a=1"
    );
    assert_eq!(at(&redirect(None, None, true)), "https://web:8443/old/x");
    assert_eq!(
        at(&redirect(None, Some("/new"), false)),
        "https://web:8443/new/x?a=1"
    );
    assert_eq!(
        at(&redirect(Some("/p"), None, false)),
        "https://web:8443/p?a=1"
    );
    assert_eq!(
        at(&redirect(Some("/p?b=2"), None, false)),
        "https://web:8443/p?b=2"
    );
}

#[test]
fn prefix_rewrite_replaces_what_the_route_matched() {
    use remora_xds::model::route::PathMatch;
    let rewrite_prefix = rewrite::prefix;
    let prefix = PathMatch::Prefix("/api".into());
    assert_eq!(
        rewrite_prefix(&prefix, "/api/v1?x=1", "/").as_deref(),
        Some("//v1?x=1")
    );
    assert_eq!(
        rewrite_prefix(&prefix, "/API/v1", "/v2").as_deref(),
        Some("/v2/v1")
    );
    let exact = PathMatch::Exact("/old".into());
    assert_eq!(
        rewrite_prefix(&exact, "/old", "/new").as_deref(),
        Some("/new")
    );
}

/// A weighted destination's own header edits (VirtualService `route[].headers`) go with
/// the cluster picked, and only with it.
#[test]
fn a_weighted_clusters_own_edits_follow_the_pick() {
    type Proto = envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
    let table = remora_xds::convert::from_json::<Proto>(&serde_json::json!({
        "name": "9080", "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"weighted_clusters": {"clusters": [
                {"name": "v1", "weight": 50, "request_headers_to_add": [
                    {"header": {"key": "x-subset", "value": "v1"}}]},
                {"name": "v2", "weight": 50, "response_headers_to_add": [
                    {"header": {"key": "x-served", "value": "v2"}}]}]}},
             "request_headers_to_add": [{"header": {"key": "x-route", "value": "yes"}}]}]}]
    }))
    .expect("accepted")
    .model;
    let vhost = &table.virtual_hosts[0];
    let route = &vhost.routes[0];
    let remora_xds::model::route::Action::Forward(forward) = &route.action else {
        panic!("{:?}", route.action)
    };
    let (parts, ()) = Request::new(()).into_parts();
    let format_request = test_request(&parts);
    let applied = |cluster: &str| {
        let (request, response) = edits(&table, vhost, route, forward, cluster, &format_request);
        let (mut req, mut resp) = (HeaderMap::new(), HeaderMap::new());
        request.apply(&mut req);
        response.apply(&mut resp);
        (req, resp)
    };
    let (req, resp) = applied("v1");
    assert_eq!(req["x-subset"], "v1");
    assert_eq!(req["x-route"], "yes");
    assert!(resp.get("x-served").is_none());
    let (req, resp) = applied("v2");
    assert!(req.get("x-subset").is_none());
    assert_eq!(resp["x-served"], "v2");
}

#[test]
fn edits_remove_then_add_most_specific_first() {
    let edit = |name: &str, value: &str, append: bool| HeaderEdit {
        name: name.into(),
        value: HeaderFormat::literal(value),
        append,
    };
    let route = [edit("x-a", "route", false), edit("x-b", "1", true)];
    let vhost = [edit("x-a", "vhost", false), edit("x-b", "2", true)];
    let remove = ["x-gone".to_string()];
    let (parts, ()) = Request::new(()).into_parts();
    let edits = Edits::of(
        [(&route[..], &remove[..]), (&vhost[..], &[][..])],
        &test_request(&parts),
    );
    let mut headers = HeaderMap::new();
    headers.insert("x-gone", HeaderValue::from_static("y"));
    headers.insert("x-b", HeaderValue::from_static("0"));
    edits.apply(&mut headers);
    assert!(headers.get("x-gone").is_none());
    assert_eq!(headers["x-a"], "vhost");
    let b: Vec<&str> = headers
        .get_all("x-b")
        .iter()
        .map(|v| v.to_str().unwrap_or_default())
        .collect();
    assert_eq!(b, ["0", "1", "2"]);
}

#[test]
fn tried_endpoints_are_kept_in_order_inline_then_spilled() {
    let at = |last: u8| SocketAddr::from(([10, 0, 0, last], 80));
    let mut tried = Tried::default();
    assert!(tried.as_slice().is_empty());
    tried.push(at(1));
    assert_eq!(tried.as_slice(), [at(1)]);
    tried.push(at(2));
    tried.push(at(1));
    assert_eq!(tried.as_slice(), [at(1), at(2), at(1)]);
}

/// The deadline each attempt is told, as Envoy's router computes it: the route's timeout
/// left, no more than the per-try timeout.
#[test]
fn attempts_are_told_the_deadline_left_within_the_per_try_timeout() {
    let ms = Duration::from_millis;
    let snapshot = crate::route::tests::bookinfo().snapshot();
    let cluster = snapshot
        .cluster("outbound|9080||reviews.default.svc.cluster.local")
        .expect("bookinfo's reviews");
    let routed = |timeout, per_try| {
        Routed::of(Arc::new(RoutePlan {
            timeout,
            retries: 2,
            retry: crate::http::retry_policy::RetryRules {
                timing: Some(Box::new(crate::http::retry_policy::RetryTiming {
                    per_try_timeout: per_try,
                    backoff: None,
                    previous_priorities: None,
                })),
                ..Default::default()
            },
            ..reviews_plan(&snapshot, cluster)
        }))
    };
    let r = routed(Some(ms(1000)), Some(ms(300)));
    assert_eq!(r.expected_timeout(ms(0)), Some(ms(300)));
    assert_eq!(r.expected_timeout(ms(800)), Some(ms(200)));
    assert_eq!(r.expected_timeout(ms(1000)), None);
    assert_eq!(
        routed(None, Some(ms(300))).expected_timeout(ms(900)),
        Some(ms(300))
    );
    assert_eq!(
        routed(Some(ms(500)), None).expected_timeout(ms(100)),
        Some(ms(400))
    );
    assert_eq!(routed(None, None).expected_timeout(ms(0)), None);
}

/// A plan of one attempt to bookinfo's `reviews` (`cluster` of `snapshot`), for tests to
/// change.
fn reviews_plan(
    snapshot: &remora_xds::snapshot::Snapshot,
    cluster: &Arc<remora_xds::model::cluster::Cluster>,
) -> RoutePlan {
    RoutePlan::single_attempt(RoutedCluster {
        model: Arc::clone(cluster),
        state: crate::upstream::Upstreams::default().state_of(snapshot, cluster),
        metrics_peer: None,
        plain_http1_upstream: true,
        generation: 0,
        eds: None,
    })
}
