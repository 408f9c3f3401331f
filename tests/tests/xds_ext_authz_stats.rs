//! AuthorizationPolicy's CUSTOM action counted as Envoy counts it, Envoy 1.40 as the oracle:
//! the same `virtualInbound` as `xds_ext_authz.rs` (`remora_e2e::custom_authz`) given to Remora
//! and to Envoy (with the stats tags of Istio's bootstrap), the same requests sent to each one
//! at a time, and what each request adds compared: to the HTTP ext_authz filter's statistics
//! (`http.<prefix>.ext_authz.*`), to those it keeps on the cluster of the request's route
//! (`cluster.<name>.ext_authz.*`), to that cluster's response counts (a denial is charged
//! there), and to the RBAC filters' of its chain
//! (`http.<prefix>.rbac.*`: istiod's shadow filter, a DENY policy, dry-run policies); then the
//! statistics' names on `/stats` and their samples on `/stats/prometheus`.

use remora_e2e::custom_authz::client::{post_with, workload};
use remora_e2e::custom_authz::*;
use remora_e2e::envoy_xds::{istio_stats_config, nets_or_skip};
use remora_e2e::stat_deltas::{self, delta, prometheus_samples, Stats};
use remora_e2e::PodNet;

/// The authorizer's own header, sent by the client: on the rerouting chains it makes the
/// request's route a direct response before any check.
const AUTHORIZED: Option<&str> = Some("x-ext-authz-check-result: allowed");

/// Requests whose counting is compared (port, path, selected, body bytes, a header of the
/// client's own): one a filter does not select, allowed and denied ones (HTTP and gRPC
/// authorizers), the authorizer unreachable (failing closed, then open), a check timing out, a
/// body over the limit (413 before any check), one allowed then denied by the RBAC filter after
/// the authorizer, two authorizers in one chain, and one no authorizer checks that a DENY
/// policy lets through and a dry-run ALLOW policy would have allowed, and one through a chain
/// without filters; then one checked whose route is a direct response (no cluster to count
/// on), and, selected and not, one no route takes (not checked at all).
const COUNTED: [(u16, &str, bool, usize, Option<&str>); 19] = [
    (UP, "/hello", false, 0, None),
    (UP, "/hello", true, 0, None),
    (UP, "/deny", true, 0, None),
    (DOWN, "/hello", true, 0, None),
    (DOWN_OPEN, "/hello", true, 0, None),
    (HASTY, "/slow", true, 0, None),
    (GRPC, "/headers", true, 0, None),
    (GRPC, "/deny", true, 0, None),
    (GRPC, "/headers", false, 0, None),
    (ORDERED, "/upload", true, SMALL_BODY * 10, None),
    (ORDERED, "/blocked", true, 0, None),
    (CHAINED, "/headers", true, 0, None),
    (REROUTE, "/hello", true, 0, None),
    (REROUTE_CLEARED, "/hello", false, 0, None),
    (ORDERED, "/upload", false, 0, None),
    (PLAIN, "/hello", false, 0, None),
    (REROUTE, "/hello", true, 0, AUTHORIZED),
    (REROUTE, "/nowhere", true, 0, None),
    (REROUTE, "/nowhere", false, 0, None),
];

/// The HTTP filters' statistics (`http.<prefix>.ext_authz.*`) and the route clusters'
/// (`cluster.<name>.ext_authz.*`) of the sidecar whose admin API is on `port`.
fn http_ext_authz_stats(net: &PodNet, port: u16) -> Stats {
    stat_deltas::stats(net, port, |n| {
        (n.starts_with("http.") || n.starts_with("cluster.")) && n.contains(".ext_authz.")
    })
}

/// The inbound and the authorizers' clusters' response counts
/// (`cluster.inbound|…||.upstream_rq_completed`, `.upstream_rq_<code>`, `.upstream_rq_<class>`,
/// and Envoy's `external.` and `internal.` copies of them) of the sidecar whose admin API is on
/// `port`.
fn cluster_responses(net: &PodNet, port: u16) -> Stats {
    let counted = |stat: &str| match stat.strip_prefix("upstream_rq_") {
        Some("completed") => true,
        Some(code) => {
            let b = code.as_bytes();
            b.len() == 3
                && b[0].is_ascii_digit()
                && (b[1..].iter().all(u8::is_ascii_digit) || &b[1..] == b"xx")
        }
        None => false,
    };
    stat_deltas::stats(net, port, |n| {
        n.rsplit_once('.').is_some_and(|(scope, stat)| {
            let scope = scope
                .strip_suffix(".external")
                .or_else(|| scope.strip_suffix(".internal"))
                .unwrap_or(scope);
            let inbound = scope.starts_with("cluster.inbound|") && scope.ends_with("||");
            // The authorizers' clusters: the checks are the proxy's own requests.
            let authorizer = scope.starts_with("cluster.outbound|") && scope.contains("ext-authz");
            (inbound || authorizer) && counted(stat)
        })
    })
}

/// Assert that each request changed `what` on Remora as on Envoy (`seen`: each request and
/// the changes on each side).
fn assert_same(what: &str, seen: &[(u16, &str, bool, Vec<Vec<String>>)]) {
    let report: Vec<String> = seen
        .iter()
        .map(|(p, path, s, c)| {
            format!(
                "{p} {path} selected={s}\n  remora {:?}\n  envoy  {:?}",
                c[0], c[1]
            )
        })
        .collect();
    let report = report.join("\n");
    eprintln!("{what}:\n{report}");
    for (port, path, _, c) in seen {
        assert_eq!(c[0], c[1], "{port} {path}: {what} differ:\n{report}");
    }
}

/// The HTTP RBAC filters' statistics (`http.<prefix>.rbac.*`, istiod's shadow filter for the
/// CUSTOM policy's and the dry-run filters' under their shadow stat prefixes) of the sidecar
/// whose admin API is on `port`.
fn http_rbac_stats(net: &PodNet, port: u16) -> Stats {
    stat_deltas::stats(net, port, |n| {
        n.starts_with("http.") && n.contains(".rbac.")
    })
}

#[test]
fn custom_authorization_counts_as_envoy_does() {
    let Some((binary, (remora_net, envoy_net))) = nets_or_skip() else {
        return;
    };
    let resources = resources();
    let (_r, _r_echo, _r_grpc) = workload(&remora_net);
    let remora = resources.start_remora(&remora_net);
    let (_e, _e_echo, _e_grpc) = workload(&envoy_net);
    let envoy = resources.start_envoy_with(&envoy_net, &binary, istio_stats_config);
    let sides = [
        (&remora_net, remora_e2e::ADMIN_PORT),
        (&envoy_net, remora_e2e::envoy::ADMIN_PORT),
    ];
    let mut before = sides.map(|(net, port)| http_ext_authz_stats(net, port));
    let mut rbac_before = sides.map(|(net, port)| http_rbac_stats(net, port));
    let mut responses_before = sides.map(|(net, port)| cluster_responses(net, port));
    let names = |s: &Stats| {
        s.keys()
            .filter(|n| n.starts_with("http."))
            .cloned()
            .collect::<Vec<_>>()
    };
    let cluster_names = |s: &Stats| {
        s.keys()
            .filter(|n| n.starts_with("cluster."))
            .cloned()
            .collect::<Vec<_>>()
    };
    // Made with the listener, before any request: 13 for each of the 9 HTTP chains; the
    // clusters' only at their first count.
    assert_eq!(names(&before[0]), names(&before[1]));
    assert_eq!(names(&before[0]).len(), 9 * 13);
    assert_eq!(
        (cluster_names(&before[0]), cluster_names(&before[1])),
        (vec![], vec![])
    );
    // The RBAC filters' too: each chain's `rbac.allowed|denied` and its CUSTOM filter's
    // `rbac.istio_ext_authz_.shadow_*`; on the two chains with a DENY policy and a dry-run
    // one, the dry-run filter's shadow counts and the DENY filter's, without a prefix
    // (`rbac.shadow_*`).
    assert_eq!(names(&rbac_before[0]), names(&rbac_before[1]));
    assert_eq!(names(&rbac_before[0]).len(), 9 * 4 + 2 * (2 + 2));
    let plain = format!("http.inbound_0.0.0.0_{PLAIN}.");
    assert!(!names(&rbac_before[0]).iter().any(|n| n.starts_with(&plain)));
    let mut seen = Vec::new();
    let mut rbac_seen = Vec::new();
    let mut responses_seen = Vec::new();
    for (port, path, select, body, header) in COUNTED {
        let mut case = Vec::new();
        let mut rbac_case = Vec::new();
        let mut responses_case = Vec::new();
        for (i, (net, admin)) in sides.iter().enumerate() {
            let status = post_with(net, port, path, select, body, header).status;
            let after = http_ext_authz_stats(net, *admin);
            case.push((status, delta(&before[i], &after)));
            before[i] = after;
            let after = http_rbac_stats(net, *admin);
            rbac_case.push(delta(&rbac_before[i], &after));
            rbac_before[i] = after;
            let after = cluster_responses(net, *admin);
            responses_case.push(delta(&responses_before[i], &after));
            responses_before[i] = after;
        }
        rbac_seen.push((port, path, select, rbac_case));
        responses_seen.push((port, path, select, responses_case));
        let [remora_case, envoy_case] = [0, 1].map(|i| case[i].clone());
        seen.push((port, path, select, remora_case, envoy_case));
    }
    let report: Vec<String> = seen
        .iter()
        .map(|(p, path, s, r, e)| {
            format!("{p} {path} selected={s}\n  remora {r:?}\n  envoy  {e:?}")
        })
        .collect();
    let report = report.join("\n");
    eprintln!("{report}");
    for (port, path, _, r, e) in &seen {
        assert_eq!(r, e, "{port} {path}: Remora and Envoy differ:\n{report}");
    }
    assert_same("RBAC counts", &rbac_seen);
    assert_same("the clusters' response counts", &responses_seen);
    // A denial is charged to the route's cluster as a response with the denial's status, as
    // an internal request's (Envoy's filter charges it so); not a failed check's reply, nor
    // one denied by RBAC after the authorizer. The check itself is charged to the
    // authorizer's cluster as an internal request, the answer it got.
    let inbound = |seen: &[String]| -> Vec<String> {
        let inbound = seen.iter().filter(|l| l.starts_with("cluster.inbound|"));
        inbound.cloned().collect()
    };
    assert!(
        responses_seen[2].3[0].contains(
            &"cluster.outbound|9000||ext-authz.foo.svc.cluster.local.internal.upstream_rq_403 +1"
                .to_string()
        ),
        "{:?}",
        responses_seen[2]
    );
    assert_eq!(
        inbound(&responses_seen[2].3[0]),
        [
            "cluster.inbound|8080||.internal.upstream_rq_403 +1",
            "cluster.inbound|8080||.internal.upstream_rq_4xx +1",
            "cluster.inbound|8080||.internal.upstream_rq_completed +1",
            "cluster.inbound|8080||.upstream_rq_403 +1",
            "cluster.inbound|8080||.upstream_rq_4xx +1",
            "cluster.inbound|8080||.upstream_rq_completed +1",
        ]
    );
    assert_eq!(inbound(&responses_seen[3].3[0]), Vec::<String>::new());
    assert_eq!(inbound(&responses_seen[10].3[0]), Vec::<String>::new());
    // Per connection manager, each filter counting its own, the shadow counts named with
    // the filter's shadow_rules_stat_prefix.
    assert_eq!(
        rbac_seen[14].3[0],
        [
            "http.inbound_0.0.0.0_8084.rbac.allowed +1",
            "http.inbound_0.0.0.0_8084.rbac.istio_dry_run_allow_.shadow_allowed +1",
            "http.inbound_0.0.0.0_8084.rbac.istio_ext_authz_.shadow_allowed +1",
        ]
    );
    assert_eq!(
        rbac_seen[10].3[0],
        [
            "http.inbound_0.0.0.0_8084.rbac.denied +1",
            "http.inbound_0.0.0.0_8084.rbac.istio_ext_authz_.shadow_denied +1",
        ]
    );
    assert_eq!(
        rbac_seen[11].3[0],
        [
            "http.inbound_0.0.0.0_8086.rbac.allowed +1",
            "http.inbound_0.0.0.0_8086.rbac.istio_dry_run_deny_.shadow_denied +1",
            "http.inbound_0.0.0.0_8086.rbac.istio_ext_authz_.shadow_denied +1",
        ]
    );
    assert_eq!((seen[15].3 .0, &rbac_seen[15].3[0]), (200, &vec![]));
    // Nor made for the chain without filters by a request through it.
    assert!(!names(&rbac_before[0]).iter().any(|n| n.starts_with(&plain)));
    // What the filter is for, counted: on the connection manager, and on the route's cluster
    // but a request the filter does not select.
    let counted = |i: usize| seen[i].3 .1.clone();
    assert_eq!(
        counted(0),
        ["http.inbound_0.0.0.0_8080.ext_authz.disabled +1"]
    );
    assert_eq!(
        counted(1),
        [
            "cluster.inbound|8080||.ext_authz.ok +1",
            "http.inbound_0.0.0.0_8080.ext_authz.ok +1"
        ]
    );
    assert_eq!(
        counted(4),
        [
            "cluster.inbound|8082||.ext_authz.error +1",
            "cluster.inbound|8082||.ext_authz.failure_mode_allowed +1",
            "http.inbound_0.0.0.0_8082.ext_authz.error +1",
            "http.inbound_0.0.0.0_8082.ext_authz.failure_mode_allowed +1"
        ]
    );
    assert_eq!(
        counted(7),
        [
            "cluster.inbound|8083||.ext_authz.denied +1",
            "http.inbound_0.0.0.0_8083.ext_authz.denied +1"
        ]
    );
    assert_eq!(
        counted(11),
        [
            "cluster.inbound|8086||.ext_authz.ok +2",
            "http.inbound_0.0.0.0_8086.ext_authz.ok +2"
        ]
    );
    // The route before the check a direct response: counted on no cluster (and answered by
    // it); no route: not checked, not counted, 404.
    assert_eq!(
        (seen[16].3 .0, counted(16)),
        (
            200,
            vec!["http.inbound_0.0.0.0_8087.ext_authz.ok +1".to_string()]
        )
    );
    assert_eq!((seen[17].3 .0, counted(17)), (404, vec![]));
    assert_eq!((seen[18].3 .0, counted(18)), (404, vec![]));
    // The same names at the end, and in Prometheus form.
    assert_eq!(names(&before[0]), names(&before[1]), "{report}");
    assert_eq!(
        cluster_names(&before[0]),
        cluster_names(&before[1]),
        "{report}"
    );
    let prometheus = sides.map(|(net, port)| prometheus_samples(net, port, "envoy_http_inbound"));
    // The filter's, not those of istiod's shadow RBAC filter (`rbac_istio_ext_authz_`).
    let authz = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l.contains("_ext_authz") && !l.contains("_rbac_"))
            .cloned()
            .collect()
    };
    assert!(
        authz(&prometheus[0]).contains(&"envoy_http_inbound_0_0_0_0_8086_ext_authz_ok 2".into()),
        "{:#?}",
        prometheus[0]
    );
    let [remora_prom, envoy_prom] = [&prometheus[0], &prometheus[1]].map(|p| authz(p));
    let only = |a: &[String], b: &[String]| -> Vec<String> {
        a.iter().filter(|l| !b.contains(l)).cloned().collect()
    };
    assert_eq!(
        (
            only(&remora_prom, &envoy_prom),
            only(&envoy_prom, &remora_prom)
        ),
        (vec![], vec![]),
        "Remora's Prometheus samples only, then Envoy's only"
    );
    assert_eq!(remora_prom.len(), 9 * (13 + 13));
    // The clusters' (Istio's tags label a cluster only by a stat name ending in `;`).
    let clusters = sides.map(|(net, port)| {
        prometheus_samples(net, port, "envoy_cluster_inbound_")
            .into_iter()
            .filter(|l| l.contains("_ext_authz_"))
            .collect::<Vec<_>>()
    });
    assert!(
        clusters[0].contains(&"envoy_cluster_inbound_8086___ext_authz_ok 2".into()),
        "{:#?}",
        clusters[0]
    );
    assert_eq!(
        (
            only(&clusters[0], &clusters[1]),
            only(&clusters[1], &clusters[0])
        ),
        (vec![], vec![]),
        "clusters: Remora's Prometheus samples only, then Envoy's only"
    );
    // The RBAC filters' in Istio's Prometheus form, the same as Envoy's.
    let rbac = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l.contains("_rbac"))
            .cloned()
            .collect()
    };
    let [remora_rbac, envoy_rbac] = [&prometheus[0], &prometheus[1]].map(|p| rbac(p));
    assert_eq!(
        (
            only(&remora_rbac, &envoy_rbac),
            only(&envoy_rbac, &remora_rbac)
        ),
        (vec![], vec![]),
        "RBAC: Remora's Prometheus samples only, then Envoy's only"
    );
    assert!(!remora_rbac.is_empty());
    if remora_e2e::promtool::available() {
        remora_e2e::promtool::assert_valid(&remora.metrics().to_string());
    }
    drop((remora, envoy));
}
