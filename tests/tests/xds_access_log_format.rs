//! Istio's default access-log format (istiod's `EnvoyTextLogFormat`, as an inline string on the
//! file logger of the HTTP connection manager and of `tcp_proxy`), written by Remora as it was
//! given, against Envoy 1.40 with the same resources and the same traffic: a 200 from the
//! upstream, a 503 `UF` (the endpoint refuses), a 503 `UH` (no endpoint), a fault abort `FI`,
//! a TCP connection out, and one in (the peer to the pod's own port, through
//! `virtualInbound`); then a 200 and a 503 `UF` over HTTP/2 (hyper's path, where the upstream
//! connection's local address comes from the pooled connection), and a TCP connection out
//! whose ClientHello names a server, on a listener with a TLS inspector
//! (`%REQUESTED_SERVER_NAME%`). Each line is compared field by field; only what must differ
//! between two runs is masked (start time, durations, request ids, ephemeral ports and each
//! pod's own addresses, which are named by role).
//!
//! A format naming another header (`%REQ(X-B3-TRACEID)%`) and a length (`:N`) is written the
//! same way too, and a format with an operator Remora does not render is refused by name.

use remora_e2e::access_logs::{file_log, log_file, wait_for_lines};
use remora_e2e::envoy_xds::{nets_or_skip, Resources, ISTIO_TEXT_FORMAT};
use remora_e2e::peer::{self, curl_status, Server};
use remora_e2e::xds_resources::{eds_cluster, endpoint, inbound_cluster};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

const CURL_TIME: Duration = Duration::from_secs(20);
const HTTP_VIP: &str = "10.96.0.10";
const TCP_VIP: &str = "10.96.0.20:9000";
/// A TCP service whose listener inspects the ClientHello and matches its server name.
const TLS_VIP: &str = "10.96.0.30:9443";
const SNI: &str = "echo.tls.example";
const HOST: &str = "web.test.svc.cluster.local";
const WEB: &str = "outbound|80||web.test.svc.cluster.local";
const DOWN: &str = "outbound|80||down.test.svc.cluster.local";
const EMPTY: &str = "outbound|80||empty.test.svc.cluster.local";
const ECHO: &str = "outbound|9000||echo.test.svc.cluster.local";
/// The pod's own TCP port, reached inbound through `virtualInbound`.
const INBOUND_PORT: u16 = 9100;
const INBOUND: &str = "inbound|9100||";
/// The pod's port whose chain's network RBAC filter denies every connection.
const DENIED_PORT: u16 = 9101;
const DENIED: &str = "inbound|9101||";

/// A second format: another header, lengths, addresses without ports.
const OTHER_FORMAT: &str = "%REQ(X-B3-TRACEID)% %REQ(:PATH):4% %REQ(X-MISSING?USER-AGENT):6% %UPSTREAM_CLUSTER% %DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT% %RESPONSE_CODE% %PROTOCOL%\n";

fn resources(
    log: &Path,
    format: &str,
    web: SocketAddr,
    down: SocketAddr,
    echo: SocketAddr,
) -> Resources {
    let abort = json!({"envoy.filters.http.fault": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
        "abort": {"http_status": 503, "percentage": {"numerator": 100, "denominator": "HUNDRED"}}}});
    let routes = json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [{
        "name": "web.test.svc.cluster.local:80", "domains": [HOST, HTTP_VIP],
        "routes": [
            {"name": "ok", "match": {"prefix": "/ok"}, "route": {"cluster": WEB, "timeout": "0s"}},
            {"name": "down", "match": {"prefix": "/down"}, "route": {"cluster": DOWN, "timeout": "0s"}},
            {"name": "empty", "match": {"prefix": "/empty"}, "route": {"cluster": EMPTY, "timeout": "0s"}},
            {"name": "abort", "match": {"prefix": "/abort"}, "route": {"cluster": WEB, "timeout": "0s"},
             "typed_per_filter_config": abort}]}]}]);
    let listeners = json!([
        {"name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "outbound_0.0.0.0_80", "access_log": file_log(log, format),
            "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
            "http_filters": [
                {"name": "envoy.filters.http.fault", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"}},
                {"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]},
        {"name": "10.96.0.20_9000", "address": {"socket_address": {"address": "10.96.0.20", "port_value": 9000}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": ECHO, "cluster": ECHO, "access_log": file_log(log, format)}}]}]},
        {"name": "10.96.0.30_9443", "address": {"socket_address": {"address": "10.96.0.30", "port_value": 9443}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "listener_filters": [{"name": "envoy.filters.listener.tls_inspector", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"}}],
         "filter_chains": [{"filter_chain_match": {"server_names": [SNI]},
            "filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": ECHO, "cluster": ECHO, "access_log": file_log(log, format)}}]}]},
        {"name": "virtualOutbound",
         "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
         "use_original_dst": true, "traffic_direction": "OUTBOUND",
         "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [
            {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]}]},
        {"name": "virtualInbound", "traffic_direction": "INBOUND",
         "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
         "listener_filters": [{"name": "envoy.filters.listener.original_dst", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}}],
         "filter_chains": [{"name": "0.0.0.0_9100",
            "filter_chain_match": {"destination_port": INBOUND_PORT, "transport_protocol": "raw_buffer"},
            "filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": INBOUND, "cluster": INBOUND, "access_log": file_log(log, format)}}]},
            {"name": "0.0.0.0_9101",
            "filter_chain_match": {"destination_port": DENIED_PORT, "transport_protocol": "raw_buffer"},
            "filters": [
                {"name": "envoy.filters.network.rbac", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC",
                    "stat_prefix": "tcp.", "rules": {"action": "DENY", "policies": {
                        "ns[test]-policy[deny-all]-rule[0]": {
                            "permissions": [{"any": true}], "principals": [{"any": true}]}}}}},
                {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": DENIED, "cluster": DENIED, "access_log": file_log(log, format)}}]}]}
    ]);
    let assignment = |name: &str, a: Option<SocketAddr>| {
        let hosts: Vec<Value> = a.into_iter().map(|a| endpoint(a, None)).collect();
        json!({"cluster_name": name, "endpoints": [{"lb_endpoints": hosts}]})
    };
    Resources {
        listeners,
        routes,
        clusters: json!([eds_cluster(WEB), eds_cluster(DOWN), eds_cluster(EMPTY), eds_cluster(ECHO),
            inbound_cluster(INBOUND), inbound_cluster(DENIED),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        endpoints: json!([
            assignment(WEB, Some(web)),
            assignment(DOWN, Some(down)),
            assignment(EMPTY, None),
            assignment(ECHO, Some(echo))
        ]),
    }
}

/// A TLS ClientHello naming `server` (TLS 1.2 framing, one cipher suite, the `server_name`
/// extension alone): what a client's first bytes to a TLS service look like to an inspector.
fn client_hello(server: &str) -> Vec<u8> {
    let len16 = |n: usize| u16::try_from(n).expect("short").to_be_bytes();
    let name = server.as_bytes();
    let mut list = vec![0]; // host_name
    list.extend(len16(name.len()));
    list.extend(name);
    let mut extension = vec![0, 0]; // server_name
    extension.extend(len16(list.len() + 2));
    extension.extend(len16(list.len()));
    extension.extend(list);
    let mut body = vec![3, 3];
    body.extend([7u8; 32]); // random
    body.push(0); // no session id
    body.extend([0, 2, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
    body.extend([1, 0]); // null compression
    body.extend(len16(extension.len()));
    body.extend(extension);
    let mut handshake = vec![1]; // client_hello
    handshake.extend(&u32::try_from(body.len()).expect("short").to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 3, 1];
    record.extend(len16(handshake.len()));
    record.extend(handshake);
    record
}

/// Send `hello` to an echo server at `addr` and read it back, then close, as a TLS client
/// waits for the server's answer before anything else (an inspector that sees the client's end
/// of stream while it reads is another case: Envoy drops the connection then).
fn hello_exchange(
    ns: &remora_e2e::Netns,
    addr: SocketAddr,
    hello: &[u8],
) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Write};
    let mut stream = peer::connect(ns, addr)?;
    stream.write_all(hello)?;
    let mut back = vec![0; hello.len()];
    stream.read_exact(&mut back)?;
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest)?;
    back.extend(rest);
    Ok(back)
}

/// The traffic: four requests (each waited for in the log, so lines come in this order), a
/// TCP exchange out and one in, two requests over HTTP/2, and a TCP exchange whose first bytes
/// are a ClientHello naming [`SNI`]. The statuses are returned.
fn traffic(net: &PodNet, log: &Path, output: &dyn Fn() -> String) -> (Vec<u16>, Vec<String>) {
    let mut statuses = Vec::new();
    let request = |path: &str, http2: bool, lines: usize| {
        let url = format!("http://{HTTP_VIP}{path}");
        let mut args = vec!["-A", "remora-e2e", "-H", "x-b3-traceid: 80f198ee56343ba8"];
        if http2 {
            args.push("--http2-prior-knowledge");
        }
        args.push(&url);
        let (status, _) = curl_status(&net.pod, &args, CURL_TIME);
        wait_for_lines(log, lines, output);
        status
    };
    for (i, path) in ["/ok", "/down", "/empty", "/abort"].into_iter().enumerate() {
        statuses.push(request(path, false, i + 1));
    }
    let vip: SocketAddr = TCP_VIP.parse().expect("addr");
    let back = peer::echo_exchange(&net.pod, vip, b"hello").expect("TCP through the VIP");
    assert_eq!(back, b"hello");
    wait_for_lines(log, 5, output);
    // Inbound: the peer to the pod's own port, through `virtualInbound`.
    let back = peer::echo_exchange(&net.peer, net.pod_addr(INBOUND_PORT), b"inbound!")
        .expect("TCP to the pod");
    assert_eq!(back, b"inbound!");
    wait_for_lines(log, 6, output);
    // HTTP/2: hyper's path.
    statuses.push(request("/ok", true, 7));
    statuses.push(request("/down", true, 8));
    // A ClientHello naming the server, echoed back as it is.
    let hello = client_hello(SNI);
    let vip: SocketAddr = TLS_VIP.parse().expect("addr");
    let back = hello_exchange(&net.pod, vip, &hello)
        .unwrap_or_else(|e| panic!("TCP with SNI: {e}\n{}", output()));
    assert_eq!(back, hello);
    wait_for_lines(log, 9, output);
    // Heads the codec refuses, each on a connection of its own.
    let http: SocketAddr = format!("{HTTP_VIP}:80").parse().expect("addr");
    let many: String = (0..120).map(|i| format!("x{i}: a\r\n")).collect();
    let refused = [
        // No colon.
        "GET /ok HTTP/1.1\r\nHost: web\r\nfoo bar\r\n\r\n".to_string(),
        "GET /ok HTTP/1.1\r\nHost: web\r\nx: a\x01b\r\n\r\n".to_string(),
        format!(
            "GET /ok HTTP/1.1\r\nHost: web\r\nx: {}\r\n\r\n",
            "a".repeat(100 * 1024)
        ),
        format!("GET /ok HTTP/1.1\r\nHost: web\r\n{many}\r\n"),
        "GE(T /ok HTTP/1.1\r\nHost: web\r\n\r\n".to_string(),
    ];
    for (i, head) in refused.iter().enumerate() {
        let answer = raw_exchange(&net.pod, http, head.as_bytes());
        statuses.push(answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0));
        wait_for_lines(log, 10 + i, output);
    }
    wait_for_lines(log, DENIED_LINE, output);
    // Refused by the chain's RBAC filter once the client's first bytes are read: whether
    // they come back or the connection is reset first is the filter's race.
    let _ = peer::echo_exchange(&net.peer, net.pod_addr(DENIED_PORT), b"denied!");
    (statuses, wait_for_lines(log, DENIED_LINE + 1, output))
}

/// The line of the connection the RBAC filter refused, after the refused heads.
const DENIED_LINE: usize = REFUSED_HEADS_FROM + 5;

/// The line of the first refused head.
const REFUSED_HEADS_FROM: usize = 9;

/// Send `bytes` to `addr` and read the answer until the proxy closes.
fn raw_exchange(ns: &remora_e2e::Netns, addr: SocketAddr, bytes: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut stream = peer::connect(ns, addr).expect("connect");
    stream.write_all(bytes).expect("write");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// A line's fields: space-separated, a quoted one (`"GET /ok HTTP/1.1"`) kept whole.
fn fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while !rest.is_empty() {
        rest = rest.trim_start_matches(' ');
        if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted.find("\" ").unwrap_or(quoted.len().saturating_sub(1));
            out.push(format!("\"{}\"", &quoted[..end]));
            rest = quoted.get(end + 1..).unwrap_or_default();
        } else {
            let end = rest.find(' ').unwrap_or(rest.len());
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// One run's lines, and its pod's and peer's addresses.
struct Run {
    lines: Vec<String>,
    pod: String,
    peer: String,
}

/// The same resources (logging in `format`) and traffic through Remora, then Envoy; `None`
/// when this machine cannot run them.
fn remora_then_envoy(format: &str) -> Option<[Run; 2]> {
    let (binary, nets) = nets_or_skip()?;
    let mut runs = Vec::new();
    for (i, net) in [&nets.0, &nets.1].into_iter().enumerate() {
        net.capture_default();
        net.pod.route_vips();
        let web = Server::http(&net.peer, net.peer_addr(8081), "web");
        let echo = Server::echo(&net.peer, net.peer_addr(9000));
        let _inbound = Server::echo(&net.pod, peer::any_addr(INBOUND_PORT));
        let _denied = Server::echo(&net.pod, peer::any_addr(DENIED_PORT));
        // Nothing listens there: the connection is refused.
        let down = net.peer_addr(8099);
        let log = log_file(net, "access.log");
        let resources = resources(&log, format, web.addr(), down, echo.addr());
        let (statuses, lines) = if i == 0 {
            let remora = resources.start_remora(net);
            traffic(net, &log, &|| remora.stderr())
        } else {
            let envoy = resources.start_envoy(net, &binary);
            traffic(net, &log, &|| envoy.logs())
        };
        assert_eq!(
            statuses,
            [200, 503, 503, 503, 200, 503, 400, 400, 431, 431, 400],
            "proxy {i}:\n{lines:#?}"
        );
        runs.push(Run {
            lines,
            pod: net.pod_ip.to_string(),
            peer: net.peer_ip.to_string(),
        });
    }
    let envoy = runs.pop()?;
    let remora = runs.pop()?;
    Some([remora, envoy])
}

/// What of a field must be the same in both runs: its value with each pod's own addresses
/// named by role, and what necessarily differs (times, ids, ephemeral ports) by its shape.
fn comparable(index: usize, field: &str, run: &Run) -> String {
    let named = field.replace(&run.peer, "PEER").replace(&run.pod, "POD");
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match index {
        // [START_TIME]
        0 => {
            let ok = named.starts_with("[20") && named.ends_with("Z]") && named.len() == 26;
            format!("time:{ok}")
        }
        // DURATION, and the upstream service time (a number, or `-` when none)
        9 | 10 if digits(&named) => "ms".into(),
        // "X-REQUEST-ID": each proxy makes its own
        13 => format!("uuid:{}", named.len() == 38),
        // UPSTREAM_LOCAL_ADDRESS, DOWNSTREAM_REMOTE_ADDRESS: ephemeral ports
        17 | 19 => named
            .rsplit_once(':')
            .map_or(named.clone(), |(ip, _)| format!("{ip}:PORT")),
        _ => named,
    }
}

#[test]
fn istios_default_format_is_written_field_by_field_as_envoy_writes_it() {
    let Some([remora, envoy]) = remora_then_envoy(ISTIO_TEXT_FORMAT) else {
        return;
    };
    let compared = |run: &Run| -> Vec<Vec<String>> {
        run.lines
            .iter()
            .map(|l| {
                let f = fields(l);
                assert_eq!(f.len(), 22, "22 fields in {l:?}");
                f.iter()
                    .enumerate()
                    .map(|(n, v)| comparable(n, v, run))
                    .collect()
            })
            .collect()
    };
    let (r, e) = (compared(&remora), compared(&envoy));
    let mut differences = Vec::new();
    for (n, (r, e)) in r.iter().zip(&e).enumerate() {
        for (field, (a, b)) in r.iter().zip(e).enumerate() {
            // A head too large to arrive in one read goes to hyper, which answers it without
            // Envoy's body (its status's text): only BYTES_SENT differs (`docs/xds.md`).
            let reply_body = n == REFUSED_HEADS_FROM + 2 && field == 8;
            // Envoy's TCP proxy dials the upstream before its RBAC filter reads the client's
            // bytes and refuses them; Remora refuses before it dials (`docs/xds.md`), so it
            // has no upstream host or local address to print.
            let never_dialled = n == DENIED_LINE && matches!(field, 15 | 17);
            if a != b && !reply_body && !never_dialled {
                differences.push(format!(
                    "line {n}, field {field}: remora {a:?}, envoy {b:?}"
                ));
            }
        }
    }
    assert!(
        differences.is_empty(),
        "{}\nremora:\n{}\nenvoy:\n{}",
        differences.join("\n"),
        remora.lines.join("\n"),
        envoy.lines.join("\n")
    );
    // The masked fields are there: the 200's upstream connection (on the fast path and on
    // hyper's), its service time.
    for n in [0, 6] {
        let ok = fields(&remora.lines[n]);
        assert!(ok[17].starts_with(&format!("{}:", remora.pod)), "{ok:?}");
        assert_ne!(ok[10], "-", "{ok:?}");
    }
    // What Envoy prints, so Remora too: the protocol, the failed connect's details on
    // hyper's path, the server name the TLS inspector read.
    let h2 = fields(&remora.lines[7]);
    assert_eq!(h2[1], "\"GET /down HTTP/2\"", "{h2:?}");
    assert_eq!(
        h2[4],
        "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
        "{h2:?}"
    );
    // The codec's words for each refused head.
    let details: Vec<String> = remora.lines[REFUSED_HEADS_FROM..DENIED_LINE]
        .iter()
        .map(|l| fields(l)[4].clone())
        .collect();
    assert_eq!(
        details,
        [
            "http1.codec_error",
            "http1.invalid_characters",
            "http1.headers_too_large",
            "http1.too_many_headers",
            "http1.codec_error"
        ],
        "{:?}",
        remora.lines
    );
    let denied = fields(&remora.lines[DENIED_LINE]);
    assert_eq!(
        denied[5], "rbac_access_denied_matched_policy[ns[test]-policy[deny-all]-rule[0]]",
        "{denied:?}"
    );
    assert_eq!((&*denied[7], &*denied[8]), ("7", "0"), "{denied:?}");
    let tls = fields(&remora.lines[8]);
    assert_eq!(tls[20], SNI, "{tls:?}");
    assert_eq!(tls[15], format!("\"{}:9000\"", remora.peer), "{tls:?}");
}

/// Another format, as the mesh's `accessLogFormat` gives it: another request header, lengths,
/// a fallback, addresses without ports. Only the pod's own address differs between runs.
#[test]
fn another_format_is_written_as_envoy_writes_it() {
    let Some([remora, envoy]) = remora_then_envoy(OTHER_FORMAT) else {
        return;
    };
    // Each pod's own address named by role: the inbound line's local address is it.
    let named = |run: &Run| -> Vec<String> {
        run.lines
            .iter()
            .map(|l| l.replace(&run.pod, "POD"))
            .collect()
    };
    assert_eq!(named(&remora), named(&envoy));
    assert_eq!(
        named(&remora)[5],
        "- - - inbound|9100|| POD 0 -",
        "{:?}",
        remora.lines
    );
    assert_eq!(
        remora.lines[0],
        format!("80f198ee56343ba8 /ok remora {WEB} 10.96.0.10 200 HTTP/1.1")
    );
}
