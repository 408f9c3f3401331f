use super::*;
use std::path::Path;
use std::time::Duration;

fn parse_str(text: &str) -> Result<Config, ConfigError> {
    parse(text, Path::new("remora.yaml"))
}

#[test]
fn defaults_are_istios_sidecar() {
    let c = Config::default();
    assert_eq!(c.outbound.port.get(), 15001);
    assert_eq!(c.inbound.port.get(), 15006);
    assert_eq!(c.readiness.port.get(), 15021);
    assert_eq!(c.metrics.port.get(), 15090);
    assert_eq!(c.admin.address.to_string(), "127.0.0.1:15000");
    assert_eq!(c.outbound.connect_timeout, Duration::from_secs(10));
    assert_eq!(c.drain.duration, Duration::from_secs(5));
    assert_eq!(c.drain.drain_time, Duration::from_secs(45));
    assert_eq!(c.inbound.passthrough_source_v4.to_string(), "127.0.0.6");
    assert_eq!(c.inbound.passthrough_source_v6.to_string(), "::6");
    assert!(!c.access_log.enabled);
    assert_eq!(c.tcp.idle(), Some(Duration::from_secs(3600)));
}

#[test]
fn a_zero_tcp_idle_timeout_keeps_idle_connections() {
    let c = parse_str("tcp:\n  idle_timeout: 0s\n").unwrap();
    assert_eq!(c.tcp.idle(), None);
    let c = parse_str("tcp:\n  idle_timeout: 90s\n").unwrap();
    assert_eq!(c.tcp.idle(), Some(Duration::from_secs(90)));
}

#[test]
fn empty_or_comment_only_file_is_all_defaults() {
    assert_eq!(parse_str("").unwrap(), Config::default());
    assert_eq!(parse_str("# nothing\n---\n").unwrap(), Config::default());
}

#[test]
fn partial_file_overrides_only_what_it_names() {
    let c = parse_str("outbound:\n  connect_timeout: 250ms\ndrain:\n  duration: 1m\n").unwrap();
    assert_eq!(c.outbound.connect_timeout, Duration::from_millis(250));
    assert_eq!(c.outbound.port.get(), 15001);
    assert_eq!(c.drain.duration, Duration::from_secs(60));
    assert_eq!(c.drain.drain_time, Duration::from_secs(45));
    assert_eq!(c.inbound, InboundConfig::default());
    let c = parse_str("drain:\n  drain_time: 2s\n").unwrap();
    assert_eq!(c.drain.drain_time, Duration::from_secs(2));
}

#[test]
fn type_error_names_file_line_and_field() {
    let err = parse_str("outbound:\n  port: 15001\ninbound:\n  port: lots\n").unwrap_err();
    assert_eq!(err.line(), Some(4));
    assert_eq!(err.field(), Some("inbound.port"));
    let text = err.to_string();
    assert!(text.starts_with("remora.yaml:4:"), "{text}");
    assert!(text.contains("`inbound.port`"), "{text}");
}

#[test]
fn unknown_field_is_refused_with_its_line() {
    let err = parse_str("drain:\n  duraton: 5s\n").unwrap_err();
    assert_eq!(err.line(), Some(2));
    assert!(err.to_string().contains("duraton"), "{err}");
}

#[test]
fn zero_port_is_refused() {
    let err = parse_str("metrics:\n  port: 0\n").unwrap_err();
    assert_eq!(err.field(), Some("metrics.port"));
    assert_eq!(err.line(), Some(2));
}

#[test]
fn duplicate_ports_name_the_later_field_and_its_line() {
    let err = parse_str("outbound:\n  port: 15001\ninbound:\n  port: 15001\n").unwrap_err();
    assert_eq!(err.field(), Some("inbound.port"));
    assert_eq!(err.line(), Some(4));
    assert!(err.to_string().contains("outbound.port"), "{err}");
}

#[test]
fn zero_timeout_is_refused() {
    let err = parse_str("inbound:\n  connect_timeout: 0s\n").unwrap_err();
    assert_eq!(err.field(), Some("inbound.connect_timeout"));
    assert_eq!(err.line(), Some(2));
}

#[test]
fn bad_duration_and_bad_address_are_refused() {
    assert!(parse_str("drain:\n  duration: soon\n").is_err());
    assert!(parse_str("inbound:\n  passthrough_source_v4: '::6'\n").is_err());
    assert!(parse_str("admin:\n  address: localhost\n").is_err());
}

#[test]
fn syntax_error_has_a_line() {
    let err = parse_str("outbound:\n  port: [1\n").unwrap_err();
    assert!(err.line().is_some(), "{err}");
}

#[test]
fn access_log_format_json() {
    let c = parse_str("access_log:\n  enabled: true\n  format: json\n").unwrap();
    assert!(c.access_log.enabled);
    assert_eq!(c.access_log.format, AccessLogFormat::Json);
}

#[test]
fn load_names_a_missing_file() {
    let err = load(Path::new("/nonexistent/remora.yaml")).unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/remora.yaml"),
        "{err}"
    );
}

#[test]
fn explicit_listeners_parse_and_are_checked() {
    let c = parse_str(
        "listeners:\n  - address: 127.0.0.1:8080\n    upstream: 127.0.0.1:9090\n    protocol: tcp\n",
    )
    .unwrap();
    assert_eq!(c.listeners.len(), 1);
    assert_eq!(c.listeners[0].upstream.port(), 9090);
    assert_eq!(c.listeners[0].protocol, ListenerProtocol::Tcp);

    let err = parse_str("listeners:\n  - address: 127.0.0.1:15021\n    upstream: 127.0.0.1:1\n")
        .unwrap_err();
    assert_eq!(err.field(), Some("listeners.0.address"));

    let err = parse_str("listeners:\n  - address: 127.0.0.1:80\n    upstream: 127.0.0.1:80\n")
        .unwrap_err();
    assert_eq!(err.field(), Some("listeners.0.upstream"));

    let err = parse_str(
        "listeners:\n  - address: 127.0.0.1:80\n    upstream: 127.0.0.1:81\n    protocol: smtp\n",
    )
    .unwrap_err();
    assert_eq!(err.line(), Some(4), "{err}");
}

#[test]
fn listeners_that_would_share_a_bound_port_are_refused_with_their_line() {
    let two = |a: &str, b: &str| {
        format!("listeners:\n  - address: '{a}'\n    upstream: 127.0.0.1:1\n  - address: '{b}'\n    upstream: 127.0.0.1:2\n")
    };
    for (a, b) in [
        ("0.0.0.0:80", "127.0.0.1:80"),
        ("127.0.0.1:80", "0.0.0.0:80"),
        ("[::]:80", "[::1]:80"),
    ] {
        let err = parse_str(&two(a, b)).unwrap_err();
        assert_eq!(err.field(), Some("listeners.1.address"), "{a} {b}: {err}");
        assert_eq!(err.line(), Some(4), "{a} {b}: {err}");
    }
    // Different families, or different addresses: both bind.
    for (a, b) in [
        ("0.0.0.0:80", "[::]:80"),
        ("127.0.0.1:80", "127.0.0.2:80"),
        ("0.0.0.0:80", "0.0.0.0:81"),
    ] {
        assert!(parse_str(&two(a, b)).is_ok(), "{a} {b}");
    }
    let dns = "dns:\n  enabled: true\nlisteners:\n  - address: 127.0.0.1:15053\n    upstream: 127.0.0.1:1\n";
    let err = parse_str(dns).unwrap_err();
    assert_eq!(err.field(), Some("listeners.0.address"), "{err}");
}

#[test]
fn listener_mesh_tls_parses_and_is_checked() {
    let certs = "tls:\n  cert_dir: /etc/certs\n";
    let listeners = "listeners:\n  - address: 127.0.0.1:8080\n    upstream: 127.0.0.1:9090\n    protocol: http\n    tls:\n      mode: originate\n      hostname: b.ns.svc.cluster.local\n      identities: [spiffe://cluster.local/ns/ns/sa/b]\n  - address: 127.0.0.1:9090\n    upstream: 127.0.0.1:9091\n    tls:\n      mode: terminate\n";
    let c = parse_str(&format!("{certs}{listeners}")).unwrap();
    let a = c.listeners[0].tls.as_ref().unwrap();
    assert_eq!(a.mode, ListenerTlsMode::Originate);
    assert_eq!(a.hostname.as_deref(), Some("b.ns.svc.cluster.local"));
    assert_eq!(a.identities, ["spiffe://cluster.local/ns/ns/sa/b"]);
    assert!(!c.listeners[0].terminates_tls());
    assert!(c.listeners[1].terminates_tls());
    assert!(c.listeners[1].tls.as_ref().unwrap().identities.is_empty());

    // Without a workload certificate there is nothing to speak mutual TLS with.
    let err = parse_str(listeners).unwrap_err();
    assert_eq!(err.field(), Some("listeners.0.tls"), "{err}");
    let err = parse_str(&format!(
        "{certs}listeners:\n  - address: 127.0.0.1:80\n    upstream: 127.0.0.1:81\n    tls:\n      mode: terminate\n      hostname: a.b\n"
    ))
    .unwrap_err();
    assert_eq!(err.field(), Some("listeners.0.tls.hostname"), "{err}");
    let err = parse_str(&format!(
        "{certs}listeners:\n  - address: 127.0.0.1:80\n    upstream: 127.0.0.1:81\n    tls:\n      mode: originate\n      identities: [cluster.local/ns/a/sa/b]\n"
    ))
    .unwrap_err();
    assert_eq!(err.field(), Some("listeners.0.tls.identities"), "{err}");
    let err = parse_str(&format!(
        "{certs}listeners:\n  - address: 127.0.0.1:80\n    upstream: 127.0.0.1:81\n    tls:\n      mode: both\n"
    ))
    .unwrap_err();
    assert_eq!(err.line(), Some(7), "{err}");
}

#[test]
fn declared_ports_and_always_tcp_ports() {
    let c = parse_str("ports:\n  8080: http\n  9000: grpc\n  3306: http\n  5432: tcp\n").unwrap();
    assert_eq!(c.declared_protocol(8080), Some(PortProtocol::Http));
    assert_eq!(c.declared_protocol(9000), Some(PortProtocol::Grpc));
    assert!(c.declared_protocol(9000).is_some_and(PortProtocol::is_http));
    // A declaration wins over Istio's always-TCP list.
    assert_eq!(c.declared_protocol(3306), Some(PortProtocol::Http));
    assert_eq!(c.declared_protocol(27017), Some(PortProtocol::Tcp));
    assert_eq!(c.declared_protocol(5432), Some(PortProtocol::Tcp));
    assert_eq!(c.declared_protocol(8081), None);

    let err = parse_str("ports:\n  8080: htp\n").unwrap_err();
    assert_eq!(err.line(), Some(2), "{err}");
}

#[test]
fn http_section_has_documented_defaults_and_is_checked() {
    let c = Config::default();
    assert_eq!(c.detection.timeout, Duration::from_secs(5));
    assert_eq!(
        c.detection.after_connect_failure,
        Duration::from_millis(100)
    );
    assert_eq!(c.http.max_header_bytes, 60 * 1024);
    assert_eq!(c.http.max_headers, 100);
    assert_eq!(c.http.retries, 2);
    assert_eq!(c.http.pool_idle_timeout, Duration::from_secs(30));
    assert_eq!(c.http.request_timeout, Duration::ZERO);

    let c = parse_str("detection:\n  timeout: 30s\nhttp:\n  retries: 0\n").unwrap();
    assert_eq!(c.detection.timeout, Duration::from_secs(30));
    assert_eq!(c.http.retries, 0);

    let err = parse_str("http:\n  max_header_bytes: 100\n").unwrap_err();
    assert_eq!(err.field(), Some("http.max_header_bytes"));
    let err = parse_str("detection:\n  timeout: 0s\n").unwrap_err();
    assert_eq!(err.field(), Some("detection.timeout"));
}

#[test]
fn listener_protocols_http_and_auto_parse() {
    let c = parse_str(
        "listeners:\n  - address: 127.0.0.1:8080\n    upstream: 127.0.0.1:9090\n    protocol: http\n  - address: 127.0.0.1:8081\n    upstream: 127.0.0.1:9090\n    protocol: auto\n",
    )
    .unwrap();
    assert_eq!(c.listeners[0].protocol, ListenerProtocol::Http);
    assert_eq!(c.listeners[1].protocol, ListenerProtocol::Auto);
}

#[test]
fn dns_is_off_by_default_on_istios_port() {
    let c = Config::default();
    assert!(!c.dns.enabled);
    assert_eq!(c.dns.port.get(), 15053);
    assert_eq!(c.dns.resolv_conf, Path::new("/etc/resolv.conf"));
    assert_eq!(c.dns.upstream_timeout, Duration::from_secs(5));
}

#[test]
fn dns_section_parses_and_refuses_zero_bounds() {
    let c =
        parse_str("dns:\n  enabled: true\n  resolv_conf: /tmp/r.conf\n  upstream_timeout: 2s\n")
            .unwrap();
    assert!(c.dns.enabled);
    assert_eq!(c.dns.resolv_conf, Path::new("/tmp/r.conf"));
    assert_eq!(c.dns.upstream_timeout, Duration::from_secs(2));
    let err = parse_str("dns:\n  max_udp_in_flight: 0\n").unwrap_err();
    assert_eq!(err.field(), Some("dns.max_udp_in_flight"));
    assert_eq!(err.line(), Some(2));
    let err = parse_str("dns:\n  port: 15001\n").unwrap_err();
    assert_eq!(err.field(), Some("dns.port"));
}

#[test]
fn interception_mode_takes_istios_spelling_too() {
    assert_eq!(
        Config::default().inbound.interception_mode,
        InterceptionMode::Redirect
    );
    for text in ["tproxy", "TPROXY"] {
        let c = parse_str(&format!("inbound:\n  interception_mode: {text}\n")).unwrap();
        assert_eq!(c.inbound.interception_mode, InterceptionMode::Tproxy);
        assert_eq!(c.inbound.tproxy_mark, 1337);
    }
    let err = parse_str("inbound:\n  interception_mode: tproxy\n  tproxy_mark: 0\n").unwrap_err();
    assert_eq!(err.field(), Some("inbound.tproxy_mark"));
}

#[test]
fn tls_and_mesh_parse_with_istios_names_and_are_checked() {
    let c = Config::default();
    assert_eq!(c.tls.cert_dir, None);
    assert_eq!(c.tls.min_protocol_version, TlsVersion::Tls13);
    assert_eq!(c.mesh.mtls_mode, MtlsMode::Permissive);
    assert_eq!(c.mesh.metadata_exchange_timeout, Duration::from_secs(10));
    let c = parse_str("mesh:\n  metadata_exchange_timeout: 2s\n").unwrap();
    assert_eq!(c.mesh.metadata_exchange_timeout, Duration::from_secs(2));
    let err = parse_str("mesh:\n  metadata_exchange_timeout: 0s\n").unwrap_err();
    assert_eq!(err.field(), Some("mesh.metadata_exchange_timeout"));
    let c = parse_str(
        "tls:\n  cert_dir: /etc/certs\n  min_protocol_version: TLSV1_2\nmesh:\n  mtls_mode: STRICT\n  destinations:\n    - cidrs: [10.0.0.0/8, 198.18.0.2]\n      ports: [80]\n      hostname: reviews.default.svc.cluster.local\n      identities: [spiffe://cluster.local/ns/default/sa/reviews]\n",
    )
    .unwrap();
    assert_eq!(c.tls.cert_dir.as_deref(), Some(Path::new("/etc/certs")));
    assert_eq!(c.tls.min_protocol_version, TlsVersion::Tls12);
    assert_eq!(c.mesh.mtls_mode, MtlsMode::Strict);
    let d = c.mesh.destination("10.1.2.3".parse().unwrap(), 80).unwrap();
    assert_eq!(
        d.hostname.as_deref(),
        Some("reviews.default.svc.cluster.local")
    );
    assert!(c
        .mesh
        .destination("10.1.2.3".parse().unwrap(), 81)
        .is_none());
    assert!(c
        .mesh
        .destination("198.18.0.2".parse().unwrap(), 80)
        .is_some());

    let err = parse_str("mesh:\n  mtls_mode: strict\n").unwrap_err();
    assert_eq!(err.field(), Some("mesh.mtls_mode"));
    let err =
        parse_str("tls:\n  cert_dir: /c\nmesh:\n  destinations:\n    - cidrs: [10.0.0.0/33]\n")
            .unwrap_err();
    assert_eq!(err.field(), Some("mesh.destinations[0].cidrs[0]"), "{err}");
    let err = parse_str(
        "tls:\n  cert_dir: /c\nmesh:\n  destinations:\n    - cidrs: [10.0.0.0/8]\n      identities: [reviews]\n",
    )
    .unwrap_err();
    assert_eq!(err.field(), Some("mesh.destinations.0.identities"));
    let err = parse_str("tls:\n  handshake_timeout: 0s\n").unwrap_err();
    assert_eq!(err.field(), Some("tls.handshake_timeout"));
}

#[test]
fn the_documented_schema_is_the_defaults() {
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/config.md"))
        .expect("docs/config.md");
    let yaml = md
        .split("```yaml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the schema's YAML block");
    assert_eq!(parse_str(yaml).unwrap(), Config::default());
}

#[test]
fn istiod_is_off_by_default_and_named_errors_point_at_its_fields() {
    let c = Config::default();
    assert_eq!(c.istiod.discovery_address, None);
    assert_eq!(c.istiod.secret_ttl, Duration::from_secs(86_400));
    assert_eq!(c.istiod.secret_grace_period_ratio, Ratio(0.5));
    let c = parse_str(
        "istiod:\n  discovery_address: istiod.istio-system.svc:15012\n  secret_ttl: 10s\n",
    )
    .unwrap();
    assert_eq!(
        c.istiod.discovery_address.as_deref(),
        Some("istiod.istio-system.svc:15012")
    );
    assert_eq!(c.istiod.secret_ttl, Duration::from_secs(10));
    let e = parse_str("tls: {}\nistiod:\n  discovery_address: istiod\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("remora.yaml:3") && e.contains("istiod.discovery_address"),
        "{e}"
    );
    let e = parse_str("istiod:\n  secret_grace_period_ratio: 1.5\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("istiod.secret_grace_period_ratio"), "{e}");
    let e = parse_str("istiod:\n  token: /t\n").unwrap_err().to_string();
    assert!(e.contains("istiod") && e.contains("token"), "{e}");
}

#[test]
fn istiod_is_an_identity_source_for_mesh_tls() {
    let mesh = "mesh:\n  mtls_mode: STRICT\n";
    assert!(parse_str(mesh).is_err());
    let c = parse_str(&format!(
        "{mesh}istiod:\n  discovery_address: istiod.istio-system.svc:15012\n"
    ))
    .unwrap();
    assert_eq!(c.mesh.mtls_mode, MtlsMode::Strict);
}

#[test]
fn xds_resources_dir_is_off_by_default_and_checked() {
    assert_eq!(Config::default().xds.resources_dir, None);
    let c = parse_str("xds:\n  resources_dir: /etc/remora/xds\n").unwrap();
    assert_eq!(
        c.xds.resources_dir.as_deref(),
        Some(std::path::Path::new("/etc/remora/xds"))
    );
    let e = parse_str("xds:\n  watch_interval: 0s\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("remora.yaml:2") && e.contains("xds.watch_interval"),
        "{e}"
    );
    let e = parse_str("xds:\n  dir: /x\n").unwrap_err().to_string();
    assert!(e.contains("xds") && e.contains("dir"), "{e}");
}

#[test]
fn overload_limits_parse_and_are_checked() {
    let c = parse_str("overload:\n  max_connections: 1000\n  max_connections_per_listener: 600\n")
        .unwrap();
    assert_eq!(c.overload.limits(1_048_576), (1000, 600));
    let err = parse_str("overload:\n  max_connections: 0\n").unwrap_err();
    assert_eq!(err.field(), Some("overload.max_connections"), "{err}");
    let err = parse_str("overload:\n  max_connections: 10\n  max_connections_per_listener: 11\n")
        .unwrap_err();
    assert_eq!(
        err.field(),
        Some("overload.max_connections_per_listener"),
        "{err}"
    );
    assert_eq!(err.line(), Some(3), "{err}");
}

#[test]
fn request_body_pace_has_defaults_and_refuses_a_zero_rate() {
    let c = Config::default();
    assert_eq!(c.http.request_body_timeout, Duration::from_secs(30));
    assert_eq!(c.http.request_body_min_rate, 1024);
    let c = parse_str("http:\n  request_body_timeout: 0s\n").unwrap();
    assert!(c.http.request_body_timeout.is_zero());
    let err = parse_str("http:\n  request_body_min_rate: 0\n").unwrap_err();
    assert_eq!(err.field(), Some("http.request_body_min_rate"), "{err}");
    assert_eq!(err.line(), Some(2), "{err}");
}
