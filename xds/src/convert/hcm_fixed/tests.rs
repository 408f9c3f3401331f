use super::*;
use serde_json::{json, Value};

/// istiod's inbound connection manager fields, with `patch` merged over them.
fn hcm_with(patch: Value) -> hcm::HttpConnectionManager {
    let mut base = json!({
        "stat_prefix": "inbound_0.0.0.0_8080",
        "stream_idle_timeout": "0s",
        "use_remote_address": false,
        "forward_client_cert_details": "APPEND_FORWARD",
        "set_current_client_cert_details": {"subject": true, "dns": true, "uri": true},
        "upgrade_configs": [{"upgrade_type": "websocket"}]
    });
    for (k, v) in patch.as_object().expect("object") {
        if v.is_null() {
            base.as_object_mut().expect("object").remove(k);
        } else {
            base[k] = v.clone();
        }
    }
    crate::json::from_json_typed(&base, super::super::http::HCM).expect("reads")
}

fn refused_at(patch: Value) -> String {
    check(&hcm_with(patch), "hcm")
        .expect_err("refused")
        .path
        .clone()
}

#[test]
fn istiods_inbound_and_outbound_values_are_accepted() {
    assert_eq!(check(&hcm_with(json!({})), "hcm"), Ok(()));
    // Outbound: no client-cert fields (SANITIZE), false remote address unset.
    let outbound = hcm_with(json!({
        "forward_client_cert_details": null,
        "set_current_client_cert_details": null,
        "use_remote_address": null,
        "upgrade_configs": [{"upgrade_type": "WebSocket"}],
        "http2_protocol_options": {}
    }));
    assert_eq!(check(&outbound, "hcm"), Ok(()));
}

#[test]
fn stream_idle_timeout_other_than_zero_is_refused() {
    assert_eq!(
        refused_at(json!({"stream_idle_timeout": "30s"})),
        "hcm.stream_idle_timeout"
    );
    assert_eq!(
        refused_at(json!({"stream_idle_timeout": "0.5s"})),
        "hcm.stream_idle_timeout"
    );
    // Unset: the documented difference kept for hand-written resources.
    assert_eq!(
        check(&hcm_with(json!({"stream_idle_timeout": null})), "hcm"),
        Ok(())
    );
}

#[test]
fn use_remote_address_true_is_refused() {
    assert_eq!(
        refused_at(json!({"use_remote_address": true})),
        "hcm.use_remote_address"
    );
}

#[test]
fn client_cert_forwarding_other_than_remoras_is_refused() {
    for mode in ["FORWARD_ONLY", "SANITIZE_SET", "ALWAYS_FORWARD_ONLY"] {
        assert_eq!(
            refused_at(json!({"forward_client_cert_details": mode})),
            "hcm.forward_client_cert_details",
            "{mode}"
        );
    }
    for details in [
        json!({"subject": true, "dns": true, "uri": true, "cert": true}),
        json!({"subject": true, "dns": true, "uri": true, "chain": true}),
        json!({"uri": true}),
        json!({}),
    ] {
        assert_eq!(
            refused_at(json!({"set_current_client_cert_details": details})),
            "hcm.set_current_client_cert_details",
            "{details}"
        );
    }
    // SANITIZE writes nothing, so asking for details with it is refused too.
    assert_eq!(
        refused_at(json!({"forward_client_cert_details": "SANITIZE"})),
        "hcm.set_current_client_cert_details"
    );
}

#[test]
fn connect_and_an_upgrades_own_filters_are_refused_other_upgrades_taken() {
    for upgrades in [
        json!([]),
        json!([{"upgrade_type": "websocket", "enabled": false}]),
        json!([{"upgrade_type": "websocket"}, {"upgrade_type": "spdy/3"}]),
    ] {
        let upgrades = json!({"upgrade_configs": upgrades});
        assert_eq!(
            check(&hcm_with(upgrades.clone()), "hcm"),
            Ok(()),
            "{upgrades}"
        );
    }
    for (upgrades, at) in [
        (
            json!([{"upgrade_type": "CONNECT"}]),
            "hcm.upgrade_configs[0].upgrade_type",
        ),
        (
            json!([{"upgrade_type": "websocket"}, {"upgrade_type": "connect"}]),
            "hcm.upgrade_configs[1].upgrade_type",
        ),
        (
            json!([{"upgrade_type": "websocket", "filters": [{"name": "envoy.filters.http.router"}]}]),
            "hcm.upgrade_configs[0].filters",
        ),
    ] {
        assert_eq!(
            refused_at(json!({"upgrade_configs": upgrades})),
            at,
            "{upgrades}"
        );
    }
}

#[test]
fn extended_connect_is_refused_and_a_stream_limit_accepted() {
    assert_eq!(
        refused_at(json!({"http2_protocol_options": {"allow_connect": true}})),
        "hcm.http2_protocol_options.allow_connect"
    );
    // istiod's ProxyConfig connectionSettings: honoured by the downstream codec.
    let limited = hcm_with(json!({
        "http2_protocol_options": {"max_concurrent_streams": 100},
        "route_config": {"name": "r"},
        "http_filters": [{
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
        }]
    }));
    assert_eq!(check(&limited, "hcm"), Ok(()));
    let chain = super::super::http::connection_manager(&limited, "hcm").expect("converted");
    assert_eq!(chain.http2_max_concurrent_streams, Some(100));
    // Outside Envoy's range (1 to 2^31 - 1): refused, named.
    for n in [0u64, 1 << 31] {
        let mut bad = limited.clone();
        if let Some(h2) = bad.http2_protocol_options.as_mut() {
            h2.max_concurrent_streams =
                Some(envoy_types::pb::google::protobuf::UInt32Value { value: n as u32 });
        }
        let e = super::super::http::connection_manager(&bad, "hcm").expect_err("refused");
        assert_eq!(
            e.path, "hcm.http2_protocol_options.max_concurrent_streams",
            "{n}"
        );
    }
}

#[test]
fn a_codec_other_than_auto_is_refused() {
    let convert = |codec: &str| {
        let mut m = hcm_with(json!({"codec_type": codec}));
        m.route_specifier = Some(hcm::http_connection_manager::RouteSpecifier::RouteConfig(
            Default::default(),
        ));
        m.http_filters = vec![crate::json::from_json_typed(
            &json!({"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}),
            "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter",
        )
        .expect("reads")];
        super::super::http::connection_manager(&m, "hcm")
    };
    assert!(convert("AUTO").is_ok());
    for codec in ["HTTP1", "HTTP2"] {
        assert_eq!(
            convert(codec).expect_err("refused").path,
            "hcm.codec_type",
            "{codec}"
        );
    }
}
