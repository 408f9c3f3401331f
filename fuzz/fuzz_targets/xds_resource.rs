//! The xDS conversion (`remora_xds::convert`): any resource bytes istiod (or a resource file)
//! sends become a model or a refusal (a NACK naming the field), never a panic. The first byte
//! picks the resource type and whether the rest is protobuf (as ADS carries it) or proto3
//! JSON (as `xds_files` and config dumps read it). An accepted resource converts to the same
//! model again from its own encoding.
#![no_main]

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use libfuzzer_sys::fuzz_target;
use remora_xds::convert::{from_bytes, from_json, from_proto, Resource};

fn check<T: Resource>(json: bool, bytes: &[u8]) {
    let converted = if json {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
            return;
        };
        from_json::<T>(&value)
    } else {
        from_bytes::<T>(bytes)
    };
    let Ok(converted) = converted else {
        return;
    };
    let again = from_bytes::<T>(&converted.proto.encode_to_vec())
        .expect("an accepted resource is accepted again from its own encoding");
    assert_eq!(again.model, converted.model);
    let model = from_proto(&converted.proto).expect("an accepted proto converts");
    assert_eq!(model, converted.model);
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let json = selector & 0x80 != 0;
    match selector & 0x7f {
        0 => check::<Listener>(json, bytes),
        1 => check::<Cluster>(json, bytes),
        2 => check::<RouteConfiguration>(json, bytes),
        3 => check::<ClusterLoadAssignment>(json, bytes),
        4 => check::<Secret>(json, bytes),
        5 => check::<TypedExtensionConfig>(json, bytes),
        _ => {}
    }
});
