//! The admin pages that mirror Envoy's: their paths, query parameters and output shapes.

use super::{json, text, AdminRequest, AdminState, Body};
use crate::metrics::{ServerState, StatKind};
use crate::proxy::Route;
use crate::Direction;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

/// `/stats`: `name: value` lines sorted by name; `?format=json`, `?filter=REGEX`, `?usedonly`.
pub(super) fn stats(state: &AdminState, req: &AdminRequest) -> Response<Body> {
    let filter = match req.param("filter").filter(|f| !f.is_empty()) {
        Some(f) => match regex::Regex::new(f) {
            Ok(re) => Some(re),
            Err(e) => return text(StatusCode::BAD_REQUEST, format!("invalid filter: {e}\n")),
        },
        None => None,
    };
    let used_only = req.param("usedonly").is_some();
    let mut stats: Vec<(String, u64, StatKind)> = state
        .metrics
        .envoy_stats()
        .into_iter()
        .map(|s| (s.dotted_name(), s.value, s.kind))
        .filter(|(name, _, _)| filter.as_ref().is_none_or(|re| re.is_match(name)))
        // Envoy's "used" means written at least once; a zero counter never was.
        .filter(|(_, v, kind)| !used_only || *kind == StatKind::Gauge || *v != 0)
        .collect();
    stats.sort_by(|a, b| a.0.cmp(&b.0));
    match req.param("format") {
        Some("json") => json(
            StatusCode::OK,
            &json!({
                "stats": stats.iter().map(|(n, v, _)| json!({"name": n, "value": v})).collect::<Vec<_>>()
            }),
        ),
        None | Some("") | Some("text") => {
            let body: String = stats
                .iter()
                .map(|(n, v, _)| format!("{n}: {v}\n"))
                .collect();
            text(StatusCode::OK, body)
        }
        Some(other) => text(
            StatusCode::BAD_REQUEST,
            format!("unknown format `{other}`; use json, text or prometheus\n"),
        ),
    }
}

/// `/server_info`, in the shape of Envoy's `ServerInfo`.
pub(super) fn server_info(state: &AdminState) -> Response<Body> {
    let uptime = format!("{}s", state.metrics.server.uptime_secs());
    let config = state.config.load();
    let w = &state.workload;
    json(
        StatusCode::OK,
        &json!({
            "version": format!("remora/{}", env!("CARGO_PKG_VERSION")),
            "state": state.server_state().as_str(),
            "uptime_current_epoch": uptime,
            "uptime_all_epochs": uptime,
            "hot_restart_version": "disabled",
            "command_line_options": {
                "concurrency": state.concurrency,
                "drain_time": format!("{}s", config.drain.drain_time.as_secs_f64()),
                "log_level": state.logging.as_ref().map(|l| l.current()),
            },
            "node": node(state),
            "workload": {
                "name": w.name, "namespace": w.namespace, "app": w.app, "version": w.version,
                "canonical_service": w.canonical_service, "canonical_revision": w.canonical_revision,
                "cluster": w.cluster,
            },
        }),
    )
}

/// Istio's node id: `sidecar~IP~POD.NAMESPACE~NAMESPACE.svc.cluster.local`.
fn node(state: &AdminState) -> Value {
    let ip = std::env::var("INSTANCE_IP").unwrap_or_default();
    let ns = &state.workload.namespace;
    json!({
        "id": state.workload.node_id(&ip),
        "cluster": format!("{}.{ns}", state.workload.canonical_service),
    })
}

fn socket_address(a: &std::net::SocketAddr) -> Value {
    json!({ "socket_address": { "address": a.ip().to_string(), "port_value": a.port() } })
}

/// `/listeners`: `name::address` lines, or Envoy's `ListenerStatus` list with `?format=json`.
pub(super) fn listeners(state: &AdminState, req: &AdminRequest) -> Response<Body> {
    if req.param("format") == Some("json") {
        let statuses: Vec<Value> = state
            .listeners
            .iter()
            .map(|l| {
                let mut status = json!({ "name": l.name });
                if let Some((first, rest)) = l.addresses.split_first() {
                    status["local_address"] = socket_address(first);
                    if !rest.is_empty() {
                        status["additional_local_addresses"] =
                            Value::Array(rest.iter().map(socket_address).collect());
                    }
                }
                status
            })
            .collect();
        return json(StatusCode::OK, &json!({ "listener_statuses": statuses }));
    }
    let body: String = state
        .listeners
        .iter()
        .flat_map(|l| {
            l.addresses
                .iter()
                .map(move |a| format!("{}::{a}\n", l.name))
        })
        .collect();
    text(StatusCode::OK, body)
}

/// A cluster as Remora has one: where a kind of listener sends its traffic.
struct Cluster {
    name: String,
    /// The traffic its upstream connections carry.
    direction: Direction,
    /// An explicit listener's upstream, listed whether or not a connection to it is open (as
    /// a static cluster's host is); capture clusters (original destination) have none.
    fixed_host: Option<std::net::SocketAddr>,
}

/// The clusters Remora has, one per listener kind or explicit upstream, in listener order.
fn clusters_of(state: &AdminState) -> Vec<Cluster> {
    let mut clusters: Vec<Cluster> = Vec::new();
    for l in &state.listeners {
        let cluster = match &l.route {
            Route::Capture(Direction::Outbound) => Cluster {
                name: "PassthroughCluster".into(),
                direction: Direction::Outbound,
                fixed_host: None,
            },
            Route::Capture(Direction::Inbound) => Cluster {
                name: "InboundPassthroughCluster".into(),
                direction: Direction::Inbound,
                fixed_host: None,
            },
            Route::Fixed(l) if l.terminates_tls() => Cluster {
                name: format!("inbound|{}||", l.upstream.port()),
                direction: Direction::Inbound,
                fixed_host: Some(l.upstream),
            },
            Route::Fixed(l) => Cluster {
                name: format!("outbound|{}||{}", l.upstream.port(), l.upstream.ip()),
                direction: Direction::Outbound,
                fixed_host: Some(l.upstream),
            },
        };
        if !clusters.iter().any(|c| c.name == cluster.name) {
            clusters.push(cluster);
        }
    }
    clusters
}

fn cluster_names(state: &AdminState) -> Vec<String> {
    clusters_of(state).into_iter().map(|c| c.name).collect()
}

/// Each cluster with its hosts and their open connections: an explicit listener's upstream,
/// and every destination the data path has a connection open to, under the explicit cluster
/// whose upstream it is, or else under its direction's passthrough cluster. Envoy lists an
/// original-destination host until a cleanup pass after its last use; Remora lists it while a
/// connection to it (pooled ones included) is open.
fn clusters_with_hosts(state: &AdminState) -> Vec<(String, Vec<(std::net::SocketAddr, usize)>)> {
    let clusters = clusters_of(state);
    let mut hosts: Vec<Vec<(std::net::SocketAddr, usize)>> = clusters
        .iter()
        .map(|c| c.fixed_host.map(|h| (h, 0)).into_iter().collect())
        .collect();
    for open in state.upstreams.open_upstreams() {
        let owner = clusters
            .iter()
            .position(|c| c.direction == open.direction && c.fixed_host == Some(open.destination))
            .or_else(|| {
                clusters
                    .iter()
                    .position(|c| c.direction == open.direction && c.fixed_host.is_none())
            });
        let Some(i) = owner else { continue };
        match hosts[i].iter_mut().find(|(h, _)| *h == open.destination) {
            Some((_, n)) => *n += open.connections,
            None => hosts[i].push((open.destination, open.connections)),
        }
    }
    clusters.into_iter().map(|c| c.name).zip(hosts).collect()
}

/// `/clusters`: Envoy's `cluster::key::value` lines (and `cluster::host::stat::value` for each
/// host), or `ClusterStatus` JSON with `host_statuses`. Remora's own clusters' hosts are all
/// healthy (Remora does no active health checking); istiod's clusters list their endpoints
/// with the weight, priority, locality and EDS health istiod gave them, outlier detection's
/// `/failed_outlier_check`, the host's request counters, and the cluster's circuit breakers.
pub(super) fn clusters(state: &AdminState, req: &AdminRequest) -> Response<Body> {
    let snapshot = state.xds.as_ref().map(|store| store.snapshot());
    let xds = snapshot
        .as_deref()
        .map(|s| crate::upstream::membership::cluster_hosts(s, &state.dns_hosts, &state.balancers))
        .unwrap_or_default();
    let clusters: Vec<_> = clusters_with_hosts(state)
        .into_iter()
        .filter(|(n, _)| !xds.iter().any(|(x, _)| x == n))
        .collect();
    if req.param("format") == Some("json") {
        let mut statuses: Vec<Value> = clusters
            .iter()
            .map(|(n, hosts)| {
                let hosts: Vec<Value> = hosts
                    .iter()
                    .map(|(addr, active)| {
                        // Proto3 JSON, as Envoy writes it: a 64-bit value is a string, and a
                        // zero is left out.
                        let mut cx_active = json!({ "type": "GAUGE", "name": "cx_active" });
                        if *active != 0 {
                            cx_active["value"] = Value::String(active.to_string());
                        }
                        json!({
                            "address": socket_address(addr),
                            "stats": [cx_active],
                            "health_status": { "eds_health_status": "HEALTHY" },
                            "weight": 1,
                        })
                    })
                    .collect();
                json!({
                    "name": n,
                    "added_via_api": false,
                    "observability_name": n,
                    "host_statuses": hosts,
                })
            })
            .collect();
        statuses.extend(xds.iter().map(|(n, hosts)| {
            let hosts: Vec<Value> = hosts
                .iter()
                .map(|h| {
                    // Proto3 JSON, as Envoy writes it: a 64-bit value is a string, and a zero
                    // is left out.
                    let stat = |kind: &str, name: &str, v: u64| {
                        let mut s = json!({ "type": kind, "name": name });
                        if v != 0 {
                            s["value"] = Value::String(v.to_string());
                        }
                        s
                    };
                    let [cx_active, rq_active, rq_total, rq_error] = h.counters;
                    let mut health = json!({
                        "eds_health_status": super::xds_dump::eds_health_status(h.health),
                    });
                    if h.ejected {
                        health["failed_outlier_check"] = json!(true);
                    }
                    let mut status = json!({
                        "address": socket_address(&h.address),
                        "stats": [
                            stat("COUNTER", "rq_error", rq_error),
                            stat("COUNTER", "rq_total", rq_total),
                            stat("GAUGE", "cx_active", cx_active),
                            stat("GAUGE", "rq_active", rq_active),
                        ],
                        "health_status": health,
                        "weight": h.weight,
                        "locality": {
                            "region": h.locality.region,
                            "zone": h.locality.zone,
                            "sub_zone": h.locality.sub_zone,
                        },
                    });
                    if h.priority != 0 {
                        status["priority"] = json!(h.priority);
                    }
                    status
                })
                .collect();
            json!({
                "name": n,
                "added_via_api": true,
                "observability_name": n,
                "host_statuses": hosts,
            })
        }));
        return json(StatusCode::OK, &json!({ "cluster_statuses": statuses }));
    }
    let mut body = String::new();
    for (n, hosts) in &clusters {
        body.push_str(&format!(
            "{n}::observability_name::{n}\n{n}::added_via_api::false\n"
        ));
        for (addr, active) in hosts {
            body.push_str(&format!(
                "{n}::{addr}::cx_active::{active}\n{n}::{addr}::health_flags::healthy\n\
                 {n}::{addr}::weight::1\n{n}::{addr}::priority::0\n"
            ));
        }
    }
    for (n, hosts) in &xds {
        body.push_str(&format!(
            "{n}::observability_name::{n}\n{n}::added_via_api::true\n"
        ));
        if let Some(c) = snapshot.as_deref().and_then(|s| s.cluster(n)) {
            let cb = &c.circuit_breakers;
            body.push_str(&format!(
                "{n}::default_priority::max_connections::{}\n\
                 {n}::default_priority::max_pending_requests::{}\n\
                 {n}::default_priority::max_requests::{}\n\
                 {n}::default_priority::max_retries::{}\n",
                cb.max_connections, cb.max_pending_requests, cb.max_requests, cb.max_retries
            ));
        }
        for h in hosts {
            let a = h.address;
            let l = &h.locality;
            let [cx_active, rq_active, rq_total, rq_error] = h.counters;
            body.push_str(&format!(
                "{n}::{a}::cx_active::{cx_active}\n{n}::{a}::rq_active::{rq_active}\n\
                 {n}::{a}::rq_error::{rq_error}\n{n}::{a}::rq_total::{rq_total}\n"
            ));
            body.push_str(&format!(
                "{n}::{a}::health_flags::{}\n{n}::{a}::weight::{}\n{n}::{a}::region::{}\n\
                 {n}::{a}::zone::{}\n{n}::{a}::sub_zone::{}\n{n}::{a}::priority::{}\n",
                super::xds_dump::host_health_flags(h.health, h.ejected),
                h.weight,
                l.region,
                l.zone,
                l.sub_zone,
                h.priority
            ));
        }
    }
    text(StatusCode::OK, body)
}

/// `/config_dump`: Envoy's admin v3 `ConfigDump` (a `configs` array of `@type`d entries, in
/// Envoy's order) for what Remora has, plus Remora's own config as a last entry of its own
/// type. In istiod mode istiod's resources are the dynamic entries (`xds_dump`); a static entry
/// that istiod also names (`virtualOutbound`, `PassthroughCluster`) is then left to it.
/// `?include_eds` adds the endpoints. `?resource=<field>` (`static_clusters`,
/// `dynamic_active_clusters`, `dynamic_warming_clusters`, `dynamic_listeners`, `dynamic_route_configs`,
/// `dynamic_endpoint_configs`, `dynamic_active_secrets`…) lists that field's entries alone,
/// each `@type`d, as Envoy does.
pub(super) fn config_dump(state: &AdminState, req: &AdminRequest) -> Response<Body> {
    let config = state.config.load();
    let t = |name: &str| format!("type.googleapis.com/envoy.admin.v3.{name}");
    let snapshot = state.xds.as_ref().map(|store| store.snapshot());
    let dynamic = snapshot
        .as_deref()
        .map(|snap| super::xds_dump::dynamic(state, snap))
        .unwrap_or_default();
    let from_istiod = |kind: fn(&remora_xds::snapshot::Snapshot, &str) -> bool, name: &str| {
        snapshot.as_deref().is_some_and(|snap| kind(snap, name))
    };
    let listeners: Vec<Value> = state
        .listeners
        .iter()
        .filter(|l| !from_istiod(|s, n| s.listeners.contains_key(n), &l.name))
        .map(|l| {
            json!({ "listener": {
                "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
                "name": l.name,
                "address": l.addresses.first().map(socket_address),
                "additional_addresses": l.addresses.iter().skip(1)
                    .map(|a| json!({ "address": socket_address(a) })).collect::<Vec<_>>(),
                "use_original_dst": matches!(l.route, Route::Capture(_)),
            }})
        })
        .collect();
    let connect_timeout = format!("{}s", config.outbound.connect_timeout.as_secs_f64());
    let clusters: Vec<Value> = cluster_names(state)
        .into_iter()
        .filter(|name| !from_istiod(|s, n| s.clusters.contains_key(n), name))
        .map(|name| {
            let kind = if name.starts_with("outbound|") {
                "STATIC"
            } else {
                "ORIGINAL_DST"
            };
            json!({ "cluster": {
                "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                "name": name, "type": kind, "connect_timeout": connect_timeout,
            }})
        })
        .collect();
    if let Some(resource) = req.param("resource") {
        let (entries, of) = match resource {
            "static_clusters" => (clusters, "ClustersConfigDump.StaticCluster"),
            "static_listeners" => (listeners, "ListenersConfigDump.StaticListener"),
            "dynamic_active_clusters" => (dynamic.clusters, "ClustersConfigDump.DynamicCluster"),
            "dynamic_warming_clusters" => (
                dynamic.warming_clusters,
                "ClustersConfigDump.DynamicCluster",
            ),
            "dynamic_listeners" => (dynamic.listeners, "ListenersConfigDump.DynamicListener"),
            "dynamic_route_configs" => (dynamic.routes, "RoutesConfigDump.DynamicRouteConfig"),
            "dynamic_endpoint_configs" => (
                dynamic.endpoints,
                "EndpointsConfigDump.DynamicEndpointConfig",
            ),
            "dynamic_active_secrets" => (dynamic.secrets, "SecretsConfigDump.DynamicSecret"),
            other => {
                return text(
                    StatusCode::NOT_FOUND,
                    format!("{other} not found in config dump\n"),
                )
            }
        };
        let typed: Vec<Value> = entries
            .into_iter()
            .map(|mut e| {
                e["@type"] = Value::String(t(of));
                e
            })
            .collect();
        return json(StatusCode::OK, &json!({ "configs": typed }));
    }
    let remora_config = serde_json::to_value(&**config).unwrap_or(Value::Null);
    let mut clusters_dump =
        json!({ "@type": t("ClustersConfigDump"), "static_clusters": clusters });
    let mut listeners_dump =
        json!({ "@type": t("ListenersConfigDump"), "static_listeners": listeners });
    let mut secrets_dump = json!({ "@type": t("SecretsConfigDump") });
    let mut configs = Vec::new();
    configs.push(json!({ "@type": t("BootstrapConfigDump"), "bootstrap": {
        "node": node(state),
        "admin": { "address": socket_address(&config.admin.address) },
    }}));
    if snapshot.is_some() {
        clusters_dump["version_info"] = Value::String(dynamic.cds_version);
        clusters_dump["dynamic_active_clusters"] = Value::Array(dynamic.clusters);
        // Envoy leaves the field out when nothing warms.
        if !dynamic.warming_clusters.is_empty() {
            clusters_dump["dynamic_warming_clusters"] = Value::Array(dynamic.warming_clusters);
        }
        listeners_dump["version_info"] = Value::String(dynamic.lds_version);
        listeners_dump["dynamic_listeners"] = Value::Array(dynamic.listeners);
        secrets_dump["dynamic_active_secrets"] = Value::Array(dynamic.secrets);
    }
    configs.push(clusters_dump);
    configs.push(listeners_dump);
    if snapshot.is_some() {
        configs.push(json!({
            "@type": t("RoutesConfigDump"),
            "dynamic_route_configs": dynamic.routes,
        }));
    }
    configs.push(secrets_dump);
    if snapshot.is_some() && req.param("include_eds").is_some() {
        configs.push(json!({
            "@type": t("EndpointsConfigDump"),
            "dynamic_endpoint_configs": dynamic.endpoints,
        }));
    }
    configs.push(json!({
        "@type": "type.googleapis.com/remora.admin.v1.RemoraConfigDump",
        "config": remora_config,
    }));
    json(StatusCode::OK, &json!({ "configs": configs }))
}

/// `/drain_listeners`, as Envoy's: draining starts at once (every inbound connection is told
/// to go, as under `--drain-strategy immediate`, which Istio runs Envoy with); `?inboundonly`
/// closes the inbound listeners, otherwise every data-path listener closes; `?graceful` keeps
/// them accepting through the drain duration first (new connections are served and told to go
/// too), and `?skip_exit` with it leaves them open.
pub(super) fn drain_listeners(state: &AdminState, req: &AdminRequest) -> Response<Body> {
    let inbound_only = req.param("inboundonly").is_some();
    let graceful = req.param("graceful").is_some();
    let skip_exit = req.param("skip_exit").is_some();
    let drain = std::sync::Arc::clone(&state.drain);
    drain.start();
    state.metrics.server.set_state(ServerState::Draining);
    let close = move || match inbound_only {
        true => drain.close_inbound_listeners(),
        false => drain.close_all_listeners(),
    };
    match (graceful, skip_exit) {
        (_, true) => {}
        (true, false) => {
            let wait = state.config.load().drain.duration;
            // Runs on the admin runtime; the handler is always called inside it.
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                close();
            });
        }
        (false, false) => close(),
    }
    text(StatusCode::OK, "OK\n".into())
}

/// `/certs`: Envoy's `Certificates` shape: the trust roots (`ca_cert`) and the workload chain
/// (`cert_chain`), each with serial, SANs, validity and days until expiry.
pub(super) fn certs(state: &AdminState) -> Response<Body> {
    let Some(identity) = state.identity.current() else {
        return json(StatusCode::OK, &json!({ "certificates": [] }));
    };
    let now = std::time::SystemTime::now();
    let details = |path: &std::path::Path, c: &crate::identity::CertSummary| {
        let days = c
            .not_after
            .duration_since(now)
            .map_or(0, |d| d.as_secs() / 86_400);
        let sans: Vec<Value> = c
            .uri_sans
            .iter()
            .map(|u| json!({ "uri": u }))
            .chain(c.dns_sans.iter().map(|d| json!({ "dns": d })))
            .collect();
        json!({
            "path": path.display().to_string(),
            "serial_number": c.serial,
            "subject_alt_names": sans,
            "days_until_expiration": days.to_string(),
            "valid_from": humantime::format_rfc3339_seconds(c.not_before).to_string(),
            "expiration_time": humantime::format_rfc3339_seconds(c.not_after).to_string(),
        })
    };
    let ca: Vec<Value> = identity
        .ca
        .iter()
        .map(|c| details(&identity.root_path, c))
        .collect();
    let chain: Vec<Value> = identity
        .chain
        .iter()
        .map(|c| details(&identity.chain_path, c))
        .collect();
    json(
        StatusCode::OK,
        &json!({ "certificates": [ { "ca_cert": ca, "cert_chain": chain } ] }),
    )
}
