//! The protobuf descriptors of every message Remora may meet in a resource: Envoy's, as
//! envoy-types generated them (copied by build.rs), and the few that only Istio's Envoy build
//! knows but istiod sends to every sidecar (`stats.PluginConfig`, metadata exchange, the ALPN
//! override, peer metadata, `istio_authn`, and HBONE's `connect_authority`, `connect_baggage`
//! and `set_internal_dst_address`) plus the `TypedStruct` wrappers, and the name table istiod
//! sends pilot-agent over the same stream (NDS, `istio.networking.nds.v1.NameTable`).
//!
//! The Istio ones are built here as `FileDescriptorProto`s rather than compiled from `.proto`
//! text with protox: they are six small messages, and building them in code costs no build-time
//! dependency on a machine where every crate compiled is shared time. Their field numbers are
//! those of istio/proxy's and cncf/xds' definitions; only the fields Remora gives a meaning to
//! (or knows to be no-ops) are declared, so a resource that sets any other is refused as an
//! unknown field instead of being read half-way.

use prost_reflect::DescriptorPool;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto,
    FileDescriptorProto, MessageOptions,
};
use std::sync::OnceLock;

/// Envoy's descriptor set, as envoy-types ships it.
const ENVOY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy.bin"));

/// The pool every reader and writer of resources shares; built once.
pub fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    // Built from constants compiled into the binary, never from input: a failure is a bug
    // that the unit tests below catch, so there is nothing for a caller to handle.
    #[allow(clippy::expect_used)]
    POOL.get_or_init(|| build().expect("the built-in descriptors are consistent"))
}

/// Decode Envoy's set and add the Istio-only files.
fn build() -> Result<DescriptorPool, prost_reflect::DescriptorError> {
    let mut pool = DescriptorPool::decode(ENVOY)?;
    for file in extra_files() {
        let declares_known = file.message_type.iter().any(|m| {
            let name = format!("{}.{}", file.package(), m.name());
            pool.get_message_by_name(&name).is_some()
        });
        // envoy-types may one day ship one of these itself; its definition then wins.
        if !declares_known {
            pool.add_file_descriptor_proto(file)?;
        }
    }
    Ok(pool)
}

fn field(name: &str, number: i32, ty: Type, type_name: Option<&str>) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.into()),
        number: Some(number),
        label: Some(Label::Optional as i32),
        r#type: Some(ty as i32),
        type_name: type_name.map(Into::into),
        json_name: Some(json_name(name)),
        ..Default::default()
    }
}

fn repeated(mut f: FieldDescriptorProto) -> FieldDescriptorProto {
    f.label = Some(Label::Repeated as i32);
    f
}

/// protoc's lowerCamelCase JSON name, which proto3 JSON readers also accept.
fn json_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn message(name: &str, field: Vec<FieldDescriptorProto>) -> DescriptorProto {
    DescriptorProto {
        name: Some(name.into()),
        field,
        ..Default::default()
    }
}

fn enumeration(name: &str, values: &[(&str, i32)]) -> EnumDescriptorProto {
    EnumDescriptorProto {
        name: Some(name.into()),
        value: values
            .iter()
            .map(|(n, v)| EnumValueDescriptorProto {
                name: Some((*n).into()),
                number: Some(*v),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn file(
    name: &str,
    package: &str,
    deps: &[&str],
    messages: Vec<DescriptorProto>,
    enums: Vec<EnumDescriptorProto>,
) -> FileDescriptorProto {
    FileDescriptorProto {
        name: Some(name.into()),
        package: Some(package.into()),
        dependency: deps.iter().map(|d| (*d).into()).collect(),
        message_type: messages,
        enum_type: enums,
        syntax: Some("proto3".into()),
        ..Default::default()
    }
}

/// istio/istio's `pkg/dns/proto/nds.proto`: `map<string, NameInfo> table = 1` (a map is a
/// repeated entry message marked `map_entry`) and `NameInfo name_info = 2`.
fn name_table() -> DescriptorProto {
    const INFO: &str = ".istio.networking.nds.v1.NameTable.NameInfo";
    let mut entry = message(
        "TableEntry",
        vec![
            field("key", 1, Type::String, None),
            field("value", 2, Type::Message, Some(INFO)),
        ],
    );
    entry.options = Some(MessageOptions {
        map_entry: Some(true),
        ..Default::default()
    });
    let mut table = message(
        "NameTable",
        vec![
            repeated(field(
                "table",
                1,
                Type::Message,
                Some(".istio.networking.nds.v1.NameTable.TableEntry"),
            )),
            field("name_info", 2, Type::Message, Some(INFO)),
        ],
    );
    table.nested_type = vec![
        message(
            "NameInfo",
            vec![
                repeated(field("ips", 1, Type::String, None)),
                field("registry", 2, Type::String, None),
                field("shortname", 3, Type::String, None),
                field("namespace", 4, Type::String, None),
                repeated(field("alt_hosts", 5, Type::String, None)),
            ],
        ),
        entry,
    ];
    table
}

const STRUCT: &str = "google/protobuf/struct.proto";
const DURATION: &str = "google/protobuf/duration.proto";

fn extra_files() -> Vec<FileDescriptorProto> {
    let typed_struct = |package: &str| {
        file(
            &format!("remora/{package}/typed_struct.proto"),
            package,
            &[STRUCT],
            vec![message(
                "TypedStruct",
                vec![
                    field("type_url", 1, Type::String, None),
                    field("value", 2, Type::Message, Some(".google.protobuf.Struct")),
                ],
            )],
            vec![],
        )
    };
    let mut peer_metadata = message(
        "Config",
        vec![
            repeated(field(
                "downstream_discovery",
                1,
                Type::Message,
                Some(".io.istio.http.peer_metadata.Config.DiscoveryMethod"),
            )),
            repeated(field(
                "upstream_discovery",
                2,
                Type::Message,
                Some(".io.istio.http.peer_metadata.Config.DiscoveryMethod"),
            )),
            repeated(field(
                "downstream_propagation",
                3,
                Type::Message,
                Some(".io.istio.http.peer_metadata.Config.PropagationMethod"),
            )),
            repeated(field(
                "upstream_propagation",
                4,
                Type::Message,
                Some(".io.istio.http.peer_metadata.Config.PropagationMethod"),
            )),
            field("shared_with_upstream", 5, Type::Bool, None),
            repeated(field("additional_labels", 6, Type::String, None)),
        ],
    );
    let headers = ".io.istio.http.peer_metadata.Config.IstioHeaders";
    peer_metadata.nested_type = vec![
        message("Baggage", vec![]),
        message("WorkloadDiscovery", vec![]),
        message(
            "IstioHeaders",
            vec![field("skip_external_clusters", 1, Type::Bool, None)],
        ),
        // Both are oneofs in Istio's definition; at most one member set is what istiod
        // writes, and the converter reads whichever is.
        message(
            "DiscoveryMethod",
            vec![
                field(
                    "baggage",
                    1,
                    Type::Message,
                    Some(".io.istio.http.peer_metadata.Config.Baggage"),
                ),
                field(
                    "workload_discovery",
                    2,
                    Type::Message,
                    Some(".io.istio.http.peer_metadata.Config.WorkloadDiscovery"),
                ),
                field("istio_headers", 3, Type::Message, Some(headers)),
            ],
        ),
        message(
            "PropagationMethod",
            vec![field("istio_headers", 1, Type::Message, Some(headers))],
        ),
    ];
    let mut alpn = message(
        "FilterConfig",
        vec![repeated(field(
            "alpn_override",
            1,
            Type::Message,
            Some(".istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig.AlpnOverride"),
        ))],
    );
    alpn.nested_type = vec![message(
        "AlpnOverride",
        vec![
            field(
                "upstream_protocol",
                1,
                Type::Enum,
                Some(".istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig.Protocol"),
            ),
            repeated(field("alpn_override", 2, Type::String, None)),
        ],
    )];
    alpn.enum_type = vec![enumeration(
        "Protocol",
        &[("HTTP10", 0), ("HTTP11", 1), ("HTTP2", 2)],
    )];
    vec![
        typed_struct("udpa.type.v1"),
        typed_struct("xds.type.v3"),
        file(
            "remora/istio/stats.proto",
            "stats",
            &[DURATION],
            vec![message(
                "PluginConfig",
                vec![
                    field("disable_host_header_fallback", 6, Type::Bool, None),
                    field(
                        "tcp_reporting_duration",
                        7,
                        Type::Message,
                        Some(".google.protobuf.Duration"),
                    ),
                    field("reporter", 10, Type::Enum, Some(".stats.Reporter")),
                ],
            )],
            vec![enumeration(
                "Reporter",
                &[("UNSPECIFIED", 0), ("SERVER_GATEWAY", 1)],
            )],
        ),
        file(
            "remora/istio/metadata_exchange.proto",
            "envoy.tcp.metadataexchange.config",
            &[],
            vec![message(
                "MetadataExchange",
                vec![
                    field("protocol", 1, Type::String, None),
                    field("enable_discovery", 2, Type::Bool, None),
                    repeated(field("additional_labels", 3, Type::String, None)),
                ],
            )],
            vec![],
        ),
        file(
            "remora/istio/alpn.proto",
            "istio.envoy.config.filter.http.alpn.v2alpha1",
            &[],
            vec![alpn],
            vec![],
        ),
        file(
            "remora/istio/peer_metadata.proto",
            "io.istio.http.peer_metadata",
            &[],
            vec![peer_metadata],
            vec![],
        ),
        // HBONE's (listeners Remora refuses whole): known so that they read, in a TypedStruct
        // or bare, and are refused for what they are rather than as unknown types.
        file(
            "remora/istio/connect_authority.proto",
            "io.istio.http.connect_authority",
            &[],
            vec![message(
                "Config",
                vec![
                    field("enabled", 1, Type::Bool, None),
                    field("port", 2, Type::Uint32, None),
                ],
            )],
            vec![],
        ),
        file(
            "remora/istio/connect_baggage.proto",
            "io.istio.http.connect_baggage",
            &[],
            vec![message("Config", vec![])],
            vec![],
        ),
        file(
            "remora/istio/set_internal_dst_address.proto",
            "istio.set_internal_dst_address.v1",
            &[],
            vec![message("Config", vec![])],
            vec![],
        ),
        file(
            "remora/istio/nds.proto",
            "istio.networking.nds.v1",
            &[],
            vec![name_table()],
            vec![],
        ),
        file(
            "remora/istio/authn.proto",
            "io.istio.network.authn",
            &[],
            vec![message(
                "Config",
                vec![field("shared", 1, Type::Bool, None)],
            )],
            vec![],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_and_istio_messages_are_known() {
        let pool = build().expect("the descriptors are consistent");
        for name in [
            "envoy.config.listener.v3.Listener",
            "envoy.config.cluster.v3.Cluster",
            "envoy.config.route.v3.RouteConfiguration",
            "envoy.config.endpoint.v3.ClusterLoadAssignment",
            "udpa.type.v1.TypedStruct",
            "xds.type.v3.TypedStruct",
            "stats.PluginConfig",
            "envoy.tcp.metadataexchange.config.MetadataExchange",
            "istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig",
            "io.istio.http.peer_metadata.Config",
            "io.istio.network.authn.Config",
            "io.istio.http.connect_authority.Config",
            "io.istio.http.connect_baggage.Config",
            "istio.set_internal_dst_address.v1.Config",
            "istio.networking.nds.v1.NameTable",
        ] {
            assert!(pool.get_message_by_name(name).is_some(), "{name}");
        }
    }

    #[test]
    fn istio_field_numbers_are_istios() {
        let pool = pool();
        let stats = pool
            .get_message_by_name("stats.PluginConfig")
            .expect("stats");
        let f = stats
            .get_field_by_name("disable_host_header_fallback")
            .expect("field");
        assert_eq!(f.number(), 6);
        let alpn = pool
            .get_message_by_name(
                "istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig.AlpnOverride",
            )
            .expect("alpn override");
        assert_eq!(
            alpn.get_field_by_name("alpn_override").map(|f| f.number()),
            Some(2)
        );
        assert_eq!(json_name("upstream_protocol"), "upstreamProtocol");
    }
}
