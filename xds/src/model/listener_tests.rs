//! Filter chain matching as Envoy narrows it, the default chain when a step excludes every
//! survivor, and the listener filters' disabled ports.

use super::*;

fn chain(name: &str, matcher: ChainMatch) -> FilterChain {
    FilterChain {
        name: Some(name.into()),
        matcher,
        tls: None,
        filters: vec![],
        kind: ChainKind::Tcp(TcpChain {
            stat_prefix: name.into(),
            target: TcpTarget::Cluster(name.into()),
            idle_timeout: None,
            access_log: Arc::from([]),
            hash_source_ip: false,
        }),
    }
}

fn listener() -> Listener {
    let any = CidrRange {
        address: "0.0.0.0".parse().expect("ip"),
        prefix_len: 0,
    };
    Listener {
        name: "virtualInbound".into(),
        address: "0.0.0.0:15006".parse().expect("addr"),
        direction: Direction::Inbound,
        bind_to_port: true,
        use_original_dst: false,
        listener_filters: ListenerFilters::default(),
        filter_chains: vec![
            chain(
                "tls-http",
                ChainMatch {
                    prefix_ranges: vec![any],
                    transport_protocol: Some("tls".into()),
                    application_protocols: vec!["istio-http/1.1".into()],
                    ..Default::default()
                },
            ),
            chain(
                "tls-tcp",
                ChainMatch {
                    prefix_ranges: vec![any],
                    transport_protocol: Some("tls".into()),
                    ..Default::default()
                },
            ),
            chain(
                "port-80",
                ChainMatch {
                    destination_port: Some(80),
                    ..Default::default()
                },
            ),
        ],
        default_filter_chain: Some(chain("default", ChainMatch::default())),
        access_log: Arc::from([]),
    }
}

fn pick<'a>(l: &'a Listener, dst: &str, transport: &str, alpn: &[&str]) -> &'a str {
    l.filter_chain(&ConnectionFacts {
        destination: dst.parse().expect("addr"),
        server_name: None,
        transport_protocol: transport,
        application_protocols: alpn,
    })
    .and_then(|c| c.name.as_deref())
    .unwrap_or("none")
}

#[test]
fn chains_narrow_as_envoy_narrows_them() {
    let l = listener();
    assert_eq!(
        pick(&l, "10.0.0.1:9080", "tls", &["istio-http/1.1"]),
        "tls-http"
    );
    assert_eq!(pick(&l, "10.0.0.1:9080", "tls", &["istio"]), "tls-tcp");
    // A port match wins before transport is looked at.
    assert_eq!(
        pick(&l, "10.0.0.1:80", "tls", &["istio-http/1.1"]),
        "port-80"
    );
    // Nothing for plaintext on another port: the default chain.
    assert_eq!(pick(&l, "10.0.0.1:9080", "raw_buffer", &[]), "default");
}

#[test]
fn a_step_that_excludes_every_survivor_takes_the_default_chain() {
    // Envoy narrows by port first: a port-80 connection with ALPN no port-80 chain names
    // does not fall back to the chains of other ports.
    let mut l = listener();
    l.filter_chains[2].matcher.application_protocols = vec!["h2".into()];
    assert_eq!(
        pick(&l, "10.0.0.1:80", "tls", &["istio-http/1.1"]),
        "default"
    );
    // The destination address narrows before the server name: a chain for the name must
    // name the address range as the others do, or it is out before SNI is looked at.
    let any = l.filter_chains[0].matcher.prefix_ranges.clone();
    l.filter_chains.push(chain(
        "sni",
        ChainMatch {
            prefix_ranges: any,
            server_names: vec!["*.example.com".into()],
            ..Default::default()
        },
    ));
    let with_sni = |sni| {
        l.filter_chain(&ConnectionFacts {
            destination: "10.0.0.1:443".parse().expect("addr"),
            server_name: Some(sni),
            transport_protocol: "tls",
            application_protocols: &[],
        })
        .and_then(|c| c.name.as_deref())
    };
    assert_eq!(with_sni("API.Example.com"), Some("sni"));
    assert_eq!(with_sni("example.org"), Some("tls-tcp"));
}

#[test]
fn inspectors_skip_disabled_ports() {
    let scope = InspectorScope {
        disabled_ports: vec![(15006, 15007)],
    };
    assert!(!scope.applies_to(15006));
    assert!(scope.applies_to(15007));
    assert_eq!(server_name_rank("*.example.com", "a.example.com"), Some(12));
    assert_eq!(
        server_name_rank("a.example.com", "a.example.com"),
        Some(usize::MAX)
    );
    assert_eq!(server_name_rank("*.example.com", "example.com"), None);
}
