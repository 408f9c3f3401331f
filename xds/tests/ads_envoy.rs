//! Differential: real Envoy 1.40 and Remora's ADS client, each connected (plaintext h2c on
//! loopback) to the same scripted control plane and given the same responses, must send the
//! same requests: types, versions, nonces, interest, `initial_resource_versions`, and NACKs
//! with the same `error_detail`. Remora's test sink refuses the resources Envoy refused, with
//! Envoy's own reasons, so the NACK messages must match byte for byte.
//!
//! Envoy is `$ENVOY_BIN`, or the binary `scripts/install-envoy` caches (running it if needed).
//! Without one the test is skipped with its reason printed; under `CI=true` it fails.

mod ads_support;
mod envoy_support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ads_support::*;
use envoy_support::envoy_binary;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    Resource as DeltaResource,
};
use envoy_types::pb::google::protobuf::Any;
use prost_reflect::DynamicMessage;
use remora_xds::ads::Mode;
use remora_xds::sink::type_url::{CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET};
use serde_json::json;

/// How long a client must stay silent for a step's requests to count as complete.
const QUIET: Duration = Duration::from_secs(1);

/// Envoy running with an ADS bootstrap pointing at `port`; killed on drop.
struct Envoy {
    child: Child,
    dir: tempfile::TempDir,
}

impl Envoy {
    fn start(binary: &PathBuf, port: u16, api_type: &str) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let config = dir.path().join("envoy.json");
        let bootstrap = json!({
            "node": {"id": node().id, "cluster": node().cluster},
            "dynamic_resources": {
                "ads_config": {
                    "api_type": api_type,
                    "transport_api_version": "V3",
                    "set_node_on_first_message_only": true,
                    "grpc_services": [{"envoy_grpc": {"cluster_name": "xds"}}]
                },
                "cds_config": {"ads": {}, "resource_api_version": "V3"},
                "lds_config": {"ads": {}, "resource_api_version": "V3"}
            },
            "static_resources": {"clusters": [{
                "name": "xds",
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}}
                    }
                },
                "load_assignment": {"cluster_name": "xds", "endpoints": [{"lb_endpoints": [{
                    "endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}
                }]}]}
            }]}
        });
        std::fs::write(&config, bootstrap.to_string()).expect("write the bootstrap");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("log file");
        let child = Command::new(binary)
            .arg("-c")
            .arg(&config)
            .args([
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "warning",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start envoy");
        Envoy { child, dir }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failed test shows what Envoy said.
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("envoy.log"))
                .unwrap_or_else(|e| format!("(no log: {e})"));
            eprintln!("Envoy's log:\n{log}");
        }
    }
}

/// A resource from its proto3 JSON, serialised.
fn encode(message: &str, value: serde_json::Value) -> Vec<u8> {
    let pool = remora_xds::descriptors::pool();
    let descriptor = pool
        .get_message_by_name(message)
        .unwrap_or_else(|| panic!("no descriptor for {message}"));
    let dynamic = DynamicMessage::deserialize(descriptor, value).expect("valid JSON");
    prost::Message::encode_to_vec(&dynamic)
}

fn ads() -> serde_json::Value {
    json!({"ads": {}, "resource_api_version": "V3"})
}

/// An extension config Envoy has no factory for in that place: refused when the resource is
/// built (a per-resource refusal), not when it is decoded.
fn foreign_config() -> serde_json::Value {
    json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "not-a-socket"})
}

fn cluster(name: &str) -> Vec<u8> {
    let mut cluster = json!({
        "name": name,
        "type": "EDS",
        "connect_timeout": "1s",
        "eds_cluster_config": {"eds_config": ads()}
    });
    if name.starts_with("bad") {
        cluster["transport_socket"] = json!({"name": "x", "typed_config": foreign_config()});
    }
    // A DestinationRule's `credentialName` roots, which istiod serves over ADS.
    if name.starts_with("tls-") {
        cluster["transport_socket"] = json!({"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {"validation_context_sds_secret_config":
                {"name": format!("secret-{name}"), "sds_config": ads()}}}});
    }
    encode("envoy.config.cluster.v3.Cluster", cluster)
}

fn listener(name: &str) -> Vec<u8> {
    let filter = if name.starts_with("bad") {
        json!({"name": "x", "typed_config": foreign_config()})
    } else {
        json!({
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name,
                "rds": {"route_config_name": format!("routes-{name}"), "config_source": ads()},
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                }]
            }
        })
    };
    encode(
        "envoy.config.listener.v3.Listener",
        json!({
            "name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "filter_chains": [{"filters": [filter]}]
        }),
    )
}

fn resource_body(type_url: &str, name: &str) -> Vec<u8> {
    match type_url {
        CLUSTER => cluster(name),
        LISTENER => listener(name),
        ROUTE => encode(
            "envoy.config.route.v3.RouteConfiguration",
            json!({"name": name, "virtual_hosts": [{"name": "all", "domains": ["*"]}]}),
        ),
        SECRET => {
            let ca = rcgen::generate_simple_self_signed(vec!["ca.example.com".to_owned()])
                .expect("a certificate")
                .cert
                .pem();
            encode(
                "envoy.extensions.transport_sockets.tls.v3.Secret",
                json!({"name": name, "validation_context": {"trusted_ca": {"inline_string": ca}}}),
            )
        }
        _ => encode(
            "envoy.config.endpoint.v3.ClusterLoadAssignment",
            json!({"cluster_name": name}),
        ),
    }
}

/// A resource in its `Any`; one named `wrong-type` claims to be a route table.
fn typed(type_url: &str, name: &str) -> Any {
    Any {
        type_url: match name {
            "wrong-type" => ROUTE.to_owned(),
            _ => type_url.to_owned(),
        },
        value: resource_body(type_url, name),
    }
}

/// One step of the script: a response (or the stream dropped), then the requests it caused.
enum Step {
    Respond(
        &'static str,
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    ),
    Reconnect,
}

/// Type, version and nonce, the node's presence, interest, versions held, and the NACK.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Shape {
    type_url: String,
    version_info: String,
    nonce: String,
    node: bool,
    subscribe: Vec<String>,
    unsubscribe: Vec<String>,
    initial_versions: BTreeMap<String, String>,
    error: Option<(i32, String)>,
}

fn sorted(mut names: Vec<String>) -> Vec<String> {
    names.sort();
    names
}

impl From<DeltaDiscoveryRequest> for Shape {
    fn from(r: DeltaDiscoveryRequest) -> Self {
        Shape {
            type_url: r.type_url,
            version_info: String::new(),
            nonce: r.response_nonce,
            node: r.node.is_some(),
            subscribe: sorted(r.resource_names_subscribe),
            unsubscribe: sorted(r.resource_names_unsubscribe),
            initial_versions: r.initial_resource_versions.into_iter().collect(),
            error: r.error_detail.map(|e| (e.code, without_echo(e.message))),
        }
    }
}

/// Envoy appends the whole response as text to a type-mismatch NACK; Remora does not.
fn without_echo(mut message: String) -> String {
    for echo in [" in DeltaDiscoveryResponse ", " in DiscoveryResponse "] {
        if let Some(at) = message.find(echo) {
            message.truncate(at);
        }
    }
    message
}

impl From<DiscoveryRequest> for Shape {
    fn from(r: DiscoveryRequest) -> Self {
        Shape {
            type_url: r.type_url,
            version_info: r.version_info,
            nonce: r.response_nonce,
            node: r.node.is_some(),
            subscribe: sorted(r.resource_names),
            unsubscribe: Vec::new(),
            initial_versions: BTreeMap::new(),
            error: r.error_detail.map(|e| (e.code, without_echo(e.message))),
        }
    }
}

/// Requests until the client has been quiet for [`QUIET`].
async fn drain<Req: Into<Shape>, Resp>(stream: &mut StreamHandle<Req, Resp>) -> Vec<Shape> {
    let mut shapes = Vec::new();
    while let Some(request) = stream.request_within(QUIET).await {
        shapes.push(request.into());
    }
    shapes
}

const SCRIPT: &[Step] = &[
    Step::Respond(CLUSTER, "n1", &["a", "bad1", "bad2"], &[]),
    Step::Respond(ENDPOINT, "n2", &["a"], &[]),
    Step::Respond(LISTENER, "n3", &["l1", "bad-l1", "bad-l2"], &[]),
    Step::Respond(ROUTE, "n4", &["routes-l1"], &[]),
    // Faults of the whole response (or, in state of the world, of one resource).
    Step::Respond(CLUSTER, "n4-type", &["a", "wrong-type"], &[]),
    Step::Respond(CLUSTER, "n4-dup", &["a", "a"], &[]),
    Step::Respond(CLUSTER, "n5", &["b"], &["a"]),
    // While b warms, its CDS answer waits; so does the answer to a faulty CDS push.
    Step::Respond(CLUSTER, "n5-type", &["b", "wrong-type"], &[]),
    Step::Respond(ENDPOINT, "n6", &["b"], &[]),
    Step::Reconnect,
    // Every cluster gone: the EDS interest empties, and a new stream asks for none.
    Step::Respond(CLUSTER, "n7", &[], &["b"]),
    Step::Reconnect,
];

/// Secrets istiod serves itself (a DestinationRule's `credentialName`): Envoy asks for a
/// cluster's once its endpoints have arrived (the cluster initialises), before the EDS ACK;
/// start-up (LDS) and a new cluster's CDS answer wait for them; a new stream asks for them
/// after the endpoints.
const SECRETS_SCRIPT: &[Step] = &[
    Step::Respond(CLUSTER, "n1", &["tls-a"], &[]),
    Step::Respond(ENDPOINT, "n2", &["tls-a"], &[]),
    Step::Respond(SECRET, "n3", &["secret-tls-a"], &[]),
    Step::Respond(CLUSTER, "n4", &["tls-a", "tls-b"], &[]),
    Step::Respond(ENDPOINT, "n5", &["tls-a", "tls-b"], &[]),
    Step::Respond(SECRET, "n6", &["secret-tls-a", "secret-tls-b"], &[]),
    Step::Reconnect,
];

async fn run_delta(server: &mut Server, script: &[Step]) -> Vec<Vec<Shape>> {
    let mut stream = server.delta_stream().await;
    let mut steps = vec![drain(&mut stream).await];
    for step in script {
        match step {
            Step::Respond(type_url, nonce, names, removed) => {
                let resources = names
                    .iter()
                    .map(|name| DeltaResource {
                        name: (*name).to_owned(),
                        version: format!("{nonce}-{name}"),
                        resource: Some(typed(type_url, name)),
                        ..DeltaResource::default()
                    })
                    .collect();
                stream.respond(DeltaDiscoveryResponse {
                    system_version_info: format!("sys-{nonce}"),
                    resources,
                    type_url: (*type_url).to_owned(),
                    removed_resources: removed.iter().map(|n| (*n).to_owned()).collect(),
                    nonce: (*nonce).to_owned(),
                    ..DeltaDiscoveryResponse::default()
                });
            }
            Step::Reconnect => {
                drop(stream);
                stream = server.delta_stream().await;
            }
        }
        steps.push(drain(&mut stream).await);
    }
    steps
}

async fn run_sotw(server: &mut Server, script: &[Step]) -> Vec<Vec<Shape>> {
    let mut stream = server.sotw_stream().await;
    let mut steps = vec![drain(&mut stream).await];
    for step in script {
        match step {
            Step::Respond(type_url, nonce, names, _) => {
                stream.respond(DiscoveryResponse {
                    version_info: format!("v-{nonce}"),
                    resources: names.iter().map(|name| typed(type_url, name)).collect(),
                    type_url: (*type_url).to_owned(),
                    nonce: (*nonce).to_owned(),
                    ..DiscoveryResponse::default()
                });
            }
            Step::Reconnect => {
                drop(stream);
                stream = server.sotw_stream().await;
            }
        }
        steps.push(drain(&mut stream).await);
    }
    steps
}

/// Envoy's reason for refusing `name`, read from its NACK messages.
fn envoy_reason(steps: &[Vec<Shape>], name: &str) -> String {
    let marker = format!("{name}: ");
    for shape in steps.iter().flatten() {
        if let Some((_, message)) = &shape.error {
            if let Some(at) = message.find(&marker) {
                let rest = &message[at + marker.len()..];
                // The reason runs to the next entry: ", " (CDS) or "\n" (LDS) before a name.
                let end = ["\n", ", bad"]
                    .iter()
                    .filter_map(|sep| rest.find(sep))
                    .min()
                    .unwrap_or(rest.len());
                return rest[..end].to_owned();
            }
        }
    }
    panic!("Envoy did not refuse {name}: {steps:#?}");
}

async fn differential(mode: Mode, script: &[Step]) {
    let Some(binary) = envoy_binary() else {
        return;
    };
    let api_type = match mode {
        Mode::Delta => "DELTA_GRPC",
        Mode::StateOfTheWorld => "GRPC",
    };

    let mut server = Server::start().await;
    let envoy_steps = {
        let _envoy = Envoy::start(&binary, server.addr.port(), api_type);
        run(mode, &mut server, script).await
    };

    let mut server = Server::start().await;
    let remora = start_client(&server, mode, Duration::from_millis(500));
    if std::ptr::eq(script, SCRIPT) {
        for name in ["bad1", "bad2", "bad-l1", "bad-l2"] {
            remora.sink.refuse(name, &envoy_reason(&envoy_steps, name));
        }
    }
    let remora_steps = run(mode, &mut server, script).await;

    for (index, (envoy, ours)) in envoy_steps.iter().zip(&remora_steps).enumerate() {
        assert_eq!(
            envoy, ours,
            "step {index} differs\nEnvoy:  {envoy:#?}\nRemora: {ours:#?}"
        );
    }
    assert_eq!(envoy_steps.len(), remora_steps.len());
}

async fn run(mode: Mode, server: &mut Server, script: &[Step]) -> Vec<Vec<Shape>> {
    match mode {
        Mode::Delta => run_delta(server, script).await,
        Mode::StateOfTheWorld => run_sotw(server, script).await,
    }
}

#[tokio::test]
async fn delta_requests_match_envoy() {
    differential(Mode::Delta, SCRIPT).await;
}

#[tokio::test]
async fn state_of_the_world_requests_match_envoy() {
    differential(Mode::StateOfTheWorld, SCRIPT).await;
}

#[tokio::test]
async fn delta_secret_requests_match_envoy() {
    differential(Mode::Delta, SECRETS_SCRIPT).await;
}

#[tokio::test]
async fn state_of_the_world_secret_requests_match_envoy() {
    differential(Mode::StateOfTheWorld, SECRETS_SCRIPT).await;
}
