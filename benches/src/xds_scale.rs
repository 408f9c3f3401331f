//! istiod-shaped xDS resources for N services, for the config-scale scenario
//! (`scenarios/config_scale.rs`): what a sidecar in a mesh of N services is sent.
//!
//! The shapes follow istiod's outbound generation (pilot/pkg/networking/core: the cluster
//! builder, the outbound listeners and the outbound RDS tables) and the real istiod output in
//! shared/conformance/xds/resources, restricted to upstream Envoy types so that Envoy 1.40 from
//! PyPI accepts them as well (no `istio.stats`, `istio.metadata_exchange` or `istio.alpn`
//! filters: those are Istio's own Envoy build). Per service `svc-<i>.ns.svc.cluster.local`:
//!
//! - an EDS cluster `outbound|<port>||<host>`: LEAST_REQUEST, 10 s connect timeout, circuit
//!   breakers at istiod's defaults (every limit 2^32-1, remaining tracked), Istio's cluster
//!   metadata, a `tlsMode-istio` transport socket match (SNI `outbound_.<port>_._.<host>`, the
//!   service account's SPIFFE ID as the only (typed URI) SAN, ALPN `istio-peer-exchange`/`istio`, SDS
//!   secrets `default` and `ROOTCA`) and a plaintext default;
//! - a ClusterLoadAssignment with 2 or 3 endpoints labelled `tlsMode: istio`;
//! - HTTP services (nine in ten, port 8080): a virtual host in the `8080` route table, with
//!   the short, namespaced and full names and the VIP, each also with `:8080`;
//! - TCP services (one in ten, port 3306): a `<vip>_3306` listener with `tcp_proxy`.
//!
//! Plus what every sidecar gets: `PassthroughCluster`, `BlackHoleCluster`, the `0.0.0.0_8080`
//! listener (HTTP connection manager with RDS, Passthrough default chain) and
//! `virtualOutbound`.
//!
//! Remora and Envoy get the same resources except where each must be told where the rest comes
//! from ([`Sources`]): Remora reads everything as ADS would deliver it; Envoy, with no control
//! plane, reads files, and Envoy's file EDS takes one file (and one inotify instance, 128 per
//! user by default) per cluster, so its clusters are `STATIC` with the same assignment inline.

use serde_json::{json, Value};
use std::path::PathBuf;

/// The namespace of every generated service.
pub const NAMESPACE: &str = "ns";
/// The port of the HTTP services, and so the name of their route table.
pub const HTTP_PORT: u16 = 8080;
/// The port of the TCP services.
pub const TCP_PORT: u16 = 3306;
/// One service in this many is TCP (and gets its own VIP listener).
pub const TCP_EVERY: usize = 10;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const CLA: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";

/// Where the resources say the rest of the configuration comes from.
#[derive(Debug, Clone)]
pub enum Sources {
    /// As istiod writes them: ADS for EDS and RDS, Istio's `sds-grpc` for secrets.
    Ads,
    /// Envoy without a control plane: the route table and the two secrets from these files,
    /// endpoints inline in `STATIC` clusters.
    Files {
        routes: PathBuf,
        cert: PathBuf,
        root: PathBuf,
    },
}

/// One generated service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub index: usize,
    pub host: String,
    pub vip: String,
    pub port: u16,
    pub http: bool,
}

impl Service {
    pub fn new(index: usize) -> Service {
        let http = index % TCP_EVERY != TCP_EVERY - 1;
        Service {
            index,
            host: format!("svc-{index}.{NAMESPACE}.svc.cluster.local"),
            // 10.96.0.0/12 is Kubernetes' default service range; 250 per /24 keeps .0 and .255 out.
            vip: format!(
                "10.{}.{}.{}",
                96 + index / 62_500,
                (index / 250) % 250,
                index % 250 + 1
            ),
            port: if http { HTTP_PORT } else { TCP_PORT },
            http,
        }
    }

    pub fn cluster_name(&self) -> String {
        format!("outbound|{}||{}", self.port, self.host)
    }

    fn short(&self) -> String {
        format!("svc-{}", self.index)
    }
}

/// The four resource lists, each as Envoy's JSON.
#[derive(Debug, Clone, Default)]
pub struct Resources {
    pub clusters: Vec<Value>,
    pub endpoints: Vec<Value>,
    pub listeners: Vec<Value>,
    pub routes: Vec<Value>,
}

/// Every resource for `n` services; `outbound_port` is virtualOutbound's port (15001 in a pod;
/// a free loopback port here, so that runs do not collide with a sidecar on the machine).
pub fn generate(n: usize, outbound_port: u16, sources: &Sources) -> Resources {
    let services: Vec<Service> = (0..n).map(Service::new).collect();
    let mut r = Resources::default();
    for s in &services {
        let assignment = endpoints(s, 0);
        r.clusters.push(cluster(s, sources, &assignment));
        r.endpoints.push(assignment);
        if !s.http {
            r.listeners.push(tcp_listener(s));
        }
    }
    r.clusters.push(passthrough_cluster());
    r.clusters.push(json!({"@type": CLUSTER, "name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}));
    r.listeners.push(http_listener(sources));
    r.listeners.push(virtual_outbound(outbound_port));
    r.routes.push(route_table(&services));
    r
}

/// The `generation`-th version of a service's endpoints: 2 or 3 pod IPs from 10.128.0.0/9,
/// the first one renumbered by each generation (an endpoint change, as a pod's restart).
pub fn endpoints(s: &Service, generation: u32) -> Value {
    let count = 2 + s.index % 2;
    let lb: Vec<Value> = (0..count)
        .map(|k| {
            let mut n = (s.index * 3 + k) as u64;
            if k == 0 {
                // Into the third octet's upper half: no other pod of up to 21,845 services has it.
                n += u64::from(generation) << 22;
            }
            let ip = format!("10.{}.{}.{}", 128 + (n >> 16) % 128, (n >> 8) & 255, n & 255);
            json!({
                "endpoint": {"address": {"socket_address": {"address": ip, "port_value": s.port}}},
                "health_status": "HEALTHY",
                "metadata": {"filter_metadata": {
                    "envoy.transport_socket_match": {"tlsMode": "istio"},
                    "istio": {"workload": format!("{}-v1;{NAMESPACE};{};v1;Kubernetes", s.short(), s.short())}
                }},
                "load_balancing_weight": 1
            })
        })
        .collect();
    json!({
        "@type": CLA,
        "cluster_name": s.cluster_name(),
        "endpoints": [{"locality": {}, "lb_endpoints": lb, "load_balancing_weight": count}]
    })
}

fn unlimited_circuit_breakers() -> Value {
    let max = u32::MAX;
    json!({"thresholds": [{"max_connections": max, "max_pending_requests": max,
        "max_requests": max, "max_retries": max, "track_remaining": true}]})
}

/// A secret reference as istiod writes it, or from a file of Envoy's.
fn sds(name: &str, sources: &Sources) -> Value {
    let config = match sources {
        Sources::Ads => json!({
            "api_config_source": {"api_type": "GRPC", "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
                "set_node_on_first_message_only": true, "transport_api_version": "V3"},
            "initial_fetch_timeout": "0s", "resource_api_version": "V3"
        }),
        Sources::Files { cert, root, .. } => {
            let path = if name == "ROOTCA" { root } else { cert };
            json!({"path_config_source": {"path": path}, "resource_api_version": "V3"})
        }
    };
    json!({"name": name, "sds_config": config})
}

fn cluster(s: &Service, sources: &Sources, assignment: &Value) -> Value {
    let name = s.cluster_name();
    let tls = json!({
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": {
            "tls_params": {"tls_minimum_protocol_version": "TLSv1_2", "tls_maximum_protocol_version": "TLSv1_3"},
            "alpn_protocols": ["istio-peer-exchange", "istio"],
            "tls_certificate_sds_secret_configs": [sds("default", sources)],
            "combined_validation_context": {
                // Typed SANs, as istiod writes them now (the untyped list is deprecated, and
                // Envoy logs a warning per cluster for it).
                "default_validation_context": {"match_typed_subject_alt_names": [{"san_type": "URI",
                    "matcher": {"exact": format!("spiffe://cluster.local/ns/{NAMESPACE}/sa/{}", s.short())}}
                ]},
                "validation_context_sds_secret_config": sds("ROOTCA", sources)
            }
        },
        "sni": format!("outbound_.{}_._.{}", s.port, s.host)
    });
    let mut c = json!({
        "@type": CLUSTER,
        "name": name,
        "type": "EDS",
        "eds_cluster_config": {
            "eds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
            "service_name": name
        },
        "connect_timeout": "10s",
        "lb_policy": "LEAST_REQUEST",
        "circuit_breakers": unlimited_circuit_breakers(),
        "metadata": {"filter_metadata": {"istio": {
            "default_original_port": s.port,
            "services": [{"host": s.host, "name": s.short(), "namespace": NAMESPACE}]
        }}},
        "transport_socket_matches": [
            {"name": "tlsMode-istio", "match": {"tlsMode": "istio"},
             "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": tls}},
            {"name": "tlsMode-disabled", "match": {},
             "transport_socket": {"name": "envoy.transport_sockets.raw_buffer", "typed_config":
                {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"}}}
        ]
    });
    if s.http {
        // A port named http: istiod makes the upstream protocol explicit.
        c["typed_extension_protocol_options"] = json!({"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http_protocol_options": {}}
        }});
    }
    if let Sources::Files { .. } = sources {
        let map = c.as_object_mut().expect("an object");
        map.remove("eds_cluster_config");
        map.insert("type".into(), json!("STATIC"));
        let mut inline = assignment.clone();
        if let Some(a) = inline.as_object_mut() {
            a.remove("@type");
        }
        map.insert("load_assignment".into(), inline);
    }
    c
}

fn passthrough_cluster() -> Value {
    json!({
        "@type": CLUSTER, "name": "PassthroughCluster", "type": "ORIGINAL_DST", "connect_timeout": "10s",
        "lb_policy": "CLUSTER_PROVIDED", "circuit_breakers": unlimited_circuit_breakers(),
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "common_http_protocol_options": {"idle_timeout": "3600s"},
            "use_downstream_protocol_config": {"http_protocol_options": {}, "http2_protocol_options": {}}
        }}
    })
}

fn tcp_proxy(cluster: &str) -> Value {
    json!({"name": "envoy.filters.network.tcp_proxy",
           "typed_config": {"@type": TCP_PROXY, "stat_prefix": cluster, "cluster": cluster}})
}

fn tcp_listener(s: &Service) -> Value {
    let cluster = s.cluster_name();
    json!({
        "@type": LISTENER,
        "name": format!("{}_{}", s.vip, s.port),
        "address": {"socket_address": {"address": s.vip, "port_value": s.port}},
        "filter_chains": [{"filters": [tcp_proxy(&cluster)], "name": cluster}],
        "traffic_direction": "OUTBOUND",
        "bind_to_port": false
    })
}

fn http_listener(sources: &Sources) -> Value {
    let config_source = match sources {
        Sources::Ads => {
            json!({"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"})
        }
        Sources::Files { routes, .. } => {
            json!({"path_config_source": {"path": routes}, "resource_api_version": "V3"})
        }
    };
    let filter = |name: &str, ty: &str| json!({"name": name, "typed_config": {"@type": format!("type.googleapis.com/{ty}")}});
    let hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": format!("outbound_0.0.0.0_{HTTP_PORT}"),
        "rds": {"config_source": config_source, "route_config_name": HTTP_PORT.to_string()},
        "http_filters": [
            filter("envoy.filters.http.fault", "envoy.extensions.filters.http.fault.v3.HTTPFault"),
            filter("envoy.filters.http.cors", "envoy.extensions.filters.http.cors.v3.Cors"),
            filter("envoy.filters.http.router", "envoy.extensions.filters.http.router.v3.Router")
        ],
        "use_remote_address": false,
        "upgrade_configs": [{"upgrade_type": "websocket"}],
        "stream_idle_timeout": "0s",
        "normalize_path": true,
        "request_id_extension": {"typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig",
            "use_request_id_for_trace_sampling": true}},
        "path_with_escaped_slashes_action": "KEEP_UNCHANGED"
    });
    json!({
        "@type": LISTENER,
        "name": format!("0.0.0.0_{HTTP_PORT}"),
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": HTTP_PORT}},
        "filter_chains": [{
            "filter_chain_match": {"transport_protocol": "raw_buffer", "application_protocols": ["http/1.1", "h2c"]},
            "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]
        }],
        "listener_filters": [
            filter("envoy.filters.listener.tls_inspector", "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"),
            filter("envoy.filters.listener.http_inspector", "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector")
        ],
        "listener_filters_timeout": "0s",
        "continue_on_listener_filters_timeout": true,
        "traffic_direction": "OUTBOUND",
        "default_filter_chain": {"filters": [tcp_proxy("PassthroughCluster")], "name": "PassthroughFilterChain"},
        "bind_to_port": false
    })
}

fn virtual_outbound(port: u16) -> Value {
    json!({
        "@type": LISTENER,
        "name": "virtualOutbound",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [
            {"filter_chain_match": {"destination_port": port}, "filters": [tcp_proxy("BlackHoleCluster")],
             "name": "virtualOutbound-blackhole"},
            {"filters": [tcp_proxy("PassthroughCluster")], "name": "virtualOutbound-catchall-tcp"}
        ],
        "use_original_dst": true,
        "traffic_direction": "OUTBOUND"
    })
}

/// The `8080` table: a virtual host per HTTP service, then istiod's `allow_any` catch-all.
fn route_table(services: &[Service]) -> Value {
    let retry = json!({
        "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
        "num_retries": 2,
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
        "host_selection_retry_max_attempts": "5",
        "retriable_status_codes": [503]
    });
    // istiod's replacement for the deprecated `max_grpc_timeout: 0s` (which Envoy warns about
    // once per route): no limit from grpc-timeout headers.
    let no_grpc_limit = json!({"max_stream_duration": "0s", "grpc_timeout_header_max": "0s"});
    let mut hosts: Vec<Value> = services
        .iter()
        .filter(|s| s.http)
        .map(|s| {
            let names = [
                s.host.clone(),
                s.short(),
                format!("{}.{NAMESPACE}.svc", s.short()),
                format!("{}.{NAMESPACE}", s.short()),
                s.vip.clone(),
            ];
            let domains: Vec<String> = names
                .iter()
                .flat_map(|n| [n.clone(), format!("{n}:{}", s.port)])
                .collect();
            json!({
                "name": format!("{}:{}", s.host, s.port),
                "domains": domains,
                "routes": [{
                    "name": "default",
                    "match": {"prefix": "/"},
                    "route": {"cluster": s.cluster_name(), "timeout": "0s", "retry_policy": retry,
                              "max_stream_duration": no_grpc_limit},
                    "decorator": {"operation": format!("{}:{}/*", s.host, s.port)}
                }],
                "include_request_attempt_count": true
            })
        })
        .collect();
    hosts.push(json!({
        "name": "allow_any",
        "domains": ["*"],
        "routes": [{"name": "allow_any", "match": {"prefix": "/"},
                    "route": {"cluster": "PassthroughCluster", "timeout": "0s", "max_stream_duration": no_grpc_limit}}],
        "include_request_attempt_count": true
    }));
    json!({
        "@type": ROUTE,
        "name": HTTP_PORT.to_string(),
        "virtual_hosts": hosts,
        "validate_clusters": false,
        "max_direct_response_body_size_bytes": 1_048_576,
        "ignore_port_in_host_matching": true
    })
}

/// Writes the four files of Remora's `xds.resources_dir` into `dir`.
pub fn write_remora_dir(dir: &std::path::Path, r: &Resources) -> std::io::Result<()> {
    for (name, list) in [
        ("clusters", &r.clusters),
        ("endpoints", &r.endpoints),
        ("listeners", &r.listeners),
        ("routes", &r.routes),
    ] {
        let body = serde_json::to_vec(list)?;
        std::fs::write(dir.join(format!("{name}.json")), body)?;
    }
    Ok(())
}

/// Envoy's file-based xDS wraps resources in a DiscoveryResponse.
pub fn discovery_response(resources: &[Value], version: u32) -> Value {
    json!({"version_info": version.to_string(), "resources": resources})
}

#[cfg(test)]
#[path = "xds_scale_tests.rs"]
mod tests;
