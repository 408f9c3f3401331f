//! The same xDS resources for Remora and for a real Envoy: Remora reads them from a directory
//! (`xds.resources_dir`), Envoy from a bootstrap whose static listeners and clusters are
//! those resources, with each `ads` source they name (a listener's RDS, a cluster's EDS)
//! pointed at a file holding that route table or load assignment (Envoy's filesystem
//! subscription). Nothing else of a resource changes, so both proxies route by one config.
//!
//! The SDS secrets a DestinationRule's TLS names (`file-cert:CHAIN~KEY`, `file-root:PATH`),
//! which pilot-agent's SDS server reads from the pod's files and serves to Envoy, are served
//! the same way: each becomes a file holding the `Secret` pilot-agent would send (the chain and
//! key, or the roots, read from those paths), and the reference reads it from there.

use serde_json::{json, Value};
use std::path::Path;

const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const ENDPOINT_TYPE: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const SECRET_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// A set of resources, each a JSON array as Envoy prints them.
#[derive(Debug, Clone)]
pub struct Resources {
    pub listeners: Value,
    pub clusters: Value,
    pub routes: Value,
    pub endpoints: Value,
}

impl Resources {
    /// Write Remora's files (`listeners.json`, …) into `dir`, each whole at once: the
    /// directory is polled, and a file written in place could be read half-written.
    pub fn write_for_remora(&self, dir: &Path) {
        for (file, value) in [
            ("listeners.json", &self.listeners),
            ("routes.json", &self.routes),
            ("clusters.json", &self.clusters),
            ("endpoints.json", &self.endpoints),
        ] {
            let tmp = dir.join(format!(".{file}.tmp"));
            std::fs::write(&tmp, value.to_string()).expect("write a resource file");
            std::fs::rename(&tmp, dir.join(file)).expect("move a resource file in place");
        }
    }

    /// Write the load assignments an Envoy of [`Resources::envoy_bootstrap`] reads from `dir`,
    /// as EDS version `version` (to update them: Envoy reads a file again when it is moved in).
    pub fn write_envoy_endpoints(&self, dir: &Path, version: &str) {
        for cla in items(&self.endpoints) {
            let name = cla["cluster_name"].as_str().unwrap_or_default();
            write_discovery(
                &dir.join(format!("eds-{}.json", file_name(name))),
                ENDPOINT_TYPE,
                cla,
                version,
            );
        }
    }

    /// A bootstrap for a sidecar Envoy holding these resources, its admin on
    /// 127.0.0.1:`admin_port`; the route tables and load assignments go into files in `dir`.
    pub fn envoy_bootstrap(&self, dir: &Path, admin_port: u16) -> String {
        for route in items(&self.routes) {
            let name = route["name"].as_str().unwrap_or_default();
            write_discovery(
                &dir.join(format!("rds-{}.json", file_name(name))),
                ROUTE_TYPE,
                route,
                "1",
            );
        }
        self.write_envoy_endpoints(dir, "1");
        let listeners: Vec<Value> = items(&self.listeners)
            .map(|l| {
                let mut l = without_type(l);
                point_rds_at_files(&mut l, dir);
                l
            })
            .collect();
        let clusters: Vec<Value> = items(&self.clusters)
            .map(|c| envoy_cluster(c, dir))
            .collect();
        json!({
            "node": {"id": "sidecar~10.0.0.1~client.test~test.svc.cluster.local", "cluster": "client.test"},
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
            "static_resources": {"listeners": listeners, "clusters": clusters},
            "layered_runtime": istio_runtime()
        })
        .to_string()
    }
}

/// A cluster as an Envoy of [`Resources::envoy_bootstrap`] holds it: its load assignments and
/// secrets from files in `dir`.
fn envoy_cluster(c: &Value, dir: &Path) -> Value {
    let mut c = without_type(c);
    let name = c["eds_cluster_config"]["service_name"]
        .as_str()
        .or(c["name"].as_str())
        .unwrap_or_default()
        .to_string();
    if let Some(eds) = c.pointer_mut("/eds_cluster_config/eds_config") {
        *eds = file_source(&dir.join(format!("eds-{}.json", file_name(&name))));
    }
    serve_file_secrets(&mut c, dir);
    c
}

/// The runtime pilot-agent's bootstrap gives Envoy in every Istio sidecar (its static layer,
/// then an admin layer): the oracle is Envoy as Istio runs it. Of these only the fragment
/// switch changes what the tests send (a `#fragment` in a path is stripped, not answered 400).
pub fn istio_runtime() -> Value {
    json!({"layers": [
        {"name": "global config", "static_layer": {
            "envoy.reloadable_features.http_reject_path_with_fragment": false,
            "envoy.reloadable_features.no_extension_lookup_by_name": false,
            "overload.global_downstream_max_connections": 2147483647,
            "re2.max_program_size.error_level": 32768}},
        {"name": "admin", "admin_layer": {}}
    ]})
}

fn items(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

/// A resource name as a file name (istiod's cluster names hold `|`).
fn file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A static resource is a message, not an `Any`: no `@type`.
fn without_type(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("@type");
    }
    v
}

fn file_source(path: &Path) -> Value {
    json!({"path_config_source": {"path": path.to_string_lossy()}, "resource_api_version": "V3"})
}

/// Every HTTP connection manager's `rds` in `v` reads its table from a file in `dir`.
fn point_rds_at_files(v: &mut Value, dir: &Path) {
    match v {
        Value::Object(o) => {
            if let Some(rds) = o.get_mut("rds") {
                let name = rds["route_config_name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                rds["config_source"] =
                    file_source(&dir.join(format!("rds-{}.json", file_name(&name))));
            }
            o.values_mut().for_each(|v| point_rds_at_files(v, dir));
        }
        Value::Array(a) => a.iter_mut().for_each(|v| point_rds_at_files(v, dir)),
        _ => {}
    }
}

/// The `Secret` pilot-agent's SDS server makes of a file secret's name
/// (`SdsCertificateConfigFromResourceName`), its data read from the files, as pilot-agent
/// reads them (here by Envoy itself, from the same paths); `None` for any other name.
fn file_secret(name: &str) -> Option<Value> {
    if let Some(files) = name.strip_prefix("file-cert:") {
        let (chain, key) = files.split_once('~')?;
        return Some(json!({"name": name, "tls_certificate": {
            "certificate_chain": {"filename": chain}, "private_key": {"filename": key}}}));
    }
    let roots = name.strip_prefix("file-root:")?;
    Some(json!({"name": name, "validation_context": {"trusted_ca": {"filename": roots}}}))
}

/// Every SDS reference in `v` to a file secret reads it from a file in `dir`.
fn serve_file_secrets(v: &mut Value, dir: &Path) {
    match v {
        Value::Object(o) => {
            let secret = o
                .get("name")
                .and_then(Value::as_str)
                .filter(|_| o.contains_key("sds_config"))
                .and_then(file_secret);
            if let Some(secret) = secret {
                let name = secret["name"].as_str().unwrap_or_default().to_string();
                let path = dir.join(format!("sds-{}.json", file_name(&name)));
                write_discovery(&path, SECRET_TYPE, &secret, "1");
                o.insert("sds_config".into(), file_source(&path));
            }
            o.values_mut().for_each(|v| serve_file_secrets(v, dir));
        }
        Value::Array(a) => a.iter_mut().for_each(|v| serve_file_secrets(v, dir)),
        _ => {}
    }
}

/// Every SDS reference in `bootstrap` to the workload's own secrets, `default` (its
/// certificate) and `ROOTCA` (the mesh roots), which pilot-agent serves Envoy from the
/// certificate it holds, reads them from Istio's files in `cert_dir` instead (through a
/// discovery file in `dir`): Envoy then terminates and originates mesh TLS with the same
/// certificate a Remora given `tls.cert_dir: cert_dir` holds.
pub fn serve_workload_secrets(bootstrap: &mut Value, cert_dir: &Path, dir: &Path) {
    let file = |name: &str| cert_dir.join(name).to_string_lossy().into_owned();
    let secrets = [
        json!({"name": "default", "tls_certificate": {
            "certificate_chain": {"filename": file("cert-chain.pem")},
            "private_key": {"filename": file("key.pem")}}}),
        json!({"name": "ROOTCA", "validation_context": {
            "trusted_ca": {"filename": file("root-cert.pem")}}}),
    ];
    for secret in &secrets {
        let name = secret["name"].as_str().unwrap_or_default();
        write_discovery(
            &dir.join(format!("sds-{name}.json")),
            SECRET_TYPE,
            secret,
            "1",
        );
    }
    point_secrets_at_files(bootstrap, dir);
}

fn point_secrets_at_files(v: &mut Value, dir: &Path) {
    match v {
        Value::Object(o) => {
            let name = o.get("name").and_then(Value::as_str).unwrap_or_default();
            if o.contains_key("sds_config") && matches!(name, "default" | "ROOTCA") {
                let path = dir.join(format!("sds-{name}.json"));
                o.insert("sds_config".into(), file_source(&path));
            }
            o.values_mut().for_each(|v| point_secrets_at_files(v, dir));
        }
        Value::Array(a) => a.iter_mut().for_each(|v| point_secrets_at_files(v, dir)),
        _ => {}
    }
}

const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

/// A discovery response of every one of `resources` (typed `type_url`) at `version`, moved
/// into place whole at `path`: Envoy's filesystem subscription watches for that.
fn write_all(path: &Path, type_url: &str, resources: impl Iterator<Item = Value>, version: &str) {
    let typed: Vec<Value> = resources
        .map(|mut r| {
            if let Some(o) = r.as_object_mut() {
                o.insert("@type".into(), Value::String(type_url.into()));
            }
            r
        })
        .collect();
    let response = json!({"version_info": version, "type_url": type_url, "resources": typed});
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, response.to_string())
        .unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("move {}: {e}", path.display()));
}

/// A discovery response of one resource at `version`, as [`write_all`] writes it.
fn write_discovery(path: &Path, type_url: &str, resource: &Value, version: &str) {
    write_all(
        path,
        type_url,
        std::iter::once(without_type(resource)),
        version,
    );
}

impl Resources {
    /// Remora as `net`'s sidecar, reading these from files, ready, having refused none of them
    /// (a refusal would make any comparison with Envoy meaningless).
    pub fn start_remora<'n>(&self, net: &'n crate::PodNet) -> crate::Remora<'n> {
        let dir = net.binary().make_dir("xds");
        self.write_for_remora(&dir);
        let remora = net
            .remora()
            .config(&format!("xds:\n  resources_dir: {}\n", dir.display()))
            .start_ready();
        let refused = remora.stderr();
        assert!(
            !refused.contains("refused an xDS resource"),
            "Remora refused resources Envoy takes:\n{refused}"
        );
        remora
    }

    /// [`Resources::start_remora`] with `extra` appended to its config file; the directory
    /// its resources are read from, to write updates into ([`Resources::write_for_remora`]).
    pub fn start_remora_with<'n>(
        &self,
        net: &'n crate::PodNet,
        extra: &str,
    ) -> (crate::Remora<'n>, std::path::PathBuf) {
        let dir = net.binary().make_dir("xds");
        self.write_for_remora(&dir);
        let remora = net
            .remora()
            .config(&format!(
                "xds:\n  resources_dir: {}\n{extra}",
                dir.display()
            ))
            .start_ready();
        let refused = remora.stderr();
        assert!(
            !refused.contains("refused an xDS resource"),
            "Remora refused resources Envoy takes:\n{refused}"
        );
        (remora, dir)
    }

    /// A real Envoy (`binary`) as `net`'s sidecar whose listeners come from a file (LDS over
    /// Envoy's filesystem subscription, so they can be updated:
    /// [`Resources::write_envoy_listeners`]), the rest as [`Resources::start_envoy`] has it,
    /// with more command-line flags (`--drain-time-s`); the directory of its files.
    pub fn start_envoy_lds<'n>(
        &self,
        net: &'n crate::PodNet,
        binary: &Path,
        args: &[&str],
    ) -> (crate::envoy::Envoy<'n>, std::path::PathBuf) {
        self.start_envoy_from_files(net, binary, args, false)
    }

    /// [`Resources::start_envoy_lds`] with the clusters also from a file (CDS over Envoy's
    /// filesystem subscription: [`Resources::write_envoy_clusters`]), and no flags more.
    pub fn start_envoy_dynamic<'n>(
        &self,
        net: &'n crate::PodNet,
        binary: &Path,
    ) -> (crate::envoy::Envoy<'n>, std::path::PathBuf) {
        self.start_envoy_from_files(net, binary, &[], true)
    }

    /// A real Envoy whose listeners, and with `cds` its clusters, come from files in the
    /// directory returned; the rest is in its bootstrap.
    fn start_envoy_from_files<'n>(
        &self,
        net: &'n crate::PodNet,
        binary: &Path,
        args: &[&str],
        cds: bool,
    ) -> (crate::envoy::Envoy<'n>, std::path::PathBuf) {
        let dir = net.binary().make_dir("envoy-xds");
        let in_bootstrap = Resources {
            listeners: json!([]),
            clusters: if cds {
                json!([])
            } else {
                self.clusters.clone()
            },
            ..self.clone()
        };
        let mut bootstrap: Value =
            serde_json::from_str(&in_bootstrap.envoy_bootstrap(&dir, crate::envoy::ADMIN_PORT))
                .expect("the bootstrap is JSON");
        let mut dynamic = json!({"lds_config": file_source(&dir.join("lds.json"))});
        // The bootstrap's writing wrote the route tables and load assignments.
        if cds {
            self.write_envoy_clusters(&dir, "1");
            dynamic["cds_config"] = file_source(&dir.join("cds.json"));
        }
        self.write_envoy_listeners(&dir, "1");
        bootstrap["dynamic_resources"] = dynamic;
        let envoy = crate::envoy::Envoy::start_sidecar_with_args(
            &net.pod,
            binary,
            net.binary(),
            &bootstrap.to_string(),
            args,
        );
        (envoy, dir)
    }

    /// Write the clusters for [`Resources::start_envoy_dynamic`]'s Envoy as CDS version
    /// `version`, moved into place whole.
    pub fn write_envoy_clusters(&self, dir: &Path, version: &str) {
        let clusters = items(&self.clusters).map(|c| envoy_cluster(c, dir));
        write_all(&dir.join("cds.json"), CLUSTER_TYPE, clusters, version);
    }

    /// Write the listeners for [`Resources::start_envoy_lds`]'s Envoy as LDS version
    /// `version`, moved into place whole (Envoy watches for the file being moved in).
    pub fn write_envoy_listeners(&self, dir: &Path, version: &str) {
        let listeners = items(&self.listeners).map(|l| {
            let mut l = without_type(l);
            point_rds_at_files(&mut l, dir);
            l
        });
        write_all(&dir.join("lds.json"), LISTENER_TYPE, listeners, version);
    }

    /// A real Envoy (`binary`) as `net`'s sidecar, with the same resources.
    pub fn start_envoy<'n>(
        &self,
        net: &'n crate::PodNet,
        binary: &Path,
    ) -> crate::envoy::Envoy<'n> {
        self.start_envoy_with(net, binary, |_| ())
    }

    /// [`Resources::start_envoy`] with the bootstrap as `edit` leaves it (`stats_config`).
    pub fn start_envoy_with<'n>(
        &self,
        net: &'n crate::PodNet,
        binary: &Path,
        edit: impl FnOnce(&mut Value),
    ) -> crate::envoy::Envoy<'n> {
        let dir = net.binary().make_dir("envoy-xds");
        let mut bootstrap: Value =
            serde_json::from_str(&self.envoy_bootstrap(&dir, crate::envoy::ADMIN_PORT))
                .expect("the bootstrap is JSON");
        edit(&mut bootstrap);
        crate::envoy::Envoy::start_sidecar(&net.pod, binary, net.binary(), &bootstrap.to_string())
    }
}

/// Envoy's binary and two pods, one for each proxy, or `None` (the test skipped) when this
/// machine cannot run them.
pub fn nets_or_skip() -> Option<(std::path::PathBuf, (crate::PodNet, crate::PodNet))> {
    let binary = crate::envoy::binary_or_skip()?;
    let remora = crate::PodNet::create_or_skip()?;
    let envoy = crate::PodNet::create_or_skip()?;
    Some((binary, (remora, envoy)))
}

/// pilot-agent's bootstrap `stats_config` (`running_golden.json`): Envoy's own tags off, Istio's
/// on, so that `/stats/prometheus` names and labels Envoy's statistics as an Istio sidecar's
/// Envoy does. Its `stats_matcher` (which statistics exist at all) is left out, so that every
/// statistic can be compared: an operator's `proxyStatsMatcher` brings them in.
pub fn istio_stats_config(bootstrap: &mut Value) {
    bootstrap["stats_config"] = json!({"use_all_default_tags": false, "stats_tags": [
        {"tag_name": "cluster_name", "regex": "^cluster(\\.(.+);)"},
        {"tag_name": "http_conn_manager_prefix", "regex": "^http\\.(((?:[_.[:digit:]\\w]*|[_\\[\\]aAbBcCdDeEfF[:digit:]\\w\\:]*));\\.)"},
        {"tag_name": "thread_name", "regex": "^server(\\.(.+))\\.watchdog"},
        {"tag_name": "tcp_prefix", "regex": "^tcp\\.((.*?)\\.)\\w+?$"},
        {"tag_name": "response_code", "regex": "_rq(_(\\d{3}))$"},
        {"tag_name": "response_code_class", "regex": "_rq(_(\\dxx))$"},
        {"tag_name": "http_conn_manager_listener_prefix", "regex": "^listener(?=\\.).*?\\.http\\.(((?:[_.[:digit:]]*|[_\\[\\]aAbBcCdDeEfF[:digit:]]*))\\.)"},
        {"tag_name": "listener_address", "regex": "^listener\\.(((?:[_.[:digit:]]*|[_\\[\\]aAbBcCdDeEfF[:digit:]]*))\\.)"},
        {"tag_name": "mongo_prefix", "regex": "^mongo\\.(.+?)\\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$"},
        {"tag_name": "cache", "regex": "(cache\\.(.+?)\\.)"},
        {"tag_name": "component", "regex": "(component\\.(.+?)\\.)"},
        {"tag_name": "tag", "regex": "(tag\\.(.+?);\\.)"},
        {"tag_name": "wasm_filter", "regex": "(wasm_filter\\.(.+?)\\.)"},
        {"tag_name": "authz_enforce_result", "regex": "rbac(\\.(allowed|denied))"},
        {"tag_name": "authz_dry_run_action", "regex": "(\\.istio_dry_run_(allow|deny)_)"},
        {"tag_name": "authz_dry_run_result", "regex": "(\\.shadow_(allowed|denied))"}
    ]});
}

/// Istio's default access-log text format (`meshConfig.accessLogFormat` unset), as istiod
/// writes it inline for the file logger: both proxies write it in the differential tests.
pub const ISTIO_TEXT_FORMAT: &str = concat!(
    "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" ",
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% ",
    "\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% ",
    "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" ",
    "\"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% ",
    "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% ",
    "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n",
);

/// Istio's default retry policy, as istiod writes it on every HTTP route.
pub fn istio_retry_policy() -> Value {
    json!({
        "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
        "num_retries": 2,
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
        "host_selection_retry_max_attempts": "5"
    })
}
