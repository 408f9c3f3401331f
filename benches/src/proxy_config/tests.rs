use super::*;
use std::path::PathBuf;

fn addrs() -> (SocketAddr, SocketAddr) {
    (
        "127.0.0.1:41000".parse().unwrap(),
        "127.0.0.1:42000".parse().unwrap(),
    )
}

#[test]
fn remora_config_is_valid_and_moves_every_port() {
    let ports = RemoraPorts {
        readiness: 41001,
        metrics: 41002,
        agent: 41003,
        admin: 41004,
    };
    let text = remora_config(&ports);
    let config = remora_config::parse(&text, Path::new("bench.yaml"))
        .expect("Remora accepts the harness's config");
    assert_eq!(config.readiness.port.get(), 41001);
    assert_eq!(config.metrics.port.get(), 41002);
    assert_eq!(config.agent.port.get(), 41003);
    assert_eq!(config.admin.address, "127.0.0.1:41004".parse().unwrap());
    assert_eq!(
        config.bind_addresses,
        vec!["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert!(!config.access_log.enabled);

    let (listen, upstream) = addrs();
    let args = remora_args(
        Path::new("/tmp/r.yaml"),
        listen,
        upstream,
        Mode::Http1,
        "warn",
    )
    .join(" ");
    assert!(args.contains("--listen 127.0.0.1:41000 --upstream 127.0.0.1:42000 --protocol http"));
    assert!(args.contains("--concurrency 1"));
    assert_eq!(remora_protocol(Mode::Tcp), "tcp");
}

#[test]
fn envoy_bootstrap_is_yaml_with_the_right_filter_and_cluster() {
    let (listen, upstream) = addrs();
    for mode in [Mode::Http1, Mode::Grpc, Mode::H2c, Mode::Tcp] {
        let text = envoy_config(mode, listen, upstream, 41005);
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("valid YAML");
        assert_eq!(
            doc["admin"]["address"]["socket_address"]["port_value"],
            41005
        );
        let listener = &doc["static_resources"]["listeners"][0];
        assert_eq!(listener["address"]["socket_address"]["port_value"], 41000);
        let filter = &listener["filter_chains"][0]["filters"][0];
        let cluster = &doc["static_resources"]["clusters"][0];
        let endpoint = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"];
        assert_eq!(endpoint["address"]["socket_address"]["port_value"], 42000);
        match mode {
            Mode::Tcp => {
                assert_eq!(filter["name"], "envoy.filters.network.tcp_proxy");
                assert_eq!(filter["typed_config"]["cluster"], "upstream");
            }
            Mode::Http1 | Mode::Grpc | Mode::H2c => {
                assert_eq!(
                    filter["name"],
                    "envoy.filters.network.http_connection_manager"
                );
                let hcm = &filter["typed_config"];
                assert_eq!(hcm["codec_type"], "AUTO");
                assert!(hcm.get("access_log").is_none(), "access log stays off");
                let route = &hcm["route_config"]["virtual_hosts"][0]["routes"][0];
                assert_eq!(route["route"]["cluster"], "upstream");
                assert_eq!(hcm["http_filters"][0]["name"], "envoy.filters.http.router");
            }
        }
        assert_eq!(
            cluster["circuit_breakers"]["thresholds"][0]["max_connections"], 4294967295u64,
            "Istio's thresholds"
        );
        let http2 = cluster.get("typed_extension_protocol_options").is_some();
        assert_eq!(
            http2,
            matches!(mode, Mode::Grpc | Mode::H2c),
            "HTTP/2 to the upstream only for gRPC and h2c"
        );
    }
    assert!(envoy_args(Path::new("e.yaml"))
        .join(" ")
        .contains("--concurrency 1"));
}

#[test]
fn mesh_pair_configs_carry_the_identities() {
    let (listen, upstream) = addrs();
    let server: SocketAddr = "127.0.0.1:43000".parse().unwrap();
    let dir = Path::new("/tmp/certs");
    let tls_files = |tls: &serde_yaml_ng::Value| {
        let ctx = &tls["typed_config"]["common_tls_context"];
        assert_eq!(
            ctx["tls_certificates"][0]["certificate_chain"]["filename"],
            "/tmp/certs/cert-chain.pem"
        );
        assert_eq!(
            ctx["tls_certificates"][0]["private_key"]["filename"],
            "/tmp/certs/key.pem"
        );
        assert_eq!(
            ctx["validation_context"]["trusted_ca"]["filename"],
            "/tmp/certs/root-cert.pem"
        );
        ctx.clone()
    };

    let text = envoy_mesh_client_config(
        Mode::Http1,
        listen,
        server,
        41005,
        dir,
        "spiffe://cluster.local/ns/bench/sa/b",
    );
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("valid YAML");
    let listener = &doc["static_resources"]["listeners"][0];
    assert_eq!(listener["address"]["socket_address"]["port_value"], 41000);
    assert!(listener["filter_chains"][0]
        .get("transport_socket")
        .is_none());
    let cluster = &doc["static_resources"]["clusters"][0];
    let endpoint = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"];
    assert_eq!(endpoint["address"]["socket_address"]["port_value"], 43000);
    let tls = &cluster["transport_socket"];
    assert!(tls["typed_config"]["@type"]
        .as_str()
        .unwrap()
        .ends_with("UpstreamTlsContext"));
    assert_eq!(
        tls["typed_config"]["sni"],
        "outbound_.43000_._.b.bench.svc.cluster.local"
    );
    let ctx = tls_files(tls);
    assert_eq!(ctx["alpn_protocols"][0], "istio-http/1.1");
    let san = &ctx["validation_context"]["match_typed_subject_alt_names"][0];
    assert_eq!(san["san_type"], "URI");
    assert_eq!(
        san["matcher"]["exact"],
        "spiffe://cluster.local/ns/bench/sa/b"
    );

    let text = envoy_mesh_server_config(Mode::Http1, server, upstream, 41006, dir);
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("valid YAML");
    let listener = &doc["static_resources"]["listeners"][0];
    assert_eq!(listener["address"]["socket_address"]["port_value"], 43000);
    let chain = &listener["filter_chains"][0];
    let tls = &chain["transport_socket"];
    assert!(tls["typed_config"]["@type"]
        .as_str()
        .unwrap()
        .ends_with("DownstreamTlsContext"));
    assert_eq!(tls["typed_config"]["require_client_certificate"], true);
    tls_files(tls);
    let hcm = &chain["filters"][0]["typed_config"];
    assert_eq!(hcm["forward_client_cert_details"], "APPEND_FORWARD");
    let cluster = &doc["static_resources"]["clusters"][0];
    assert!(
        cluster.get("transport_socket").is_none(),
        "plain to the upstream"
    );
    let endpoint = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"];
    assert_eq!(endpoint["address"]["socket_address"]["port_value"], 42000);
    assert!(envoy_args_with(Path::new("e.yaml"), MESH_WORKERS)
        .join(" ")
        .contains("--concurrency 2"));

    let ports = RemoraPorts {
        readiness: 41001,
        metrics: 41002,
        agent: 41003,
        admin: 41004,
    };
    let a = remora_mesh_config(
        Mode::Http1,
        &ports,
        dir,
        MeshSide::Client {
            listen,
            server,
            server_id: "spiffe://cluster.local/ns/bench/sa/b",
        },
    );
    let a = remora_config::parse(&a, Path::new("a.yaml")).expect("Remora accepts sidecar A");
    assert_eq!(a.tls.cert_dir.as_deref(), Some(dir));
    let to_b = &a.listeners[0];
    assert_eq!((to_b.address, to_b.upstream), (listen, server));
    assert_eq!(to_b.protocol, remora_config::ListenerProtocol::Http);
    let tls = to_b.tls.as_ref().expect("A originates mutual TLS");
    assert_eq!(tls.mode, remora_config::ListenerTlsMode::Originate);
    assert_eq!(tls.identities, ["spiffe://cluster.local/ns/bench/sa/b"]);
    assert_eq!(
        tls.hostname.as_deref(),
        Some(crate::mesh_certs::SERVER_HOSTNAME)
    );
    let b = remora_mesh_config(
        Mode::Http1,
        &ports,
        dir,
        MeshSide::Server {
            listen: server,
            upstream,
        },
    );
    let b = remora_config::parse(&b, Path::new("b.yaml")).expect("Remora accepts sidecar B");
    assert_eq!(
        (b.listeners[0].address, b.listeners[0].upstream),
        (server, upstream)
    );
    assert!(b.listeners[0].terminates_tls());
    let args = remora_mesh_args(Path::new("b.yaml"), MESH_WORKERS, "warn").join(" ");
    assert!(
        args.contains("--concurrency 2") && !args.contains("--listen"),
        "{args}"
    );
}

#[test]
fn tcp_mesh_pairs_proxy_bytes_with_istios_tcp_alpn() {
    let (listen, upstream) = addrs();
    let server: SocketAddr = "127.0.0.1:43000".parse().unwrap();
    let dir = Path::new("/tmp/certs");
    let tcp_proxy = |doc: &serde_yaml_ng::Value, cluster: &str| {
        let filter = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0];
        assert_eq!(filter["name"], "envoy.filters.network.tcp_proxy");
        assert_eq!(filter["typed_config"]["cluster"], cluster);
    };
    let a = envoy_mesh_client_config(Mode::Tcp, listen, server, 41005, dir, "spiffe://x/b");
    let a: serde_yaml_ng::Value = serde_yaml_ng::from_str(&a).expect("valid YAML");
    tcp_proxy(&a, "mesh");
    let ctx = &a["static_resources"]["clusters"][0]["transport_socket"]["typed_config"]
        ["common_tls_context"];
    assert_eq!(ctx["alpn_protocols"][0], "istio-peer-exchange");
    assert_eq!(
        ctx["validation_context"]["match_typed_subject_alt_names"][0]["matcher"]["exact"],
        "spiffe://x/b"
    );
    let b = envoy_mesh_server_config(Mode::Tcp, server, upstream, 41006, dir);
    let b: serde_yaml_ng::Value = serde_yaml_ng::from_str(&b).expect("valid YAML");
    tcp_proxy(&b, "upstream");
    let tls = &b["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"];
    assert_eq!(tls["typed_config"]["require_client_certificate"], true);
    let ports = RemoraPorts {
        readiness: 41001,
        metrics: 41002,
        agent: 41003,
        admin: 41004,
    };
    let side = MeshSide::Server {
        listen: server,
        upstream,
    };
    let b = remora_mesh_config(Mode::Tcp, &ports, dir, side);
    let b = remora_config::parse(&b, Path::new("b.yaml")).expect("Remora accepts sidecar B");
    assert_eq!(
        b.listeners[0].protocol,
        remora_config::ListenerProtocol::Tcp
    );
    assert!(b.listeners[0].terminates_tls());
}

#[test]
fn haproxy_config_has_one_thread_and_the_mode() {
    let (listen, upstream) = addrs();
    let http = haproxy_config(Mode::Http1, listen, upstream, 12000);
    assert!(
        http.contains("nbthread 1") && http.contains("mode http") && http.contains("maxconn 12000")
    );
    assert!(
        http.contains("bind 127.0.0.1:41000\n")
            && http.contains("server upstream 127.0.0.1:42000\n")
    );
    assert!(!http.contains("\n    log "), "no logging");
    let grpc = haproxy_config(Mode::Grpc, listen, upstream, 100);
    assert!(
        grpc.contains("bind 127.0.0.1:41000 proto h2") && grpc.contains("127.0.0.1:42000 proto h2")
    );
    let h2c = haproxy_config(Mode::H2c, listen, upstream, 100);
    assert!(
        h2c.contains("mode http")
            && h2c.contains("bind 127.0.0.1:41000 proto h2")
            && h2c.contains("127.0.0.1:42000 proto h2")
    );
    assert!(haproxy_config(Mode::Tcp, listen, upstream, 100).contains("mode tcp"));
}

#[test]
fn nginx_config_has_one_worker_and_the_right_module() {
    let (listen, upstream) = addrs();
    let prefix = PathBuf::from("/tmp/nginx-bench");
    let limits = NginxLimits {
        rlimit_nofile: 20000,
        worker_connections: 19900,
    };
    let module = PathBuf::from("/usr/lib/nginx/modules/ngx_stream_module.so");
    let http = nginx_config(
        Mode::Http1,
        listen,
        upstream,
        &prefix,
        limits,
        Some(&module),
    );
    assert!(http.contains("worker_processes 1;") && http.contains("access_log off;"));
    assert!(http.contains("keepalive 64;") && http.contains("proxy_http_version 1.1;"));
    assert!(http.contains("listen 127.0.0.1:41000;") && http.contains("server 127.0.0.1:42000;"));
    assert!(
        !http.contains("load_module"),
        "the stream module only for TCP"
    );
    assert_eq!(http.matches('{').count(), http.matches('}').count());
    let grpc = nginx_config(Mode::Grpc, listen, upstream, &prefix, limits, Some(&module));
    assert!(
        grpc.contains("listen 127.0.0.1:41000 http2;")
            && grpc.contains("grpc_pass grpc://upstream;")
    );
    let h2c = nginx_config(Mode::H2c, listen, upstream, &prefix, limits, Some(&module));
    assert!(
        h2c.contains("listen 127.0.0.1:41000 http2;")
            && h2c.contains("proxy_pass http://upstream;")
            && h2c.contains("proxy_http_version 1.1;")
            && !h2c.contains("grpc_pass"),
        "{h2c}"
    );
    assert_eq!(h2c.matches('{').count(), h2c.matches('}').count());
    let tcp = nginx_config(Mode::Tcp, listen, upstream, &prefix, limits, Some(&module));
    assert!(
        tcp.starts_with("# Written")
            && tcp.contains("load_module /usr/lib/nginx/modules/ngx_stream_module.so;")
    );
    assert!(tcp.contains("stream {") && tcp.contains("proxy_pass 127.0.0.1:42000;"));
    assert!(
        tcp.contains("worker_rlimit_nofile 20000;") && tcp.contains("worker_connections 19900;")
    );
    assert_eq!(tcp.matches('{').count(), tcp.matches('}').count());
}

#[test]
fn proxy_names_round_trip() {
    for proxy in Proxy::ALL {
        assert_eq!(Proxy::from_name(proxy.name()), Some(proxy));
    }
    assert_eq!(Proxy::from_name("linkerd"), None);
}
