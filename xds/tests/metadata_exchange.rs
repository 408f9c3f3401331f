//! Both forms of Istio's metadata exchange that istiod has sent are accepted and mean the same
//! to the model: the Wasm null-VM plugin and bare `MetadataExchange` (in the conformance set),
//! and today's `TypedStruct` network filter and `peer_metadata` HTTP filter (fixtures here).

use remora_xds::convert::from_json;
use remora_xds::model::listener::{
    ChainKind, HttpFilter, MetadataExchange, MetadataExchangeForm, NetworkFilter, PeerDiscovery,
    RouteSource,
};
use remora_xds::model::route::Action;
use serde_json::Value;
use std::path::PathBuf;

type ListenerProto = envoy_types::pb::envoy::config::listener::v3::Listener;

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture JSON")
}

#[test]
fn typed_struct_network_filter_and_peer_metadata_in_a_typed_struct() {
    let l = from_json::<ListenerProto>(&fixture("metadata-exchange-typed-struct.json"))
        .unwrap_or_else(|r| panic!("{r}"))
        .model;
    let chain = &l.filter_chains[0];
    assert_eq!(
        chain.filters,
        vec![
            NetworkFilter::IstioAuthn { shared: true },
            NetworkFilter::MetadataExchange(MetadataExchange {
                protocol: "istio-peer-exchange".into(),
                enable_discovery: true,
                additional_labels: vec![],
            })
        ]
    );
    let ChainKind::Http(http) = &chain.kind else {
        panic!("HTTP chain")
    };
    let HttpFilter::MetadataExchange(MetadataExchangeForm::PeerMetadata(pm)) =
        &http.http_filters[0]
    else {
        panic!("{:?}", http.http_filters[0])
    };
    assert_eq!(
        pm.downstream_discovery,
        [
            PeerDiscovery::IstioHeaders,
            PeerDiscovery::WorkloadDiscovery
        ]
    );
    assert!(pm.downstream_propagation);
    assert!(!pm.upstream_propagation);
    assert!(pm.shared_with_upstream);
}

#[test]
fn bare_peer_metadata_and_typed_previous_hosts() {
    let l = from_json::<ListenerProto>(&fixture("metadata-exchange-peer-metadata.json"))
        .unwrap_or_else(|r| panic!("{r}"))
        .model;
    let ChainKind::Http(http) = &l.filter_chains[0].kind else {
        panic!("HTTP chain")
    };
    let HttpFilter::MetadataExchange(MetadataExchangeForm::PeerMetadata(pm)) =
        &http.http_filters[0]
    else {
        panic!("{:?}", http.http_filters[0])
    };
    assert_eq!(
        pm.upstream_discovery,
        [
            PeerDiscovery::IstioHeaders,
            PeerDiscovery::WorkloadDiscovery
        ]
    );
    assert!(pm.upstream_propagation);
    let RouteSource::Inline(rc) = &http.routes else {
        panic!("inline routes")
    };
    assert!(rc.ignore_port_in_host_matching);
    let vh = rc
        .virtual_host("reviews:9080")
        .expect("reviews by host without port");
    let Action::Forward(f) = &vh.routes[0].action else {
        panic!("forward")
    };
    let retry = f.retry_policy.as_ref().expect("retry policy");
    assert!(retry.avoid_previous_hosts);
    assert_eq!(retry.num_retries, 2);
    assert_eq!(f.timeout, None, "0s is no timeout");
}

#[test]
fn the_older_wasm_form_is_the_same_exchange() {
    // The conformance set's form, in small: the null-VM Wasm plugin.
    let mut l = fixture("metadata-exchange-peer-metadata.json");
    let first = "/filter_chains/0/filters/0/typed_config/http_filters/0";
    *l.pointer_mut(first).expect("filter") = serde_json::json!({
        "name": "istio.metadata_exchange",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "vm_config": {"runtime": "envoy.wasm.runtime.null", "code": {"local": {"inline_string": "envoy.wasm.metadata_exchange"}}},
                "configuration": {"@type": "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange"}
            }
        }
    });
    let model = from_json::<ListenerProto>(&l)
        .unwrap_or_else(|r| panic!("{r}"))
        .model;
    let ChainKind::Http(http) = &model.filter_chains[0].kind else {
        panic!("HTTP chain")
    };
    assert_eq!(
        http.http_filters[0],
        HttpFilter::MetadataExchange(MetadataExchangeForm::Wasm)
    );
    // Any other null-VM plugin is a Wasm filter Remora does not run.
    *l.pointer_mut(&format!(
        "{first}/typed_config/config/vm_config/code/local/inline_string"
    ))
    .expect("plugin") = "envoy.wasm.stats".into();
    let refusal = from_json::<ListenerProto>(&l).expect_err("refused");
    assert!(refusal.reason.contains("envoy.wasm.stats"), "{refusal}");
    assert_eq!(
        refusal.path,
        "filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.vm_config"
    );
}

#[test]
fn unknown_fields_in_istio_types_are_refused() {
    let mut l = fixture("metadata-exchange-typed-struct.json");
    l["filter_chains"][0]["filters"][1]["typed_config"]["value"]["additional_labels"] =
        serde_json::json!(["role"]);
    from_json::<ListenerProto>(&l).unwrap_or_else(|r| panic!("additional_labels is declared: {r}"));
    l["filter_chains"][0]["filters"][1]["typed_config"]["value"]["max_peer_cache_size"] = 10.into();
    let refusal = from_json::<ListenerProto>(&l).expect_err("refused");
    assert!(
        refusal.to_string().contains("max_peer_cache_size"),
        "{refusal}"
    );
    assert_eq!(
        refusal.type_url.as_deref(),
        Some("type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange")
    );
}
