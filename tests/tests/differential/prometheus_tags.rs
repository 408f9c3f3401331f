//! Envoy's statistics in Prometheus form, compared with Envoy 1.40's under pilot-agent's
//! bootstrap tags ([`remora_e2e::envoy_xds::istio_stats_config`]): after the same traffic
//! through both, every statistic both print on `/stats` (by its dotted name) must have, on
//! Remora's `/stats/prometheus`, the sample name and labels Envoy gives it. Envoy's sample for
//! one statistic is read with its `filter`, which Envoy matches against the dotted name.

use super::differential::{TCP_VIP, WEB};
use super::{worlds, World};
use remora_e2e::envoy_xds::nets_or_skip;
use remora_e2e::peer;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

/// Requests that give the statistics values and make the per-code ones: a 200, cors origins
/// allowed and refused, a fault's abort, no endpoint, no route, no cluster.
const TRAFFIC: &[(&str, &[(&str, &str)])] = &[
    ("/", &[]),
    ("/cors", &[("origin", "https://a.example")]),
    ("/cors", &[("origin", "https://evil.example")]),
    ("/cors-fault", &[("origin", "https://a.example")]),
    ("/no-endpoint", &[]),
    ("/cors-no-cluster", &[("origin", "https://a.example")]),
];

/// A sample's name and its labels, sorted (Envoy writes no labels as `{}`).
fn sample(line: &str) -> Option<String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let head = line.rsplit_once(' ')?.0;
    let Some((name, labels)) = head.split_once('{') else {
        return Some(head.to_string());
    };
    let labels = labels.strip_suffix('}')?;
    let mut each: Vec<String> = labels
        .split("\",")
        .filter(|l| !l.is_empty())
        .map(|l| l.trim_end_matches('"').to_string() + "\"")
        .collect();
    each.sort();
    Some(match each.is_empty() {
        true => name.to_string(),
        false => format!("{name}{{{}}}", each.join(",")),
    })
}

/// `^name$` as an expression, percent-encoded for a query.
fn exact_filter(name: &str) -> String {
    let mut re = String::from("^");
    for c in name.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            re.push('\\');
        }
        re.push(c);
    }
    re.push('$');
    re.bytes()
        .map(|b| match b.is_ascii_alphanumeric() || b == b'_' {
            true => char::from(b).to_string(),
            false => format!("%{b:02X}"),
        })
        .collect()
}

/// The dotted names on `/stats`.
fn dotted(w: &World) -> BTreeSet<String> {
    w.admin("/stats")
        .lines()
        .filter_map(|l| Some(l.split_once(": ")?.0.to_string()))
        .collect()
}

/// Envoy's samples of each of `names`, each read with `/stats/prometheus?filter=^name$`, in
/// one curl.
fn envoy_samples(envoy: &World, names: &[&String]) -> BTreeMap<String, BTreeSet<String>> {
    const END: &str = "\n<end of scrape>\n";
    let urls: Vec<String> = names
        .iter()
        .map(|n| {
            format!(
                "http://127.0.0.1:{}/stats/prometheus?filter={}",
                remora_e2e::envoy::ADMIN_PORT,
                exact_filter(n)
            )
        })
        .collect();
    let mut args = vec!["-w", END];
    args.extend(urls.iter().map(String::as_str));
    let out = peer::curl(&envoy.net.pod, &args, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    let scrapes: Vec<&str> = text.split(END).collect();
    assert!(scrapes.len() > names.len(), "envoy's scrapes: {text}");
    names
        .iter()
        .zip(scrapes)
        .map(|(n, s)| (n.to_string(), s.lines().filter_map(sample).collect()))
        .collect()
}

#[test]
fn envoy_statistics_have_envoys_prometheus_names_and_labels() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = worlds(&nets, &binary);
    for w in [&remora, &envoy] {
        for (path, headers) in TRAFFIC {
            w.get(WEB, path, headers);
        }
        w.get("nowhere.test", "/", &[]);
        let tcp: SocketAddr = TCP_VIP.parse().expect("addr");
        peer::echo_exchange(&w.net.pod, tcp, b"hello").expect("tcp echo");
    }
    let (remora_names, envoy_names) = (dotted(&remora), dotted(&envoy));
    let common: Vec<&String> = remora_names.intersection(&envoy_names).collect();
    let expected = envoy_samples(&envoy, &common);
    let remora_text = remora.admin("/stats/prometheus");
    let remora_samples: BTreeSet<String> = remora_text
        .lines()
        .filter(|l| l.starts_with("envoy_"))
        .filter_map(sample)
        .collect();
    let mut differences = Vec::new();
    for (name, samples) in &expected {
        // Envoy's histograms (`_bucket`, `_sum`, `_count`) Remora does not keep.
        if samples.iter().any(|s| s.contains("_bucket")) {
            continue;
        }
        if samples.is_empty() {
            differences.push(format!("{name}: envoy printed no sample"));
        }
        for s in samples.iter().filter(|s| !remora_samples.contains(*s)) {
            differences.push(format!("{name}: envoy prints {s}, remora does not"));
        }
    }
    // One sample for each of Remora's statistics: none printed in another form as well. (The
    // certificates' expiry, `envoy_server_days_until_first_cert_expiring`, is the TLS
    // metrics' and not on `/stats`.)
    let remora_count = remora_text
        .lines()
        .filter(|l| l.starts_with("envoy_"))
        .filter(|l| !l.starts_with("envoy_server_days_until_first_cert_expiring"))
        .count();
    if remora_count != remora_names.len() {
        differences.push(format!(
            "{remora_count} envoy_ samples on remora's /stats/prometheus, {} names on its /stats:\n{remora_text}",
            remora_names.len()
        ));
    }
    let only_remora: Vec<&String> = remora_names.difference(&envoy_names).collect();
    eprintln!(
        "{} statistics compared; remora's alone (not in this envoy): {only_remora:?}",
        expected.len()
    );
    // The comparison reached every kind of name: the connection manager's own and its
    // filters', the clusters' per-code counts and membership, the listeners, tcp_proxy's
    // cluster, the server's memory, the managers' change counts.
    for needle in [
        "http.outbound_0.0.0.0_80.cors.origin_valid",
        "http.outbound_0.0.0.0_80.fault.aborts_injected",
        ".upstream_rq_200",
        ".upstream_rq_2xx",
        "listener.0.0.0.0_15001.downstream_cx_total",
        "cluster.outbound|9000||echo.test.svc.cluster.local.upstream_cx_total",
        "cluster.outbound|9000||echo.test.svc.cluster.local.membership_healthy",
        "http.outbound_0.0.0.0_80.downstream_rq_2xx",
        "listener.0.0.0.0_80.http.outbound_0.0.0.0_80.downstream_rq_2xx",
        "server.memory_allocated",
        "server.memory_heap_size",
        "server.memory_physical_size",
        "cluster_manager.cluster_added",
        "listener_manager.listener_in_place_updated",
    ] {
        assert!(
            expected.keys().any(|n| n.contains(needle)),
            "no {needle} compared: {:?}",
            expected.keys()
        );
    }
    assert!(
        differences.is_empty(),
        "{} of {} statistics differ from Envoy's Prometheus form:\n{}",
        differences.len(),
        expected.len(),
        differences.join("\n")
    );
}
