//! The xDS conformance set (shared/conformance/xds: real istiod sidecar output): every resource
//! is accepted except the three named exceptions, and the model reproduces the facts the set
//! records (facts/<case>.json).

use remora_xds::convert::{from_json, HBONE_REASON};
use remora_xds::model::cluster::TlsVersion;
use remora_xds::model::ext_authz::Service as ExtAuthzService;
use remora_xds::model::listener::{
    ChainKind, ConnectionFacts, Direction, FilterChain, HttpFilter, Listener, NetworkFilter,
    RouteSource, TcpTarget,
};
use remora_xds::model::matcher::{StringMatch, StringMatcher};
use remora_xds::model::rbac::{Action as RbacAction, Rbac, Rules};
use remora_xds::refusal::Kind;
use remora_xds::sink::{type_url, Resource as Delivered, Sink, Update};
use remora_xds::store::Store;
use remora_xds::validate::validate_dir;
use serde_json::Value;
use std::path::{Path, PathBuf};
use support::{authz_listeners, conformance_dir, facts, resources, s, strings};

mod support;

type ListenerProto = envoy_types::pb::envoy::config::listener::v3::Listener;

#[test]
fn every_resource_is_accepted_except_the_three_named_exceptions() {
    let Some(dir) = conformance_dir() else { return };
    let mut cases: Vec<PathBuf> = std::fs::read_dir(dir.join("resources"))
        .expect("resources")
        .map(|e| e.expect("entry").path())
        .collect();
    cases.sort();
    assert_eq!(cases.len(), 6, "the set has six cases");
    let mut accepted = 0;
    let mut refused = Vec::new();
    for case in &cases {
        for verdict in validate_dir(case).expect("the case reads") {
            match &verdict.refusal {
                None => accepted += 1,
                Some(r) => refused.push((
                    verdict.kind,
                    verdict.name.clone(),
                    r.reason.clone(),
                    r.to_string(),
                )),
            }
        }
    }
    // The README's count: 63 resources.
    assert_eq!(accepted + refused.len(), 63);
    refused.sort();
    let expect = |kind: Kind, name: &str, reason: &str| {
        let hit = refused.iter().find(|(k, n, _, _)| *k == kind && n == name);
        let (_, _, got, line) = hit.unwrap_or_else(|| panic!("{kind} {name} was not refused"));
        assert!(got.starts_with(reason), "{kind} {name}: {line}");
    };
    for hbone in ["connect_terminate", "main_internal", "connect_originate"] {
        expect(Kind::Listener, hbone, HBONE_REASON);
    }
    for wasm in ["default.httpbin-rate-limiting", "default.display-metadata"] {
        expect(Kind::ExtensionConfig, wasm, "Wasm module file");
    }
    assert_eq!(refused.len(), 5, "only the named exceptions: {refused:#?}");
    // virtualInbound, with the ext_authz filters of its CUSTOM policy, is accepted.
    assert!(
        !refused.iter().any(|r| r.1 == "virtualInbound"),
        "{refused:#?}"
    );
}

fn matcher_fact(m: &StringMatcher) -> (String, String) {
    match &m.kind {
        StringMatch::Exact(x) => ("exact".into(), x.clone()),
        StringMatch::Prefix(x) => ("prefix".into(), x.clone()),
        StringMatch::Suffix(x) => ("suffix".into(), x.clone()),
        StringMatch::Contains(x) => ("contains".into(), x.clone()),
        StringMatch::Regex(p) => ("safe_regex".into(), p.as_str().to_string()),
    }
}

fn san_facts(v: &Value) -> Vec<(String, String)> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let obj = m.as_object().expect("a matcher");
            let (k, val) = obj
                .iter()
                .find(|(k, _)| *k != "san_type")
                .expect("a match kind");
            (k.clone(), s(val).to_string())
        })
        .collect()
}

fn version_fact(v: Option<TlsVersion>) -> &'static str {
    match v {
        None => "TLS_AUTO",
        Some(TlsVersion::Tls1_0) => "TLSv1_0",
        Some(TlsVersion::Tls1_1) => "TLSv1_1",
        Some(TlsVersion::Tls1_2) => "TLSv1_2",
        Some(TlsVersion::Tls1_3) => "TLSv1_3",
    }
}

fn rules_fact(r: &Rules) -> (String, Vec<String>) {
    let action = match r.action {
        RbacAction::Allow => "ALLOW",
        RbacAction::Deny => "DENY",
        RbacAction::Log => "LOG",
    };
    (action.into(), r.policies.keys().cloned().collect())
}

fn check_rbac(fact: &Value, model: &Rbac, at: &str) {
    for (field, rules) in [
        ("rules", &model.rules),
        ("shadow_rules", &model.shadow_rules),
    ] {
        match (&fact[field], rules) {
            (Value::Null, None) => {}
            (f, Some(r)) => {
                let (action, policies) = rules_fact(r);
                assert_eq!(action, s(&f["action"]), "{at} {field} action");
                let mut want = strings(&f["policies"]);
                want.sort();
                assert_eq!(policies, want, "{at} {field} policies");
            }
            (f, None) => panic!("{at}: {field} {f} missing from the model"),
        }
    }
    assert_eq!(
        model.shadow_rules_stat_prefix,
        s(&fact["shadow_rules_stat_prefix"]),
        "{at}"
    );
}

fn check_chain(fact: &Value, chain: &FilterChain, at: &str) {
    let m = &fact["match"];
    assert_eq!(
        chain.matcher.destination_port.map(u64::from),
        m["destination_port"].as_u64(),
        "{at} destination_port"
    );
    assert_eq!(
        chain.matcher.transport_protocol.as_deref(),
        m["transport_protocol"].as_str(),
        "{at} transport_protocol"
    );
    assert_eq!(
        chain.matcher.application_protocols,
        strings(&m["application_protocols"]),
        "{at} alpn"
    );
    assert_eq!(
        chain.matcher.prefix_ranges.len(),
        m["prefix_ranges"].as_array().map_or(0, Vec::len),
        "{at} prefix_ranges"
    );
    // Every network filter but the terminal one is in the model, in order.
    let network = fact["network_filters"].as_array().expect("network filters");
    assert_eq!(
        chain.filters.len(),
        network.len() - 1,
        "{at} network filters"
    );
    for (model, name) in chain.filters.iter().zip(network) {
        let name = s(name);
        let ok = match model {
            NetworkFilter::IstioStats(_) => name.starts_with("istio.stats"),
            NetworkFilter::MetadataExchange(mx) => {
                mx.protocol == "istio-peer-exchange" && name.starts_with("istio.metadata_exchange")
            }
            NetworkFilter::IstioAuthn { shared } => !shared && name.starts_with("istio_authn"),
            NetworkFilter::Rbac(_) => name.starts_with("envoy.filters.network.rbac"),
            NetworkFilter::ExtAuthz(_) => name.starts_with("envoy.filters.network.ext_authz"),
        };
        assert!(ok, "{at}: {model:?} for {name}");
    }
    match (&fact["tls"], &chain.tls) {
        (Value::Null, None) => {}
        (tls, Some(model)) => {
            assert_eq!(model.alpn, strings(&tls["alpn"]), "{at} tls alpn");
            assert_eq!(
                model.certificate_secrets,
                strings(&tls["certificate_sds"]),
                "{at}"
            );
            assert_eq!(
                model.validation_secret.as_deref(),
                tls["validation_sds"].as_str(),
                "{at}"
            );
            assert_eq!(
                model.require_client_certificate,
                tls["require_client_certificate"].as_bool().unwrap_or(false),
                "{at}"
            );
            assert_eq!(model.cipher_suites, strings(&tls["cipher_suites"]), "{at}");
            let versions = strings(&tls["tls_versions"]);
            assert_eq!(
                [
                    version_fact(model.min_version),
                    version_fact(model.max_version)
                ]
                .to_vec(),
                versions,
                "{at} tls versions"
            );
            let sans: Vec<_> = model
                .subject_alt_names
                .iter()
                .map(|m| matcher_fact(&m.matcher))
                .collect();
            assert_eq!(
                sans,
                san_facts(&tls["subject_alt_name_matchers"]),
                "{at} SANs"
            );
        }
        (f, None) => panic!("{at}: TLS {f} missing from the model"),
    }
    let mut rbac = Vec::new();
    match (s(&fact["kind"]), &chain.kind) {
        ("tcp", ChainKind::Tcp(tcp)) => {
            assert_eq!(
                tcp.target,
                TcpTarget::Cluster(s(&fact["cluster"]).into()),
                "{at}"
            );
            assert_eq!(tcp.stat_prefix, s(&fact["stat_prefix"]), "{at}");
        }
        ("http", ChainKind::Http(http)) => {
            match (&http.routes, fact["rds"].as_str()) {
                (RouteSource::Rds(name), Some(rds)) => assert_eq!(name, rds, "{at}"),
                (RouteSource::Inline(rc), None) => {
                    assert_eq!(rc.name, s(&fact["inline_route_config"]), "{at}")
                }
                (other, _) => panic!("{at}: routes {other:?}"),
            }
            assert_eq!(&*http.stat_prefix, s(&fact["stat_prefix"]), "{at}");
            let filters: Vec<&Value> = fact["http_filters"]
                .as_array()
                .expect("http filters")
                .iter()
                .collect();
            // The router ends the chain and is not a filter of the model's.
            assert_eq!(
                http.http_filters.len(),
                filters.len() - 1,
                "{at} http filters"
            );
            for (model, name) in http.http_filters.iter().zip(filters.iter().copied()) {
                let name = s(name);
                let ok = match model {
                    HttpFilter::MetadataExchange(_) => name.starts_with("istio.metadata_exchange"),
                    HttpFilter::Rbac(r) => {
                        rbac.push(r.clone());
                        name.starts_with("envoy.filters.http.rbac")
                    }
                    HttpFilter::AlpnOverride(o) => name.starts_with("istio.alpn") && o.len() == 3,
                    HttpFilter::IstioStats(_) => name.starts_with("istio.stats"),
                    HttpFilter::GrpcStats { emit_filter_state } => {
                        *emit_filter_state && name.starts_with("envoy.filters.http.grpc_stats")
                    }
                    HttpFilter::Fault => name.starts_with("envoy.filters.http.fault"),
                    HttpFilter::Cors => name.starts_with("envoy.filters.http.cors"),
                    // istiod's gRPC provider, switched on by its shadow RBAC filter's policy id.
                    HttpFilter::ExtAuthz(a) => {
                        name.starts_with("envoy.filters.http.ext_authz")
                            && matches!(&a.service, ExtAuthzService::Grpc { cluster, .. }
                                if cluster == "outbound|9191||sample-ext-authz-grpc")
                            && a.enabled_by.as_ref().is_some_and(|e| {
                                e.key == "istio_ext_authz_shadow_effective_policy_id"
                                    && e.matcher.matches(
                                        "istio-ext-authz-ns[default]-policy[ext-authz]-rule[0]",
                                    )
                            })
                    }
                };
                assert!(ok, "{at}: {model:?} for {name}");
            }
            let upgrades: Vec<String> = http
                .upgrades
                .iter()
                .map(|u| u.upgrade_type.clone())
                .collect();
            assert_eq!(upgrades, strings(&fact["upgrades"]), "{at} upgrades");
        }
        (kind, model) => panic!("{at}: fact {kind}, model {model:?}"),
    }
    for f in &chain.filters {
        if let NetworkFilter::Rbac(r) = f {
            rbac.push(r.clone());
        }
    }
    let rbac_facts = fact["rbac"].as_array().cloned().unwrap_or_default();
    assert_eq!(rbac.len(), rbac_facts.len(), "{at} RBAC filters");
    for (i, (f, m)) in rbac_facts.iter().zip(&rbac).enumerate() {
        check_rbac(f, m, &format!("{at} rbac[{i}]"));
    }
}

#[test]
fn listeners_reproduce_their_facts() {
    let Some(dir) = conformance_dir() else { return };
    let facts = facts(&dir, "authz-sidecar");
    let listeners = authz_listeners(&dir);
    let mut checked = 0;
    for fact in facts["listeners"].as_array().expect("listeners") {
        let name = s(&fact["name"]);
        let Some(l) = listeners.iter().find(|l| l.name == name) else {
            assert!(
                fact["internal_listener"].as_bool().unwrap_or(false) || name == "connect_terminate",
                "{name} missing"
            );
            continue;
        };
        assert_eq!(l.address.to_string(), s(&fact["address"]), "{name}");
        assert_eq!(
            u64::from(l.address.port()),
            fact["port"].as_u64().expect("port"),
            "{name}"
        );
        let direction = match l.direction {
            Direction::Inbound => "INBOUND",
            Direction::Outbound => "OUTBOUND",
            Direction::Unspecified => "UNSPECIFIED",
        };
        assert_eq!(
            direction,
            fact["traffic_direction"].as_str().unwrap_or("UNSPECIFIED"),
            "{name}"
        );
        assert_eq!(
            l.bind_to_port,
            fact["bind_to_port"].as_bool().expect("bool"),
            "{name}"
        );
        assert_eq!(
            l.use_original_dst,
            fact["use_original_dst"].as_bool().expect("bool"),
            "{name}"
        );
        let chains = fact["filter_chains"].as_array().expect("chains");
        assert_eq!(l.filter_chains.len(), chains.len(), "{name} chains");
        for (i, (f, c)) in chains.iter().zip(&l.filter_chains).enumerate() {
            check_chain(f, c, &format!("{name} filter_chains[{i}]"));
        }
        match (&fact["default_filter_chain"], &l.default_filter_chain) {
            (Value::Null, None) => {}
            (f, Some(c)) => check_chain(f, c, &format!("{name} default_filter_chain")),
            (f, None) => panic!("{name}: default chain {f} missing"),
        }
        let filters = fact["listener_filters"]
            .as_array()
            .expect("listener filters");
        let has = |n: &str| filters.iter().any(|f| s(&f["filter"]).starts_with(n));
        assert_eq!(
            l.listener_filters.tls_inspector.is_some(),
            has("envoy.filters.listener.tls_inspector"),
            "{name}"
        );
        assert_eq!(
            l.listener_filters.http_inspector.is_some(),
            has("envoy.filters.listener.http_inspector"),
            "{name}"
        );
        assert_eq!(
            l.listener_filters.original_dst,
            has("envoy.filters.listener.original_dst"),
            "{name}"
        );
        checked += 1;
    }
    // 27 less the three HBONE listeners.
    assert_eq!(checked, 24);
    // virtualInbound's TLS inspector skips its own port (istiod's filter_disabled).
    let inbound = listeners
        .iter()
        .find(|l| l.name == "virtualInbound")
        .expect("virtualInbound");
    let tls = inbound
        .listener_filters
        .tls_inspector
        .as_ref()
        .expect("tls inspector");
    assert!(!tls.applies_to(15006));
    assert!(tls.applies_to(8080));
}

fn load_store(listeners: &[Listener], dir: &Path) -> Store {
    let store = Store::new();
    let names: Vec<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
    let bodies = resources(dir, "authz-sidecar", "listeners")
        .into_iter()
        .filter(|l| names.contains(&s(&l["name"])) && s(&l["name"]) != "virtualInbound")
        .map(|l| {
            let proto = from_json::<ListenerProto>(&l)
                .unwrap_or_else(|r| panic!("{r}"))
                .proto;
            Delivered {
                name: String::new(),
                version: "1".into(),
                body: prost::Message::encode_to_vec(&proto),
            }
        })
        .collect();
    let applied = store.apply(
        type_url::LISTENER,
        Update {
            resources: bodies,
            removed: vec![],
            complete: true,
        },
    );
    assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
    store
}

#[test]
fn outbound_ports_reach_the_protocol_route_table_or_cluster_of_their_facts() {
    let Some(dir) = conformance_dir() else { return };
    let facts = facts(&dir, "authz-sidecar");
    let listeners = authz_listeners(&dir);
    let store = load_store(&listeners, &dir);
    let snapshot = store.snapshot();
    let ports = facts["outbound_ports"].as_array().expect("outbound ports");
    assert_eq!(ports.len(), 22);
    for port in ports {
        let address = s(&port["address"]);
        // A connection to the service VIP (or to any address, for 0.0.0.0 listeners).
        let dst = address
            .replace("0.0.0.0:", "10.1.2.3:")
            .parse()
            .expect("address");
        let l = snapshot.outbound_listener(dst).expect("a listener");
        assert_eq!(l.name, s(&port["listener"]), "{address}");
        let pick = |transport: &str, alpn: &[&str]| -> &FilterChain {
            l.filter_chain(&ConnectionFacts {
                destination: dst,
                server_name: None,
                transport_protocol: transport,
                application_protocols: alpn,
            })
            .unwrap_or_else(|| panic!("{address}: no chain for {transport} {alpn:?}"))
        };
        for http in port["http"].as_array().expect("http") {
            let m = &http["filter_chain_match"];
            let alpn = strings(&m["application_protocols"]);
            let alpn: Vec<&str> = alpn.iter().map(String::as_str).collect();
            let chain = pick(
                m["transport_protocol"].as_str().unwrap_or("raw_buffer"),
                &alpn[..1.min(alpn.len())],
            );
            let ChainKind::Http(h) = &chain.kind else {
                panic!("{address}: HTTP expected")
            };
            assert_eq!(
                h.routes,
                RouteSource::Rds(s(&http["rds"]).into()),
                "{address}"
            );
        }
        for tcp in port["tcp"].as_array().expect("tcp") {
            // TLS from the application matches no HTTP chain: the TCP chain (or fallback).
            let chain = pick("tls", &["h2"]);
            let ChainKind::Tcp(t) = &chain.kind else {
                panic!("{address}: TCP expected")
            };
            assert_eq!(
                t.target,
                TcpTarget::Cluster(s(&tcp["cluster"]).into()),
                "{address}"
            );
            let default = tcp["default_chain"].as_bool().expect("bool");
            assert_eq!(
                l.default_filter_chain.as_ref() == Some(chain),
                default,
                "{address}"
            );
        }
        let protocol = match (
            port["http"].as_array().map_or(0, Vec::len),
            port["tcp"].as_array().map_or(0, Vec::len),
        ) {
            (0, _) => "tcp",
            (_, 0) => "http",
            _ => "http+tcp-fallback",
        };
        assert_eq!(protocol, s(&port["protocol"]), "{address}");
    }
    // An address no listener names goes to virtualOutbound, whose catch-all is passthrough.
    let other = "192.0.2.1:4444".parse().expect("addr");
    let l = snapshot.outbound_listener(other).expect("virtualOutbound");
    assert_eq!(l.name, "virtualOutbound");
    let c = l
        .filter_chain(&ConnectionFacts {
            destination: other,
            server_name: None,
            transport_protocol: "raw_buffer",
            application_protocols: &[],
        })
        .expect("a chain");
    assert!(
        matches!(&c.kind, ChainKind::Tcp(t) if t.target == TcpTarget::Cluster("PassthroughCluster".into()))
    );
    assert_eq!(
        snapshot.wanted_routes().len(),
        12,
        "the 12 RDS route tables the listeners name"
    );
}

#[test]
fn the_listeners_as_ads_delivers_them_apply_but_the_named_exceptions() {
    let Some(dir) = conformance_dir() else { return };
    // Each listener as bytes, as an ADS response carries it: the binary form of every
    // Istio-only Any and TypedStruct goes through the same read as the JSON one.
    let resources = resources(&dir, "authz-sidecar", "listeners")
        .iter()
        .map(|l| {
            let desc = remora_xds::json::from_json(l, "envoy.config.listener.v3.Listener")
                .unwrap_or_else(|e| panic!("{e}"));
            Delivered {
                name: s(&l["name"]).to_string(),
                version: "2023-06-20T09:08:58Z/4".into(),
                body: prost::Message::encode_to_vec(&desc),
            }
        })
        .collect();
    let store = Store::new();
    let applied = store.apply(
        type_url::LISTENER,
        Update {
            resources,
            removed: vec![],
            complete: true,
        },
    );
    let mut rejected: Vec<(&str, &str)> = applied
        .rejected
        .iter()
        .map(|r| (r.name.as_str(), r.reason.as_str()))
        .collect();
    rejected.sort();
    assert_eq!(rejected.len(), 3, "{rejected:#?}");
    for (name, reason) in &rejected {
        assert!(reason.ends_with(HBONE_REASON), "{name}: {reason}");
    }
    let snapshot = store.snapshot();
    assert_eq!(snapshot.listeners.len(), 24);
    let wanted = &applied.wanted[type_url::ROUTE];
    assert!(
        wanted.contains("9080") && wanted.contains("80"),
        "{wanted:?}"
    );
    assert_eq!(wanted, &snapshot.wanted_routes());
}
