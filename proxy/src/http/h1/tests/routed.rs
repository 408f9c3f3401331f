//! The fast path on connections routed by xDS: each request takes the route decision and
//! the upstream layer's endpoint on its own, over one client keep-alive connection.

use super::*;
use remora_xds::model::listener::RouteSource;
use serde_json::json;

const OK_A: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\na";
const OK_B: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nb";
const UNAVAILABLE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n";

/// A proxy routing port 80 by table `80`: `svc` (telling the upstream the attempt, as istiod's
/// virtual hosts do) to a ROUND_ROBIN cluster of `endpoints` (Istio's default retries, 503
/// among them), `/plain-retries` the same without 503, `/nowhere` to a cluster that does not
/// exist, `/cors` with a CORS policy, `/edited` adding a request header, `/h2` to the same
/// endpoints in a cluster speaking HTTP/2 upstream; `quiet` (no attempt count) to the first cluster with a 5 s timeout; any
/// other host has no virtual host.
fn routed_proxy(endpoints: &[SocketAddr]) -> Arc<Proxy> {
    let cluster = "outbound|80||svc.default.svc.cluster.local";
    let lb: Vec<_> = endpoints
        .iter()
        .map(|a| json!({"endpoint": {"address": {"socket_address": {"address": a.ip().to_string(), "port_value": a.port()}}}}))
        .collect();
    let retry = |codes: bool| {
        let mut r = json!({"retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes", "num_retries": 2});
        if codes {
            r["retriable_status_codes"] = json!([503]);
        }
        r
    };
    let h2 = "outbound|80||h2.default.svc.cluster.local";
    let store = crate::xds_files::store_of(
        json!([{"name": cluster, "type": "EDS", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN",
                "eds_cluster_config": {"eds_config": {"ads": {}}, "service_name": cluster}},
               {"name": h2, "type": "EDS", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN",
                "eds_cluster_config": {"eds_config": {"ads": {}}, "service_name": h2},
                "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}}}}]),
        json!([{"cluster_name": cluster, "endpoints": [{"lb_endpoints": lb}]},
               {"cluster_name": h2, "endpoints": [{"lb_endpoints": lb}]}]),
        json!([{"name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
                "traffic_direction": "OUTBOUND", "bind_to_port": false,
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "outbound_0.0.0.0_80",
                    "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}]),
        json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [
            {"name": "quiet", "domains": ["quiet"], "routes": [
                {"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "5s", "retry_policy": retry(true)}}]},
            {"name": "svc", "domains": ["svc"], "include_request_attempt_count": true, "routes": [
                {"match": {"path": "/nowhere"}, "route": {"cluster": "outbound|80||nowhere"}},
                {"match": {"path": "/h2"}, "route": {"cluster": h2}},
                {"match": {"path": "/plain-retries"}, "route": {"cluster": cluster, "retry_policy": retry(false)}},
                {"match": {"path": "/cors"}, "route": {"cluster": cluster},
                 "typed_per_filter_config": {"envoy.filters.http.cors": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
                    "allow_origin_string_match": [{"exact": "https://a.test"}], "allow_methods": "GET,PUT"}}},
                {"match": {"path": "/edited"}, "route": {"cluster": cluster},
                 "request_headers_to_add": [{"header": {"key": "x-edited", "value": "yes"}}]},
                {"match": {"prefix": "/"}, "route": {"cluster": cluster, "retry_policy": retry(true)}}]}]}]),
    );
    let mut proxy = proxy(Config::default());
    Arc::get_mut(&mut proxy).expect("not shared yet").xds = Some(Arc::new(store));
    proxy
}

/// A client connection routed by table `80`, as `proxy/xds.rs` hands one to the HTTP path.
async fn routed_client(proxy: &Arc<Proxy>) -> TcpStream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (stream, peer) = listener.accept().await.unwrap();
    let config = proxy.config.load_full();
    tokio::spawn(super::super::super::serve(
        Arc::clone(proxy),
        config,
        super::super::super::Connection {
            downstream: Downstream::Plain(stream),
            mesh_peer: None,
            peer,
            direction: Direction::Outbound,
            // The service's address: never dialled, the route decides.
            destination: "10.96.0.10:80".parse().unwrap(),
            source: None,
            connect_timeout: Duration::from_secs(1),
            version: HttpVersion::Http1,
            prefix: BytesMut::new(),
            early: None,
            originate: None,
            xds_routes: Some(Box::new(RouteSource::Rds("80".into()))),
            xds_chain: crate::http::XdsChainFlags {
                fault_filter: true,
                cors_filter: true,
                ..Default::default()
            },
            xds_inbound: None,
        },
    ));
    client
}

async fn get(c: &mut TcpStream, buf: &mut Vec<u8>, host: &str, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nhost: {host}\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    response(c, buf).await
}

#[tokio::test]
async fn a_routed_keep_alive_connection_is_balanced_per_request_on_the_fast_path() {
    let (a, mut seen_a) = upstream(vec![Answer::Reply(OK_A)]).await;
    let (b, mut seen_b) = upstream(vec![Answer::Reply(OK_B)]).await;
    let proxy = routed_proxy(&[a, b]);
    let mut c = routed_client(&proxy).await;
    let mut buf = Vec::new();
    let mut bodies = String::new();
    for _ in 0..4 {
        let r = get(&mut c, &mut buf, "svc", "/x").await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        bodies.push_str(&r[r.len() - 1..]);
    }
    // ROUND_ROBIN over the two endpoints, request by request, on one client connection.
    assert!(bodies == "abab" || bodies == "baba", "{bodies}");
    for seen in [&mut seen_a, &mut seen_b] {
        let (first, second) = (seen.recv().await.unwrap(), seen.recv().await.unwrap());
        // Each endpoint's connection is pooled and used again.
        assert_eq!((first.conn, second.conn), (0, 0));
        assert!(first.head.starts_with("GET /x HTTP/1.1\r\nhost: svc\r\n"));
        // The virtual host asks for the attempt count, as it does of hyper's routed path.
        assert!(
            first.head.contains("x-envoy-attempt-count: 1\r\n"),
            "{}",
            first.head
        );
    }
    assert_eq!(
        proxy.metrics.http1_fast_path.get(),
        4,
        "all on the fast path"
    );

    // No virtual host: 404 NR; no such cluster: 503 NC; neither with a body (nor a content
    // type), as Envoy answers them. The connection stays.
    let r = get(&mut c, &mut buf, "elsewhere", "/x").await;
    assert!(
        r.starts_with("HTTP/1.1 404")
            && r.contains("content-length: 0\r\n")
            && !r.contains("content-type"),
        "{r}"
    );
    let r = get(&mut c, &mut buf, "svc", "/nowhere").await;
    assert!(
        r.starts_with("HTTP/1.1 503")
            && r.contains("content-length: 0\r\n")
            && !r.contains("content-type"),
        "{r}"
    );
    assert_eq!(proxy.metrics.http1_fast_path.get(), 6);
    assert!(get(&mut c, &mut buf, "svc", "/x")
        .await
        .starts_with("HTTP/1.1 200"));
    // Nothing is left counted against the endpoints once the requests ended.
    assert_eq!(proxy.upstreams.active(a) + proxy.upstreams.active(b), 0);
}

#[tokio::test]
async fn a_503_is_retried_only_when_the_routes_policy_lists_it() {
    let (a, mut seen) = upstream(vec![
        Answer::ReplyAndClose(UNAVAILABLE),
        Answer::Reply(OK_A),
        Answer::ReplyAndClose(UNAVAILABLE),
    ])
    .await;
    let proxy = routed_proxy(&[a]);
    let mut c = routed_client(&proxy).await;
    let mut buf = Vec::new();
    let r = get(&mut c, &mut buf, "svc", "/x").await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let (first, second) = (seen.recv().await.unwrap(), seen.recv().await.unwrap());
    assert!(first.head.contains("x-envoy-attempt-count: 1\r\n"));
    assert!(second.head.contains("x-envoy-attempt-count: 2\r\n"));
    // Retries without 503 among their codes: the 503 is the answer.
    let r = get(&mut c, &mut buf, "svc", "/plain-retries").await;
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert_eq!(proxy.metrics.http1_fast_path.get(), 2);
}

#[tokio::test]
async fn a_route_that_edits_headers_hands_the_connection_to_hyper() {
    let (a, mut seen) = upstream(vec![Answer::Reply(OK_A)]).await;
    let proxy = routed_proxy(&[a]);
    let mut c = routed_client(&proxy).await;
    let mut buf = Vec::new();
    assert!(get(&mut c, &mut buf, "svc", "/x")
        .await
        .starts_with("HTTP/1.1 200"));
    let r = get(&mut c, &mut buf, "svc", "/edited").await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let _ = seen.recv().await.unwrap();
    let edited = seen.recv().await.unwrap();
    assert!(edited.head.contains("x-edited: yes\r\n"), "{}", edited.head);
    // The first request was the fast path's; from the edited one on, hyper serves.
    assert!(get(&mut c, &mut buf, "svc", "/x")
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(proxy.metrics.http1_fast_path.get(), 1);
}

#[tokio::test]
async fn a_route_with_a_cors_policy_hands_the_connection_to_hyper() {
    let (a, mut seen) = upstream(vec![Answer::Reply(OK_A)]).await;
    let proxy = routed_proxy(&[a]);
    let mut c = routed_client(&proxy).await;
    let mut buf = Vec::new();
    assert!(get(&mut c, &mut buf, "svc", "/x")
        .await
        .starts_with("HTTP/1.1 200"));
    let _ = seen.recv().await.unwrap();
    // A preflight from the allowed origin is answered here: the upstream sees nothing.
    let preflight = "OPTIONS /cors HTTP/1.1\r\nhost: svc\r\norigin: https://a.test\r\naccess-control-request-method: PUT\r\n\r\n";
    c.write_all(preflight.as_bytes()).await.unwrap();
    let r = response(&mut c, &mut buf).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(
        r.contains("access-control-allow-origin: https://a.test\r\n"),
        "{r}"
    );
    assert!(
        r.contains("access-control-allow-methods: GET,PUT\r\n"),
        "{r}"
    );
    // A simple request is forwarded and its response names the origin.
    let req = "GET /cors HTTP/1.1\r\nhost: svc\r\norigin: https://a.test\r\n\r\n";
    c.write_all(req.as_bytes()).await.unwrap();
    let r = response(&mut c, &mut buf).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(
        r.contains("access-control-allow-origin: https://a.test\r\n"),
        "{r}"
    );
    let forwarded = seen.recv().await.unwrap();
    assert!(
        forwarded.head.starts_with("GET /cors"),
        "{}",
        forwarded.head
    );
    // Only the first request was the fast path's.
    assert_eq!(proxy.metrics.http1_fast_path.get(), 1);
}

#[tokio::test]
async fn the_virtual_host_asks_for_the_attempt_count_and_the_route_tells_its_deadline() {
    let (a, mut seen) = upstream(vec![
        Answer::ReplyAndClose(UNAVAILABLE),
        Answer::Reply(OK_A),
    ])
    .await;
    let proxy = routed_proxy(&[a]);
    let mut c = routed_client(&proxy).await;
    let mut buf = Vec::new();
    let r = get(&mut c, &mut buf, "quiet", "/x").await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let (first, second) = (seen.recv().await.unwrap(), seen.recv().await.unwrap());
    for head in [&first.head, &second.head] {
        // `quiet` does not ask for the count, though its route retries.
        assert!(!head.contains("x-envoy-attempt-count"), "{head}");
    }
    // The whole deadline on the first attempt, what is left of it on the retry.
    assert!(
        first
            .head
            .contains("x-envoy-expected-rq-timeout-ms: 5000\r\n"),
        "{}",
        first.head
    );
    let left = second
        .head
        .lines()
        .find_map(|l| l.strip_prefix("x-envoy-expected-rq-timeout-ms: "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(left.is_some_and(|ms| ms <= 5000), "{}", second.head);
    assert_eq!(proxy.metrics.http1_fast_path.get(), 1, "on the fast path");
}

#[tokio::test]
async fn a_cluster_speaking_http2_upstream_hands_the_connection_to_hyper() {
    let (a, _seen) = upstream(vec![Answer::Reply(OK_A)]).await;
    let proxy = routed_proxy(&[a]);
    let mut c = routed_client(&proxy).await;
    let mut buf = Vec::new();
    assert!(get(&mut c, &mut buf, "svc", "/x")
        .await
        .starts_with("HTTP/1.1 200"));
    // The endpoint speaks only HTTP/1.1: hyper's HTTP/2 to it fails, where the fast path's
    // HTTP/1.1 would have had an answer.
    let r = get(&mut c, &mut buf, "svc", "/h2").await;
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert_eq!(proxy.metrics.http1_fast_path.get(), 1);
}
