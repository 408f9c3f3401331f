//! The xDS conformance set's route tables, clusters, endpoints and secrets, read into the model,
//! against facts/<case>.json.

use remora_xds::convert::from_json;
use remora_xds::model::cluster::{Discovery, LbPolicy, TransportSocket};
use remora_xds::model::endpoint::Health;
use remora_xds::model::listener::{ChainKind, RouteSource};
use remora_xds::model::matcher::StringMatch;
use remora_xds::model::route::{Action, ClusterTarget, PathMatch, RouteConfiguration};
use remora_xds::model::secret::SecretKind;
use serde_json::Value;
use std::time::Duration;
use support::{authz_listeners, conformance_dir, facts, resources, s, strings};

mod support;

type ClusterProto = envoy_types::pb::envoy::config::cluster::v3::Cluster;
type RouteProto = envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
type ClaProto = envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
type SecretProto = envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

/// `"10s"` → 10 s (the facts' durations are whole or fractional seconds).
fn seconds(v: &Value) -> Duration {
    let text = s(v).trim_end_matches('s');
    Duration::from_secs_f64(text.parse().unwrap_or_else(|_| panic!("duration {v}")))
}

fn check_route_table(fact: &Value, rc: &RouteConfiguration) {
    let at = format!("route {}", rc.name);
    assert_eq!(rc.name, s(&fact["name"]), "{at}");
    let vhosts = fact["virtual_hosts"].as_array().expect("virtual hosts");
    assert_eq!(rc.virtual_hosts.len(), vhosts.len(), "{at}");
    for (vf, vh) in vhosts.iter().zip(&rc.virtual_hosts) {
        let at = format!("{at} {}", vh.name);
        assert_eq!(vh.name, s(&vf["name"]), "{at}");
        assert_eq!(vh.domains, strings(&vf["domains"]), "{at}");
        assert_eq!(
            vh.include_request_attempt_count,
            vf["include_request_attempt_count"]
                .as_bool()
                .unwrap_or(false),
            "{at}"
        );
        let routes = vf["routes"].as_array().expect("routes");
        assert_eq!(vh.routes.len(), routes.len(), "{at}");
        for (i, (rf, r)) in routes.iter().zip(&vh.routes).enumerate() {
            let at = format!("{at} routes[{i}]");
            assert_eq!(r.name.as_deref(), rf["name"].as_str(), "{at}");
            let m = &rf["match"];
            let (kind, path) = match &r.matcher.path {
                PathMatch::Prefix(p) => ("prefix", p.as_str()),
                PathMatch::Exact(p) => ("path", p.as_str()),
                PathMatch::PathSeparatedPrefix(p) => ("path_separated_prefix", p.as_str()),
                PathMatch::Regex(p) => ("safe_regex", p.as_str()),
                PathMatch::Connect => ("connect_matcher", ""),
            };
            assert_eq!(kind, s(&m["path_kind"]), "{at}");
            if kind != "connect_matcher" {
                assert_eq!(path, s(&m["path"]), "{at}");
            }
            // Envoy's default is case-sensitive.
            assert_eq!(
                r.matcher.case_sensitive,
                m["case_sensitive"].as_bool().unwrap_or(true),
                "{at}"
            );
            assert_eq!(r.decorator.as_deref(), rf["decorator"].as_str(), "{at}");
            let a = &rf["action"];
            assert_eq!(s(&a["kind"]), "route", "{at}");
            let Action::Forward(f) = &r.action else {
                panic!("{at}: {:?}", r.action)
            };
            assert_eq!(
                f.target,
                ClusterTarget::Cluster(s(&a["cluster"]).into()),
                "{at}"
            );
            let want_timeout = match &a["timeout"] {
                Value::Null => Some(Duration::from_secs(15)),
                t if seconds(t).is_zero() => None,
                t => Some(seconds(t)),
            };
            assert_eq!(f.timeout, want_timeout, "{at} timeout");
            match (&a["retry_policy"], &f.retry_policy) {
                (Value::Null, None) => {}
                (p, Some(rp)) => {
                    assert_eq!(rp.retry_on.join(","), s(&p["retry_on"]), "{at}");
                    assert_eq!(
                        u64::from(rp.num_retries),
                        p["num_retries"].as_u64().expect("n"),
                        "{at}"
                    );
                    let codes: Vec<u64> = p["retriable_status_codes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_u64)
                        .collect();
                    assert_eq!(
                        rp.retriable_status_codes
                            .iter()
                            .map(|c| u64::from(*c))
                            .collect::<Vec<_>>(),
                        codes,
                        "{at}"
                    );
                    assert_eq!(
                        rp.host_selection_retry_max_attempts.to_string(),
                        s(&p["host_selection_retry_max_attempts"]),
                        "{at}"
                    );
                    let previous = p["retry_host_predicate"].as_array().is_some_and(|ps| {
                        ps.iter()
                            .any(|x| s(&x["name"]) == "envoy.retry_host_predicates.previous_hosts")
                    });
                    assert_eq!(rp.avoid_previous_hosts, previous, "{at}");
                }
                (p, None) => panic!("{at}: retry policy {p} missing"),
            }
            if let Some(msd) = a["max_stream_duration"].as_object() {
                let zero = |k: &str| msd.get(k).map(seconds).filter(|d| !d.is_zero());
                assert_eq!(f.max_stream_duration, zero("max_stream_duration"), "{at}");
                assert_eq!(
                    f.grpc_timeout_header_max,
                    msd.get("grpc_timeout_header_max").map(seconds),
                    "{at}"
                );
            }
            if let Some(t) = a.get("max_grpc_timeout") {
                assert_eq!(f.grpc_timeout_header_max, Some(seconds(t)), "{at}");
            }
        }
    }
}

#[test]
fn route_tables_reproduce_their_facts() {
    let Some(dir) = conformance_dir() else { return };
    // RDS.
    let rds = facts(&dir, "describe-productpage");
    let tables = resources(&dir, "describe-productpage", "routes");
    assert_eq!(tables.len(), 1);
    let rc = from_json::<RouteProto>(&tables[0])
        .unwrap_or_else(|r| panic!("{r}"))
        .model;
    check_route_table(&rds["route_configs"][0], &rc);
    // The productpage route by path, as a request would meet it.
    let vh = rc
        .virtual_host("productpage.default.svc.cluster.local:9080")
        .expect("*");
    let none = |_: &str| None;
    let req = |path| remora_xds::model::route::RequestParts {
        method: "GET",
        path_and_query: path,
        header: &none,
        values: &|_: &str, _: &mut dyn FnMut(&str) -> bool| false,
    };
    let route = vh.route(&req("/static/app.css")).expect("a route");
    assert!(matches!(&route.matcher.path, PathMatch::Prefix(p) if p == "/static"));
    assert!(vh.route(&req("/nothing")).is_none());
    // Inline, in the listeners the model accepts.
    let authz = facts(&dir, "authz-sidecar");
    let listeners = authz_listeners(&dir);
    let mut checked = 0;
    for fact in authz["route_configs"].as_array().expect("route configs") {
        let from = s(&fact["from"]).trim_start_matches("inline: ");
        let (listener, chain) = from.split_once(' ').expect("listener and chain");
        let Some(l) = listeners.iter().find(|l| l.name == listener) else {
            continue;
        };
        let index: usize = chain
            .trim_start_matches("filter_chains[")
            .trim_end_matches(']')
            .parse()
            .expect("index");
        let ChainKind::Http(h) = &l.filter_chains[index].kind else {
            panic!("{from}: not HTTP")
        };
        let RouteSource::Inline(rc) = &h.routes else {
            panic!("{from}: not inline")
        };
        check_route_table(fact, rc);
        checked += 1;
    }
    assert_eq!(checked, 4, "virtualInbound's four inline tables");
}

#[test]
fn clusters_reproduce_their_facts() {
    let Some(dir) = conformance_dir() else { return };
    let facts = facts(&dir, "describe-productpage");
    let clusters = resources(&dir, "describe-productpage", "clusters");
    for (fact, json) in facts["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .zip(&clusters)
    {
        let c = from_json::<ClusterProto>(json)
            .unwrap_or_else(|r| panic!("{r}"))
            .model;
        let at = c.name.clone();
        assert_eq!(c.name, s(&fact["name"]));
        assert_eq!(s(&fact["discovery"]), "EDS");
        assert_eq!(
            c.discovery,
            Discovery::Eds {
                service_name: s(&fact["eds_service_name"]).into(),
                initial_fetch_timeout: None,
            },
            "{at}"
        );
        assert_eq!(s(&fact["lb_policy"]), "LEAST_REQUEST");
        assert_eq!(
            c.lb_policy,
            LbPolicy::LeastRequest { choice_count: 2 },
            "{at}"
        );
        assert_eq!(c.connect_timeout, seconds(&fact["connect_timeout"]), "{at}");
        let mtls = &fact["istio_mtls"];
        let tls = c.istio_mtls().expect("istio mTLS");
        assert_eq!(tls.sni.as_deref(), mtls["sni"].as_str(), "{at}");
        assert_eq!(tls.alpn, strings(&mtls["alpn"]), "{at}");
        assert_eq!(
            tls.certificate_secret
                .iter()
                .map(|s| s.name())
                .collect::<Vec<_>>(),
            strings(&mtls["certificate_sds"]),
            "{at}"
        );
        assert_eq!(
            tls.validation_secret.as_ref().map(|s| s.name()).as_deref(),
            mtls["validation_sds"].as_str(),
            "{at}"
        );
        let sans: Vec<String> = tls
            .subject_alt_names
            .iter()
            .map(|m| match &m.matcher.kind {
                StringMatch::Exact(x) => x.clone(),
                other => panic!("{at}: {other:?}"),
            })
            .collect();
        let want: Vec<String> = mtls["subject_alt_names"]
            .as_array()
            .expect("sans")
            .iter()
            .map(|m| s(&m["exact"]).to_string())
            .collect();
        assert_eq!(sans, want, "{at}");
        // Endpoints without tlsMode istio get plaintext.
        assert_eq!(
            c.transport_socket_for(None),
            &TransportSocket::Plaintext,
            "{at}"
        );
        let meta = &fact["istio_metadata"];
        assert_eq!(c.istio.subset.as_deref(), meta["subset"].as_str(), "{at}");
        assert_eq!(c.istio.config.as_deref(), meta["config"].as_str(), "{at}");
        assert_eq!(
            c.istio.default_original_port.map(u64::from),
            meta["default_original_port"].as_u64(),
            "{at}"
        );
        let hosts: Vec<&str> = c.istio.services.iter().map(|s| s.host.as_str()).collect();
        assert_eq!(hosts, ["productpage.default.svc.cluster.local"], "{at}");
        assert_eq!(
            c.metadata_exchange.as_ref().map(|m| m.protocol.as_str()),
            Some("istio-peer-exchange"),
            "{at}"
        );
    }
}

#[test]
fn endpoints_reproduce_their_facts() {
    let Some(dir) = conformance_dir() else { return };
    let facts = facts(&dir, "eds-bookinfo");
    let clas = resources(&dir, "eds-bookinfo", "endpoints");
    let fact_list = facts["endpoints"].as_array().expect("endpoints");
    assert_eq!(clas.len(), fact_list.len());
    let mut endpoints = 0;
    let mut istio = 0;
    for (fact, json) in fact_list.iter().zip(&clas) {
        let cla = from_json::<ClaProto>(json)
            .unwrap_or_else(|r| panic!("{r}"))
            .model;
        let at = cla.cluster_name.clone();
        assert_eq!(cla.cluster_name, s(&fact["cluster_name"]));
        assert_eq!(
            u64::from(cla.overprovisioning_factor),
            fact["policy"]["overprovisioning_factor"]
                .as_u64()
                .unwrap_or(140),
            "{at}"
        );
        let localities = fact["localities"].as_array().expect("localities");
        assert_eq!(cla.localities.len(), localities.len(), "{at}");
        for (lf, l) in localities.iter().zip(&cla.localities) {
            assert_eq!(
                u64::from(l.priority),
                lf["priority"].as_u64().expect("priority"),
                "{at}"
            );
            assert_eq!(
                l.weight.map(u64::from),
                lf["load_balancing_weight"].as_u64(),
                "{at}"
            );
            assert_eq!(l.locality.region, s(&lf["locality"]["region"]), "{at}");
            assert_eq!(l.locality.zone, s(&lf["locality"]["zone"]), "{at}");
            let eps = lf["endpoints"].as_array().expect("endpoints");
            assert_eq!(l.endpoints.len(), eps.len(), "{at}");
            for (ef, e) in eps.iter().zip(&l.endpoints) {
                assert_eq!(e.address.to_string(), s(&ef["address"]), "{at}");
                assert_eq!(s(&ef["health_status"]), "HEALTHY");
                assert_eq!(e.health, Health::Healthy, "{at}");
                assert_eq!(
                    u64::from(e.weight),
                    ef["load_balancing_weight"].as_u64().unwrap_or(1),
                    "{at}"
                );
                assert_eq!(e.tls_mode.as_deref(), ef["tls_mode"].as_str(), "{at}");
                let w = &ef["istio"]["workload"];
                let model = e.workload.as_ref().expect("workload metadata");
                assert_eq!(model.name, s(&w["name"]), "{at}");
                assert_eq!(model.namespace, s(&w["namespace"]), "{at}");
                assert_eq!(model.canonical_service, s(&w["canonical_service"]), "{at}");
                assert_eq!(
                    model.canonical_revision,
                    s(&w["canonical_revision"]),
                    "{at}"
                );
                assert_eq!(model.cluster_id, s(&w["cluster_id"]), "{at}");
                endpoints += 1;
                istio += usize::from(e.tls_mode.as_deref() == Some("istio"));
            }
        }
    }
    // The README's counts: 32 endpoints, 8 with tlsMode istio.
    assert_eq!((endpoints, istio), (32, 8));
}

#[test]
fn secrets_reproduce_their_facts() {
    let Some(dir) = conformance_dir() else { return };
    for case in ["sds-istio", "sds-spire"] {
        let facts = facts(&dir, case);
        let secrets = resources(&dir, case, "secrets");
        for (fact, json) in facts["secrets"]
            .as_array()
            .expect("secrets")
            .iter()
            .zip(&secrets)
        {
            let secret = from_json::<SecretProto>(json)
                .unwrap_or_else(|r| panic!("{r}"))
                .model;
            assert_eq!(secret.name, s(&fact["name"]), "{case}");
            match (&secret.kind, s(&fact["kind"])) {
                (
                    SecretKind::TlsCertificate {
                        certificate_chain,
                        private_key,
                    },
                    "tls_certificate",
                ) => {
                    assert_eq!(
                        certificate_chain.len() as u64,
                        fact["certificate_chain"]["bytes"].as_u64().expect("bytes"),
                        "{case}"
                    );
                    assert_eq!(private_key, b"[redacted]", "{case}");
                }
                (
                    SecretKind::ValidationContext {
                        trusted_ca,
                        spiffe_trust_domains,
                    },
                    "validation_context",
                ) => {
                    let ca = &fact["trusted_ca"];
                    assert_eq!(
                        trusted_ca.len() as u64,
                        ca["bytes"].as_u64().unwrap_or(0),
                        "{case}"
                    );
                    let domains: Vec<&str> = spiffe_trust_domains
                        .iter()
                        .map(|(d, _)| d.as_str())
                        .collect();
                    let want: Vec<String> = fact["custom_validator"]["trust_domains"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|d| s(&d["name"]).to_string())
                        .collect();
                    assert_eq!(domains, want, "{case}");
                }
                (model, kind) => panic!("{case}: {kind} read as {model:?}"),
            }
        }
    }
}
