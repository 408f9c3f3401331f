//! AuthorizationPolicy CUSTOM, ALLOW, DENY and dry-run on TCP ports (Envoy's network ext_authz
//! and RBAC filters), Envoy 1.40 as the oracle for what is logged and counted: the same
//! `virtualInbound` (one chain per case, as istiod writes it for a gRPC provider or for ALLOW
//! and DENY policies with a dry-run one, each `tcp_proxy` with the same file logger) given to
//! Remora and to Envoy, each the sidecar of a captured pod with echo servers on the ports, the
//! same gRPC authorizer ([`GrpcAuthorizer`], in the peer namespace) and the same connections
//! from the peer, one case at a time. After each, the connection's access-log line (response
//! flags, both kinds of details, upstream host and cluster, bytes) and the `ext_authz.*` and
//! `tcp.rbac.*` statistics of `/stats` must be the same, save what the proxies' order of work
//! makes differ:
//! Envoy's `tcp_proxy` dials the workload before the filter decides, Remora decides before it
//! dials, so a refused connection has an upstream host in Envoy's line only.

use remora_e2e::access_logs::{file_log, log_file, wait_for_lines};
use remora_e2e::envoy_xds::{istio_stats_config, nets_or_skip, Resources};
use remora_e2e::ext_authz::{
    grpc_cluster, tcp_chain, GrpcAuthorizer, TcpChain, DENIED_TCP_PORT, ERRORING_TCP_PORTS,
};
use remora_e2e::peer::{self, any_addr};
use remora_e2e::stat_deltas::{self, delta, prometheus_samples, Stats};
use remora_e2e::xds_resources::inbound_cluster;
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// What each line says of a connection.
const FORMAT: &str = "%RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% \
                      %UPSTREAM_HOST% %UPSTREAM_CLUSTER% %BYTES_RECEIVED% %BYTES_SENT%\n";
/// The authorizer's port in the peer namespace, and one where nothing listens.
const AUTHZ_PORT: u16 = 9191;
const NOWHERE_PORT: u16 = 9199;
const GRPC: &str = "outbound|9191||ext-authz-grpc.foo.svc.cluster.local";
const GRPC_DOWN: &str = "outbound|9199||ext-authz-down.foo.svc.cluster.local";

const ALLOWED: u16 = 9100;
const DENIED: u16 = DENIED_TCP_PORT as u16;
/// Not selected by the CUSTOM policy.
const UNSELECTED: u16 = 9102;
/// The authorizer unreachable: failing closed, then open (`failure_mode_allow`).
const UNREACHABLE: u16 = 9103;
const UNREACHABLE_OPEN: u16 = 9104;
/// The authorizer answering a gRPC error: failing closed, then open.
const ERRING: u16 = ERRORING_TCP_PORTS[0] as u16;
const ERRING_OPEN: u16 = ERRORING_TCP_PORTS[1] as u16;

/// Chains of istiod's DENY filter (whose policy names [`RBAC_DENIED`]) then ALLOW filter (the
/// peer's address), which also holds a dry-run ALLOW policy for a SPIFFE ID the plaintext
/// peer does not have.
const RBAC_ALLOWED: u16 = 9110;
const RBAC_DENIED: u16 = 9111;
const RBAC_CASES: [u16; 2] = [RBAC_ALLOWED, RBAC_DENIED];

/// Each CUSTOM case's port, authorizer cluster and `failure_mode_allow`.
const CASES: [(u16, &str, bool); 7] = [
    (ALLOWED, GRPC, false),
    (DENIED, GRPC, false),
    (UNSELECTED, GRPC, false),
    (UNREACHABLE, GRPC_DOWN, false),
    (UNREACHABLE_OPEN, GRPC_DOWN, true),
    (ERRING, GRPC, false),
    (ERRING_OPEN, GRPC, true),
];

/// Every case's port, in the order they are run.
fn ports() -> impl Iterator<Item = u16> {
    CASES.iter().map(|(port, ..)| *port).chain(RBAC_CASES)
}

/// istiod's network RBAC filter with `rules`, and `shadow` under the dry-run stat prefix.
fn network_rbac(rules: Value, shadow: Option<Value>) -> Value {
    let mut rbac = json!({"stat_prefix": "tcp.", "rules": rules,
        "@type": "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC"});
    if let Some(shadow) = shadow {
        rbac["shadow_rules"] = shadow;
        rbac["shadow_rules_stat_prefix"] = json!("istio_dry_run_allow_");
    }
    json!({"name": "envoy.filters.network.rbac", "typed_config": rbac})
}

/// A chain on `port` with the DENY and ALLOW filters of [`RBAC_CASES`], then `tcp_proxy`.
fn rbac_chain(net: &PodNet, port: u16, access_log: &Value) -> Value {
    let policy = |name: &str, permission: Value, principal: Value| {
        json!({name: {"permissions": [{"and_rules": {"rules": [permission]}}],
            "principals": [{"and_ids": {"ids": [principal]}}]}})
    };
    let deny = policy(
        "ns[foo]-policy[deny-tcp]-rule[0]",
        json!({"destination_port": RBAC_DENIED}),
        json!({"any": true}),
    );
    let peer = json!({"direct_remote_ip": {"address_prefix": net.peer_ip.to_string(),
        "prefix_len": 32}});
    let allow = policy(
        "ns[foo]-policy[allow-peer]-rule[0]",
        json!({"any": true}),
        peer,
    );
    let dry_run = policy(
        "ns[foo]-policy[dry-run]-rule[0]",
        json!({"any": true}),
        json!({"filter_state": {"key": "io.istio.peer_principal",
            "string_match": {"exact": "spiffe://cluster.local/ns/foo/sa/bar"}}}),
    );
    let cluster = format!("inbound|{port}||");
    json!({"name": format!("0.0.0.0_{port}"),
        "filter_chain_match": {"destination_port": port, "transport_protocol": "raw_buffer"},
        "filters": [
            network_rbac(json!({"action": "DENY", "policies": deny}), None),
            network_rbac(json!({"action": "ALLOW", "policies": allow}),
                Some(json!({"action": "ALLOW", "policies": dry_run}))),
            {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": cluster, "cluster": cluster, "access_log": access_log}}]})
}

fn resources(net: &PodNet, log: &Path) -> Resources {
    let access_log = file_log(log, FORMAT);
    let selected = [(ALLOWED, UNSELECTED), (UNREACHABLE, ERRING_OPEN + 1)];
    let mut chains: Vec<Value> = CASES
        .iter()
        .map(|(port, grpc, fail_open)| {
            let chain = TcpChain {
                grpc,
                selected: &selected,
                fail_open: *fail_open,
                access_log: Some(&access_log),
            };
            tcp_chain(*port, chain)
        })
        .collect();
    chains.extend(RBAC_CASES.map(|port| rbac_chain(net, port, &access_log)));
    let listener = json!({"name": "virtualInbound", "traffic_direction": "INBOUND",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
        "listener_filters": [{"name": "envoy.filters.listener.original_dst", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}}],
        "filter_chains": chains});
    let mut clusters: Vec<Value> = ports()
        .map(|p| inbound_cluster(&format!("inbound|{p}||")))
        .collect();
    clusters.push(grpc_cluster(GRPC, net.peer_addr(AUTHZ_PORT)));
    clusters.push(grpc_cluster(GRPC_DOWN, net.peer_addr(NOWHERE_PORT)));
    Resources {
        listeners: json!([listener]),
        clusters: Value::Array(clusters),
        routes: json!([]),
        endpoints: json!([]),
    }
}

/// The `ext_authz.*` and `tcp.rbac.*` statistics of the sidecar whose admin API is on `port`.
fn authz_stats(net: &PodNet, port: u16) -> Stats {
    stat_deltas::stats(net, port, |name| {
        name.starts_with("ext_authz.") || name.starts_with("tcp.rbac.")
    })
}

/// What one case did through one proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    echoed: bool,
    /// The access-log line's fields, the pod's address named `POD`.
    line: Vec<String>,
    /// The statistics that changed.
    stats: Vec<String>,
}

/// Whether `data` sent to the pod's `port` comes back; the client closes only then, so its
/// end of stream never arrives while a check is in flight (Envoy counts a connection's bytes as
/// received twice when it does, in some runs).
fn echo_then_close(net: &PodNet, port: u16, data: &[u8]) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = peer::connect(&net.peer, net.pod_addr(port)) else {
        return false;
    };
    let mut back = vec![0; data.len()];
    let echoed = stream.write_all(data).is_ok() && stream.read_exact(&mut back).is_ok();
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.read_to_end(&mut back);
    echoed && back == data
}

/// The line's fields.
const UPSTREAM_HOST: usize = 3;

/// Each case's connection from the peer through `net`'s sidecar (admin API on `admin`),
/// waited for in the log; the statistics at the end, and the Prometheus samples of the
/// `ext_authz.*` and of the RBAC filters' (`envoy_tcp`).
fn run(
    net: &PodNet,
    admin: u16,
    log: &Path,
    output: &dyn Fn() -> String,
) -> (Vec<Seen>, Stats, [Vec<String>; 2]) {
    let data = peer::pattern(64);
    let mut before = authz_stats(net, admin);
    let mut seen = Vec::new();
    for (n, port) in ports().enumerate() {
        let echoed = echo_then_close(net, port, &data);
        let lines = wait_for_lines(log, n + 1, output);
        // The gauge of checks in flight is back to 0 once the connection is logged.
        std::thread::sleep(Duration::from_millis(200));
        let after = authz_stats(net, admin);
        let line = lines[n].replace(&net.pod_ip.to_string(), "POD");
        seen.push(Seen {
            echoed,
            line: line.split(' ').map(str::to_string).collect(),
            stats: delta(&before, &after),
        });
        before = after;
    }
    // The RBAC filters' family alone, not the `tcp_proxy`'s (`envoy_tcp_downstream_…`).
    let rbac = prometheus_samples(net, admin, "envoy_tcp")
        .into_iter()
        .filter(|l| l.starts_with("envoy_tcp{") || l.starts_with("# TYPE envoy_tcp "))
        .collect();
    let ext_authz = prometheus_samples(net, admin, "envoy_ext_authz");
    (seen, before, [ext_authz, rbac])
}

/// Where Envoy and Remora must differ, each asserted as observed and made the same:
/// - a refused connection's upstream host: Envoy's `tcp_proxy` had dialled the workload
///   before the filter decided, Remora decides first (`docs/xds.md`);
/// - Envoy counts `disabled` per read of a connection its filter does not check (the
///   client's bytes and its end of stream are one read or two, as they arrive), Remora once
///   per connection (its other statistics must be the same).
fn reconcile(port: u16, data: &[Seen; 2]) -> [Seen; 2] {
    let [remora, mut envoy] = data.clone();
    let refused = !envoy.echoed;
    if refused {
        assert_eq!(remora.line[UPSTREAM_HOST], "-", "{remora:?}");
        assert_eq!(
            envoy.line[UPSTREAM_HOST],
            format!("POD:{port}"),
            "{envoy:?}"
        );
        envoy.line[UPSTREAM_HOST] = "-".into();
    }
    if port == UNSELECTED {
        let reads = |s: &Seen| {
            s.stats
                .iter()
                .find_map(|d| d.strip_prefix("ext_authz.tcp..disabled +"))
                .and_then(|n| n.parse::<u32>().ok())
        };
        assert_eq!(reads(&remora), Some(1), "{remora:?}");
        assert!(
            reads(&envoy).is_some_and(|n| (1..=2).contains(&n)),
            "{envoy:?}"
        );
        let disabled = |d: &String| d.starts_with("ext_authz.tcp..disabled +");
        if let Some(remoras) = remora.stats.iter().find(|d| disabled(d)) {
            for d in envoy.stats.iter_mut().filter(|d| disabled(d)) {
                d.clone_from(remoras);
            }
        }
    }
    [remora, envoy]
}

#[test]
fn network_ext_authz_logs_and_counts_as_envoy_does() {
    let Some((binary, (remora_net, envoy_net))) = nets_or_skip() else {
        return;
    };
    let mut runs = Vec::new();
    for (i, net) in [&remora_net, &envoy_net].into_iter().enumerate() {
        remora_e2e::sidecars::prepare(net);
        let _authz = GrpcAuthorizer::start(&net.peer, net.peer_addr(AUTHZ_PORT));
        let _echoes: Vec<peer::Server> = ports()
            .map(|p| peer::Server::echo(&net.pod, any_addr(p)))
            .collect();
        let log = log_file(net, "access.log");
        let resources = resources(net, &log);
        let seen = if i == 0 {
            let remora = resources.start_remora(net);
            run(net, remora_e2e::ADMIN_PORT, &log, &|| remora.stderr())
        } else {
            // Istio's tags, for the RBAC filters' Prometheus names and labels.
            let envoy = resources.start_envoy_with(net, &binary, istio_stats_config);
            run(net, remora_e2e::envoy::ADMIN_PORT, &log, &|| envoy.logs())
        };
        runs.push(seen);
    }
    let [(remora, remora_stats, [remora_prom, remora_rbac]), (envoy, envoy_stats, [envoy_prom, envoy_rbac])] =
        [runs.remove(0), runs.remove(0)];
    let report: Vec<String> = ports()
        .zip(remora.iter().zip(&envoy))
        .map(|(port, (r, e))| format!("{port}\n  remora {r:?}\n  envoy  {e:?}"))
        .collect();
    let report = report.join("\n");
    eprintln!("{report}");
    for (port, (r, e)) in ports().zip(remora.iter().zip(&envoy)) {
        let [r, e] = reconcile(port, &[r.clone(), e.clone()]);
        assert_eq!(r, e, "port {port}: Remora and Envoy differ:\n{report}");
    }
    // The same statistics in the end, none in flight; and what the filter is for.
    let names = |s: &Stats| s.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&remora_stats), names(&envoy_stats));
    assert_eq!(remora_stats.get("ext_authz.tcp..active"), Some(&0));
    // And in Prometheus form, with the same values but `disabled` (counted as above).
    let disabled = |l: &&String| !l.starts_with("envoy_ext_authz_tcp__disabled ");
    assert!(remora_prom.iter().any(|l| l == "envoy_ext_authz_tcp__ok 1"));
    assert_eq!(
        remora_prom.iter().filter(disabled).collect::<Vec<_>>(),
        envoy_prom.iter().filter(disabled).collect::<Vec<_>>()
    );
    assert_eq!(remora_rbac, envoy_rbac);
    assert_eq!(
        remora.iter().map(|s| s.echoed).collect::<Vec<_>>(),
        [true, false, true, false, true, false, true, true, false],
        "{report}"
    );
    let details: Vec<&str> = remora.iter().map(|s| s.line[1].as_str()).collect();
    assert_eq!(
        details,
        [
            "-",
            "ext_authz_denied",
            "-",
            "ext_authz_error",
            "-",
            "ext_authz_error",
            "-",
            "-",
            "-"
        ]
    );
    // Each RBAC filter counts its own decision (the DENY one's and the ALLOW one's add to the
    // same `allowed`), its shadow rules' under its shadow_rules_stat_prefix.
    let rbac = |seen: &Seen| -> Vec<String> {
        let rbac = seen.stats.iter().filter(|d| d.starts_with("tcp.rbac."));
        rbac.cloned().collect()
    };
    assert_eq!(
        rbac(&remora[7]),
        [
            "tcp.rbac.allowed +2",
            "tcp.rbac.istio_dry_run_allow_.shadow_denied +1"
        ]
    );
    assert_eq!(rbac(&remora[8]), ["tcp.rbac.denied +1"]);
    assert_eq!(
        remora[8].line[2],
        "rbac_access_denied_matched_policy[ns[foo]-policy[deny-tcp]-rule[0]]"
    );
    assert!(
        remora_rbac
            .contains(&"envoy_tcp{authz_enforce_result=\"allowed\",tcp_prefix=\"rbac\"} 2".into()),
        "{remora_rbac:#?}"
    );
}
