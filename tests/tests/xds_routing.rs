//! Routing by xDS resources from files (`xds.resources_dir`), end to end: service VIPs that
//! exist only in the resources, reached through the capture rules, balanced per request over
//! one keep-alive client connection (HTTP) and per connection (TCP), with Envoy's answers when
//! the route or cluster is missing.

mod routing;

use remora_e2e::certs::MeshCa;
use remora_e2e::mesh::{client_config, handshakes, server_config, two_pods, CLIENT_ID, SERVER_ID};
use remora_e2e::peer::{self, any_addr, curl, curl_ok, Server};
use remora_e2e::service::{peer_program, Service};
use remora_e2e::xds_resources::{eds_cluster, endpoint, inbound_cluster, mtls_cluster};
use remora_e2e::PodNet;
use routing::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

#[test]
fn a_vip_known_only_to_xds_is_balanced_per_request_over_one_connection() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    // The VIPs exist nowhere: a route lets the application's connect reach the capture rules.
    net.pod.route_vips();
    let servers: Vec<Server> = (1..=3)
        .map(|i| Server::http(&net.peer, net.peer_addr(8080 + i), &format!("endpoint-{i}")))
        .collect();
    let echo = Server::echo(&net.peer, net.peer_addr(9000));
    let dir = net.binary().make_dir("xds");
    let web: Vec<SocketAddr> = servers.iter().map(Server::addr).collect();
    write_resources(&dir, &web, echo.addr());
    let remora = net
        .remora()
        .config(&format!(
            "access_log:\n  enabled: true\nxds:\n  resources_dir: {}\n",
            dir.display()
        ))
        .start_ready();

    // Thirty requests on one keep-alive connection: every endpoint answers, one connect.
    let url = format!("http://{HTTP_VIP}/");
    let mut args = vec!["-w", "\n%{num_connects}\n"];
    args.extend(std::iter::repeat_n(url.as_str(), 30));
    let out = curl(&net.pod, &args, CURL_TIME);
    let text = curl_ok(&out, "30 requests to the VIP");
    let lines: Vec<&str> = text.lines().collect();
    let answered: BTreeSet<&str> = lines.iter().step_by(2).copied().collect();
    let connects: u32 = lines
        .iter()
        .skip(1)
        .step_by(2)
        .map(|n| n.parse::<u32>().expect("num_connects"))
        .sum();
    assert_eq!(
        answered,
        BTreeSet::from(["endpoint-1", "endpoint-2", "endpoint-3"]),
        "{text}\n{}",
        remora.stderr()
    );
    assert_eq!(connects, 1, "the client's connection was kept: {text}");
    // Every one of them on the HTTP/1.1 fast path, routed and balanced request by request.
    remora.wait_for_metrics("the fast path's requests", Duration::from_secs(5), |m| {
        m.value("remora_http1_fast_path_requests_total", &[]) == 30.0
    });
    // Istio's metrics name the service from the cluster's metadata.
    remora.wait_for_metrics("the requests counted", Duration::from_secs(5), |m| {
        m.value(
            "istio_requests_total",
            &[
                ("reporter", "source"),
                ("destination_service", "web.test.svc.cluster.local"),
                ("destination_service_name", "web"),
                ("destination_service_namespace", "test"),
                ("response_code", "200"),
            ],
        ) == 30.0
    });

    // A route to a cluster that does not exist: 503 NC. No virtual host for the Host: 404 NR.
    let (status, _) = peer::curl_status(
        &net.pod,
        &[&format!("http://{HTTP_VIP}/missing")],
        CURL_TIME,
    );
    assert_eq!(status, 503);
    remora.wait_for_access_log("\"GET /missing HTTP/1.1\" 503 NC");
    let (status, _) = peer::curl_status(
        &net.pod,
        &["-H", "Host: elsewhere", &format!("http://{HTTP_VIP}/nr")],
        CURL_TIME,
    );
    assert_eq!(status, 404);
    remora.wait_for_access_log("\"GET /nr HTTP/1.1\" 404 NR");

    // The files change: the next requests follow them. A file that does not parse keeps
    // what is in force.
    write_resources(&dir, &web[2..], echo.addr());
    let only_third = || {
        let out = curl(&net.pod, &["-s", &url, &url, &url], CURL_TIME);
        curl_ok(&out, "after the change") == "endpoint-3endpoint-3endpoint-3"
    };
    wait_until("the new endpoints to apply", only_third);
    std::fs::write(dir.join("clusters.json"), "[{").expect("write a broken file");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(only_third(), "a broken file changed the resources in force");
    write_resources(&dir, &web, echo.addr());

    // TCP through tcp_proxy to the EDS cluster's endpoint.
    let tcp_vip: SocketAddr = TCP_VIP.parse().expect("addr");
    let data = peer::pattern(64 * 1024);
    let back = peer::echo_exchange(&net.pod, tcp_vip, &data).expect("TCP through the VIP");
    peer::assert_same_bytes("echo through the xDS TCP route", &data, &back);
    assert_eq!(echo.peers().len(), 1);

    // No listener for a destination (and no virtualOutbound): closed, flag NR.
    let nowhere: SocketAddr = "10.96.0.99:1234".parse().expect("addr");
    let closed = peer::echo_exchange(&net.pod, nowhere, b"hello");
    assert!(
        matches!(&closed, Ok(b) if b.is_empty()) || closed.is_err(),
        "{closed:?}"
    );
    remora.wait_for_access_log("dst=10.96.0.99:1234 sent=0 received=0");
    remora.wait_for_access_log("end=no_route flags=NR");
    drop(remora);
}

#[test]
fn auto_mtls_per_endpoint_to_a_peer_sidecar_with_the_sockets_sni_and_san() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    // The pod is the server (its own Remora, PERMISSIVE); the peer is the client pod, whose
    // Remora knows the server only through xDS resources.
    let ca = MeshCa::new("cluster.local");
    let (server_dir, client_dir) = two_pods(&net, &ca);
    let _server = net
        .remora()
        .config(&server_config(&server_dir, "permissive"))
        .start_ready();
    let script = peer_program("http_server.py")
        .to_string_lossy()
        .into_owned();
    let _http = Service::start(&net.pod, "python3", &[&script, "8080"], any_addr(8080));
    let echo = Server::echo(&net.pod, any_addr(7000));
    net.peer.route_vips();

    let (h2_connections, _origin) = h2c_origin(&net.pod, any_addr(8090));
    let web = "outbound|80||httpbin.server.svc.cluster.local";
    let wrong = "outbound|80|wrong|httpbin.server.svc.cluster.local";
    let grpc = "outbound|8090||grpc.server.svc.cluster.local";
    let tcp = "outbound|9000||echo.server.svc.cluster.local";
    let sni = "outbound_.80_._.httpbin.server.svc.cluster.local";
    let dir = net.binary().make_dir("xds");
    let routes = json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [{
        "name": "httpbin", "domains": [HTTP_VIP],
        "routes": [
            {"match": {"prefix": "/wrong"}, "route": {"cluster": wrong}},
            {"match": {"prefix": "/grpc"}, "route": {"cluster": grpc}},
            {"match": {"prefix": "/"}, "route": {"cluster": web}}]}]}]);
    let server = |port| endpoint(net.pod_addr(port), Some("istio"));
    // A port declared `grpc`: istiod's explicit HTTP/2, inside Istio mTLS (ALPN istio-h2).
    let mut grpc_cluster = mtls_cluster(
        grpc,
        "outbound_.8090_._.grpc.server.svc.cluster.local",
        SERVER_ID,
    );
    grpc_cluster["typed_extension_protocol_options"] = json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}});
    write_all(
        &dir,
        listeners(tcp),
        routes,
        json!([
            mtls_cluster(web, sni, SERVER_ID),
            mtls_cluster(wrong, sni, "spiffe://cluster.local/ns/other/sa/impostor"),
            mtls_cluster(
                tcp,
                "outbound_.9000_._.echo.server.svc.cluster.local",
                SERVER_ID
            ),
            grpc_cluster
        ]),
        json!([
            {"cluster_name": web, "endpoints": [{"lb_endpoints": [server(8080)]}]},
            {"cluster_name": grpc, "endpoints": [{"lb_endpoints": [server(8090)]}]},
            {"cluster_name": wrong, "endpoints": [{"lb_endpoints": [server(8080)]}]},
            {"cluster_name": tcp, "endpoints": [{"lb_endpoints": [server(7000)]}]}
        ]),
    );
    let client = net
        .peer_remora()
        .config(&format!(
            "access_log:\n  enabled: true\ntls:\n  cert_dir: {}\nxds:\n  resources_dir: {}\n",
            client_dir.display(),
            dir.display()
        ))
        .start_ready();

    // HTTP: inside Istio mTLS, our SPIFFE ID presented and the server's checked.
    let out = curl(
        &net.peer,
        &["-s", &format!("http://{HTTP_VIP}/headers")],
        CURL_TIME,
    );
    let body = curl_ok(&out, "HTTP to the VIP across the mesh");
    let headers: Value = serde_json::from_str(&body).expect("JSON headers");
    let xfcc = headers["x-forwarded-client-cert"]
        .as_str()
        .unwrap_or_else(|| panic!("not mesh TLS (no x-forwarded-client-cert): {body}"));
    assert!(xfcc.starts_with(&format!("By={SERVER_ID};Hash=")), "{xfcc}");
    assert!(xfcc.ends_with(&format!("URI={CLIENT_ID}")), "{xfcc}");
    assert!(handshakes(&client, "outbound", "ok") >= 1.0);

    // A socket whose SAN the server's certificate does not carry: the handshake fails, 503 UF.
    let (status, _) =
        peer::curl_status(&net.peer, &[&format!("http://{HTTP_VIP}/wrong")], CURL_TIME);
    assert_eq!(status, 503, "{}", client.stderr());
    client.wait_for_access_log("\"GET /wrong HTTP/1.1\" 503 UF");

    // HTTP/1.1 from the application, HTTP/2 inside mesh TLS: the server's sidecar hands the
    // h2c-only application HTTP/2; both requests share one mesh connection.
    let before = handshakes(&client, "outbound", "ok");
    let grpc_url = format!("http://{HTTP_VIP}/grpc");
    let out = curl(&net.peer, &["-s", &grpc_url, &grpc_url], CURL_TIME);
    assert_eq!(
        curl_ok(&out, "HTTP/2 across the mesh"),
        format!("h2 {HTTP_VIP} /grpc").repeat(2),
        "{}",
        client.stderr()
    );
    assert!(h2_connections.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert_eq!(
        handshakes(&client, "outbound", "ok") - before,
        1.0,
        "one shared HTTP/2 mesh connection"
    );

    // TCP: the same, with Istio's metadata exchange first.
    let tcp_vip: SocketAddr = TCP_VIP.parse().expect("addr");
    let data = peer::pattern(32 * 1024);
    let back = peer::echo_exchange(&net.peer, tcp_vip, &data).expect("TCP through the VIP");
    peer::assert_same_bytes("echo across the mesh", &data, &back);
    assert_eq!(echo.peers().len(), 1);
}

#[test]
fn inbound_mtls_mode_per_port_follows_virtual_inbound() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    // Only the pod has a sidecar: the peer's curl is a client without one.
    let ca = MeshCa::new("cluster.local");
    let server_dir = net.binary().make_dir("server-certs");
    ca.install(&server_dir, &ca.workload(SERVER_ID));
    net.capture_default();
    let dir = net.binary().make_dir("xds");
    let clusters = json!([inbound_cluster("InboundPassthroughClusterIpv4")]);
    write_all(&dir, strict_inbound(8080), json!([]), clusters, json!([]));
    // The config file says PERMISSIVE; the resources say STRICT for 8080.
    let server = net
        .remora()
        .config(&format!(
            "{}xds:\n  resources_dir: {}\n",
            server_config(&server_dir, "permissive"),
            dir.display()
        ))
        .start_ready();
    let strict = Server::http(&net.pod, any_addr(8080), "strict");
    let permissive = Server::http(&net.pod, any_addr(8081), "permissive");

    // Plaintext from a client without a sidecar: refused on 8080, served on 8081.
    let (status, _) = peer::curl_status(
        &net.peer,
        &[&format!("http://{}/", net.pod_addr(8081))],
        CURL_TIME,
    );
    assert_eq!(status, 200);
    let out = curl(
        &net.peer,
        &["-s", &format!("http://{}/", net.pod_addr(8080))],
        CURL_TIME,
    );
    assert!(
        !out.status.success(),
        "plaintext reached a STRICT port: {out:?}"
    );
    assert!(strict.peers().is_empty());
    assert_eq!(permissive.peers().len(), 1);

    // A client with a sidecar speaking Istio mTLS is served on the STRICT port.
    let client_dir = net.binary().make_dir("client-certs");
    ca.install(&client_dir, &ca.workload(CLIENT_ID));
    net.capture_peer_default();
    let _client = net
        .peer_remora()
        .config(&client_config(&client_dir, net.pod_ip, SERVER_ID))
        .start_ready();
    let out = curl(
        &net.peer,
        &["-s", &format!("http://{}/", net.pod_addr(8080))],
        CURL_TIME,
    );
    assert_eq!(
        curl_ok(&out, "mTLS to the STRICT port"),
        "strict",
        "{}",
        server.stderr()
    );
}

#[test]
fn the_clusters_protocol_options_choose_the_upstream_http_version() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    net.pod.route_vips();
    let (h2_connections, _origin) = h2c_origin(&net.peer, net.peer_addr(8090));
    let h1 = Server::http(&net.peer, net.peer_addr(8091), "h1");
    let explicit = "outbound|80||grpc.test.svc.cluster.local";
    let auto_h2 = "outbound|80|h2|auto.test.svc.cluster.local";
    let auto_h1 = "outbound|80|h1|auto.test.svc.cluster.local";
    let plain = "outbound|80||plain.test.svc.cluster.local";
    let limited = "outbound|80||limited.test.svc.cluster.local";
    // A keep-alive HTTP/1.1 server: what closes its connections is the proxy.
    let limited_h1 = Server::start(&net.peer, net.peer_addr(8092), |mut stream| {
        use std::io::Write;
        while peer::read_request_head(&mut stream).is_ok() {
            stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nlimited")?;
        }
        Ok(())
    });
    let routes = json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [{
        "name": "vip", "domains": [HTTP_VIP],
        "routes": [
            {"match": {"prefix": "/explicit"}, "route": {"cluster": explicit}},
            {"match": {"prefix": "/auto-h2"}, "route": {"cluster": auto_h2}},
            {"match": {"prefix": "/auto-h1"}, "route": {"cluster": auto_h1}},
            {"match": {"prefix": "/plain"}, "route": {"cluster": plain}},
            {"match": {"prefix": "/limited"}, "route": {"cluster": limited}}]}]}]);
    let downstream = json!({"use_downstream_protocol_config": {
        "http_protocol_options": {}, "http2_protocol_options": {}}});
    let clusters = json!([
        cluster_speaking(
            explicit,
            json!({"explicit_http_config": {"http2_protocol_options": {}}})
        ),
        cluster_speaking(auto_h2, downstream.clone()),
        cluster_speaking(auto_h1, downstream),
        eds_cluster(plain),
        // DestinationRule `maxRequestsPerConnection: 2`.
        cluster_speaking(
            limited,
            json!({"common_http_protocol_options": {
            "idle_timeout": "3600s", "max_requests_per_connection": 2},
            "explicit_http_config": {"http_protocol_options": {}}})
        ),
    ]);
    let origin = net.peer_addr(8090);
    let endpoints = json!([
        assignment(explicit, &[origin]),
        assignment(auto_h2, &[origin]),
        assignment(auto_h1, &[h1.addr()]),
        assignment(plain, &[h1.addr()]),
        assignment(limited, &[limited_h1.addr()]),
    ]);
    let dir = net.binary().make_dir("xds");
    write_all(&dir, listeners(TCP_CLUSTER), routes, clusters, endpoints);
    let remora = net
        .remora()
        .config(&format!(
            "access_log:\n  enabled: true\nxds:\n  resources_dir: {}\n",
            dir.display()
        ))
        .start_ready();
    let url = |path: &str| format!("http://{HTTP_VIP}{path}");

    // HTTP/1.1 from the application, HTTP/2 to the explicit cluster: the Host became the
    // :authority; three requests share one upstream connection.
    let explicit_url = url("/explicit");
    let out = curl(
        &net.pod,
        &["-s", &explicit_url, &explicit_url, &explicit_url],
        CURL_TIME,
    );
    let expected = format!("h2 {HTTP_VIP} /explicit");
    assert_eq!(
        curl_ok(&out, "HTTP/1.1 to an HTTP/2 cluster"),
        expected.repeat(3),
        "{}",
        remora.stderr()
    );
    assert_eq!(
        h2_connections.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one shared HTTP/2 connection"
    );

    // The downstream's protocol: HTTP/2 stays HTTP/2, HTTP/1.1 stays HTTP/1.1 (the h2c-only
    // origin would refuse it; the HTTP/1.1 server answers).
    let out = curl(
        &net.pod,
        &["-s", "--http2-prior-knowledge", &url("/auto-h2")],
        CURL_TIME,
    );
    assert_eq!(
        curl_ok(&out, "HTTP/2 to a use_downstream cluster"),
        format!("h2 {HTTP_VIP} /auto-h2")
    );
    let out = curl(&net.pod, &["-s", &url("/auto-h1")], CURL_TIME);
    assert_eq!(curl_ok(&out, "HTTP/1.1 to a use_downstream cluster"), "h1");
    // An HTTP/1.1 request to the h2c origin through use_downstream would fail: proof that
    // the version follows the request, not the endpoint.
    let (status, _) = peer::curl_status(&net.pod, &[&url("/auto-h2")], CURL_TIME);
    // 503 when the origin closes first, 502 when its GOAWAY is read as a response.
    assert!(
        status == 502 || status == 503,
        "HTTP/1.1 to an h2c-only origin: {status}"
    );

    // No options: HTTP/1.1 upstream even for an HTTP/2 client, with :authority as its Host.
    let out = curl(
        &net.pod,
        &["-s", "--http2-prior-knowledge", &url("/plain")],
        CURL_TIME,
    );
    assert_eq!(curl_ok(&out, "HTTP/2 to a plain cluster"), "h1");
    remora.wait_for_access_log("\"GET /plain HTTP/2\" 200");

    // Four requests on one client connection, two per upstream connection.
    let limited_url = url("/limited");
    let out = curl(
        &net.pod,
        &["-s", &limited_url, &limited_url, &limited_url, &limited_url],
        CURL_TIME,
    );
    assert_eq!(curl_ok(&out, "a limited cluster"), "limited".repeat(4));
    assert_eq!(limited_h1.peers().len(), 2, "max_requests_per_connection 2");
}

/// A ServiceEntry with `resolution: DNS`: istiod's STRICT_DNS cluster, whose name the sidecar
/// resolves itself (`localhost` here, from the pod's /etc/hosts) and balances over.
#[test]
fn a_strict_dns_clusters_name_is_resolved_and_its_address_served() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    net.pod.route_vips();
    let local = Server::http(
        &net.pod,
        "127.0.0.1:8093".parse().expect("addr"),
        "resolved",
    );
    let dns = "outbound|80||external.example.com";
    let routes = json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [{
        "name": "vip", "domains": [HTTP_VIP],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": dns}}]}]}]);
    let clusters = json!([{
        "name": dns, "type": "STRICT_DNS", "connect_timeout": "2s", "lb_policy": "LEAST_REQUEST",
        "dns_lookup_family": "V4_ONLY", "dns_refresh_rate": "60s", "respect_dns_ttl": true,
        "dns_jitter": "0.100s",
        "load_assignment": {"cluster_name": dns, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "localhost", "port_value": 8093}}}}]}]}
    }]);
    let dir = net.binary().make_dir("xds");
    write_all(&dir, listeners(TCP_CLUSTER), routes, clusters, json!([]));
    let remora = net
        .remora()
        .config(&format!(
            "access_log:\n  enabled: true\nxds:\n  resources_dir: {}\n",
            dir.display()
        ))
        .start_ready();
    let url = format!("http://{HTTP_VIP}/");
    // The first resolution follows the cluster within a second or so.
    wait_until("the DNS cluster to resolve", || {
        peer::curl_status(&net.pod, &[&url], CURL_TIME).0 == 200
    });
    let out = curl(&net.pod, &["-s", &url], CURL_TIME);
    assert_eq!(
        curl_ok(&out, "the DNS cluster"),
        "resolved",
        "{}",
        remora.stderr()
    );
    assert!(!local.peers().is_empty());
}

/// istiod's default retry policy names the `previous_hosts` predicate: the retry of a request
/// whose endpoint refused the connection goes to another endpoint, so with one of two
/// endpoints down and one retry, every request is answered.
#[test]
fn a_retry_avoids_the_endpoint_already_tried() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    net.pod.route_vips();
    let live = Server::http(&net.peer, net.peer_addr(8094), "live");
    // Nothing listens there: connections are refused.
    let dead = net.peer_addr(8095);
    let routes = json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [{
        "name": "vip", "domains": [HTTP_VIP],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": CLUSTER, "retry_policy": {
            "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
            "num_retries": 1,
            "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
            "host_selection_retry_max_attempts": "5"}}}]}]}]);
    let dir = net.binary().make_dir("xds");
    write_all(
        &dir,
        listeners(TCP_CLUSTER),
        routes,
        json!([eds_cluster(CLUSTER)]),
        json!([assignment(CLUSTER, &[live.addr(), dead])]),
    );
    let remora = net
        .remora()
        .config(&format!("xds:\n  resources_dir: {}\n", dir.display()))
        .start_ready();
    let url = format!("http://{HTTP_VIP}/");
    for i in 0..20 {
        let (status, _) = peer::curl_status(&net.pod, &[&url], CURL_TIME);
        assert_eq!(status, 200, "request {i}: {}", remora.stderr());
    }
}
