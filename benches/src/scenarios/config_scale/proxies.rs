//! One round of each proxy: its files written, started, measured, one endpoint change.

use super::*;

pub(super) fn remora_round(
    program: &Path,
    dir: &Path,
    registry: &Registry,
    n: usize,
    pin: bool,
) -> anyhow::Result<Measured> {
    fresh_dir(dir)?;
    let xds = dir.join("xds");
    fs::create_dir_all(&xds)?;
    let ports = process::free_ports(6)?;
    let r = xds_scale::generate(n, ports[0], &Sources::Ads);
    xds_scale::write_remora_dir(&xds, &r)?;
    let endpoints = &r.endpoints;
    let config = dir.join("remora.yaml");
    fs::write(
        &config,
        format!(
            "# Written by the benchmark harness (config-scale).\n\
             bind_addresses: [127.0.0.1]\n\
             outbound:\n  port: {}\ninbound:\n  port: {}\n\
             readiness:\n  port: {}\nmetrics:\n  port: {}\nagent:\n  port: {}\n\
             admin:\n  address: 127.0.0.1:{}\n\
             xds:\n  resources_dir: {}\n  watch_interval: {REMORA_WATCH}\n",
            ports[0],
            ports[1],
            ports[2],
            ports[3],
            ports[4],
            ports[5],
            xds.display()
        ),
    )?;
    let args: Vec<String> = [
        "run",
        "--config",
        &config.display().to_string(),
        "--concurrency",
        "1",
        "--log-level",
        "info",
    ]
    .map(String::from)
    .to_vec();
    let log = dir.join("remora.log");
    let cpu = pin.then_some(PROXY_CPU);
    let started = Instant::now();
    let mut proxy = process::spawn(registry, "remora", cpu, program, &args, &log)?;
    wait_until(&mut proxy, APPLY_TIMEOUT, || {
        http_status(ports[2], "/healthz/ready") == Some(200)
    })
    .context("Remora did not become ready")?;
    let applied = started.elapsed();
    let at_ready = proxy.usage();
    let loaded = log_lines(&log, REMORA_LOADED)
        .first()
        .cloned()
        .unwrap_or_else(|| format!("no `{REMORA_LOADED}` line in its log"));
    let mut m = settle(&proxy, applied, &at_ready);
    m.loaded = summarize_remora(&loaded, &r);

    // One endpoint change: Remora re-reads the whole directory, so the new endpoints file is
    // all that is rewritten.
    let mut changed = endpoints.clone();
    changed[0] = xds_scale::endpoints(&Service::new(0), 1);
    let before_lines = log_lines(&log, REMORA_REAPPLIED).len();
    let path = xds.join("endpoints.json");
    let tmp = stage(&path, &Value::Array(changed))?;
    let before = proxy.usage();
    let t = Instant::now();
    fs::rename(&tmp, &path)?;
    wait_until(&mut proxy, CHANGE_TIMEOUT, || {
        log_lines(&log, REMORA_REAPPLIED).len() > before_lines
    })
    .context("Remora did not apply the endpoint change")?;
    m.change_ms = Some(t.elapsed().as_secs_f64() * 1e3);
    m.change_cpu_ms = Some(proxy.usage().cpu_seconds_since(&before) * 1e3);
    m.peak_rss_mib = peak_rss_mib(proxy.pid());
    if let Some(line) = log_lines(&log, REMORA_REAPPLIED).last() {
        if !line.contains("refused=0") {
            m.loaded.push_str(&format!("; change: {}", brief(line)));
        }
    }
    Ok(m)
}

/// The counts Remora logged against those written, and any refusal.
fn summarize_remora(line: &str, r: &Resources) -> String {
    let field = |key: &str| -> Option<usize> {
        let at = line.find(&format!("{key}="))? + key.len() + 1;
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let want = [
        ("listeners", r.listeners.len()),
        ("clusters", r.clusters.len()),
        ("routes", r.routes.len()),
        ("endpoints", r.endpoints.len()),
    ];
    let mut out = vec![];
    for (key, written) in want {
        match field(key) {
            Some(got) if got == written => out.push(format!("{got} {key}")),
            Some(got) => out.push(format!("{got} of {written} {key} loaded")),
            None => return format!("log: {}", brief(line)),
        }
    }
    match field("refused") {
        Some(0) => {}
        Some(k) => out.push(format!("{k} REFUSED (see remora.log)")),
        None => out.push("refusals not logged".into()),
    }
    out.join(", ")
}

pub(super) fn envoy_round(
    program: &Path,
    dir: &Path,
    registry: &Registry,
    n: usize,
    pin: bool,
) -> anyhow::Result<Measured> {
    fresh_dir(dir)?;
    let certs = crate::mesh_certs::generate(&dir.join("certs"))?;
    let sidecar = &certs.client_dir;
    let sources = Sources::Files {
        routes: dir.join("rds.json"),
        cert: dir.join("sds-default.json"),
        root: dir.join("sds-rootca.json"),
    };
    let secret = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
    let file = |name: &str| sidecar.join(name).display().to_string();
    write_atomically(
        &dir.join("sds-default.json"),
        &discovery_response(
            &[
                serde_json::json!({"@type": secret, "name": "default", "tls_certificate": {
            "certificate_chain": {"filename": file(crate::mesh_certs::CERT_CHAIN)},
            "private_key": {"filename": file(crate::mesh_certs::KEY)}}}),
            ],
            1,
        ),
    )?;
    write_atomically(
        &dir.join("sds-rootca.json"),
        &discovery_response(
            &[
                serde_json::json!({"@type": secret, "name": "ROOTCA", "validation_context": {
            "trusted_ca": {"filename": file(crate::mesh_certs::ROOT_CERT)}}}),
            ],
            1,
        ),
    )?;
    let ports = process::free_ports(2)?;
    let r = xds_scale::generate(n, ports[0], &sources);
    write_atomically(&dir.join("rds.json"), &discovery_response(&r.routes, 1))?;
    write_atomically(&dir.join("lds.json"), &discovery_response(&r.listeners, 1))?;
    write_atomically(&dir.join("cds.json"), &discovery_response(&r.clusters, 1))?;
    let source = |name: &str| {
        format!(
            "{{path_config_source: {{path: {}}}, resource_api_version: V3}}",
            dir.join(name).display()
        )
    };
    let config = dir.join("envoy.yaml");
    fs::write(
        &config,
        format!(
            "# Written by the benchmark harness (config-scale).\n\
             node: {{id: sidecar~127.0.0.1~bench.ns~ns.svc.cluster.local, cluster: bench.ns}}\n\
             admin:\n  address: {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}\n\
             dynamic_resources:\n  lds_config: {}\n  cds_config: {}\n",
            ports[1],
            source("lds.json"),
            source("cds.json")
        ),
    )?;
    let mut args = envoy_args_with(&config, 1);
    // Info, not the other scenarios' warn: the CDS update's log line is the change's signal.
    if let Some(i) = args.iter().position(|a| a == "--log-level") {
        args[i + 1] = "info".into();
    }
    let log = dir.join("envoy.log");
    let cpu = pin.then_some(PROXY_CPU);
    let started = Instant::now();
    let mut proxy = process::spawn(registry, "envoy", cpu, program, &args, &log)?;
    wait_until(&mut proxy, APPLY_TIMEOUT, || {
        http_status(ports[1], "/ready") == Some(200)
    })
    .context("Envoy did not become ready")?;
    let applied = started.elapsed();
    let at_ready = proxy.usage();
    let mut m = settle(&proxy, applied, &at_ready);
    // Read after memory: scanning Envoy's stats allocates.
    let stats = http_body(
        ports[1],
        "/stats?filter=^(cluster_manager%5C.(active_clusters|warming_clusters|cds%5C.update_rejected)|listener_manager%5C.(total_listeners_active|lds%5C.update_rejected)|http%5C.outbound_0%5C.0%5C.0%5C.0_8080%5C.rds%5C.8080%5C.update_(success|rejected))$",
    )
    .unwrap_or_default();
    m.loaded = summarize_envoy(&stats, &r);

    // One endpoint change: Envoy's clusters carry their endpoints, so the CDS file is
    // rewritten with service 0's cluster changed (Envoy skips the unmodified ones).
    let mut clusters = r.clusters.clone();
    let moved = xds_scale::endpoints(&Service::new(0), 1);
    clusters[0]["load_assignment"]["endpoints"] = moved["endpoints"].clone();
    let before_lines = log_lines(&log, ENVOY_CDS_APPLIED).len();
    let path = dir.join("cds.json");
    let tmp = stage(&path, &discovery_response(&clusters, 2))?;
    let before = proxy.usage();
    let t = Instant::now();
    fs::rename(&tmp, &path)?;
    wait_until(&mut proxy, CHANGE_TIMEOUT, || {
        log_lines(&log, ENVOY_CDS_APPLIED).len() > before_lines
    })
    .context("Envoy did not apply the endpoint change")?;
    m.change_ms = Some(t.elapsed().as_secs_f64() * 1e3);
    m.change_cpu_ms = Some(proxy.usage().cpu_seconds_since(&before) * 1e3);
    m.peak_rss_mib = peak_rss_mib(proxy.pid());
    if let Some(line) = log_lines(&log, ENVOY_CDS_APPLIED).last() {
        if !line.contains("added/updated 1 cluster(s)") {
            m.loaded.push_str(&format!("; change: {}", brief(line)));
        }
    }
    Ok(m)
}

/// Envoy's counters against what was written.
fn summarize_envoy(stats: &str, r: &Resources) -> String {
    let stat = |name: &str| -> Option<u64> {
        stats.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(": ")?
                .trim()
                .parse()
                .ok()
        })
    };
    let mut out = vec![];
    let active = stat("listener_manager.total_listeners_active");
    let clusters = stat("cluster_manager.active_clusters");
    for (what, got, written) in [
        ("listeners", active, r.listeners.len()),
        ("clusters", clusters, r.clusters.len()),
    ] {
        match got {
            Some(g) if g as usize == written => out.push(format!("{g} {what} active")),
            Some(g) => out.push(format!("{g} of {written} {what} active")),
            None => out.push(format!("{what}: no stat")),
        }
    }
    match stat("http.outbound_0.0.0.0_8080.rds.8080.update_success") {
        Some(k) if k > 0 => out.push("route table 8080 loaded".into()),
        _ => out.push("route table 8080 NOT loaded".into()),
    }
    for rejected in [
        "cluster_manager.cds.update_rejected",
        "listener_manager.lds.update_rejected",
    ] {
        if stat(rejected).unwrap_or(0) > 0 {
            out.push(format!("{rejected} > 0 (see envoy.log)"));
        }
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remoras_log_line_is_checked_against_what_was_written() {
        let r = xds_scale::generate(10, 15001, &Sources::Ads);
        let ok = "INFO remora::xds_files: xDS resources loaded from files dir=/x listeners=3 clusters=12 routes=1 endpoints=10 refused=0";
        assert_eq!(
            summarize_remora(ok, &r),
            "3 listeners, 12 clusters, 1 routes, 10 endpoints"
        );
        let short = ok
            .replace("routes=1", "routes=0")
            .replace("refused=0", "refused=1");
        let s = summarize_remora(&short, &r);
        assert!(
            s.contains("0 of 1 routes loaded") && s.contains("1 REFUSED"),
            "{s}"
        );
    }

    #[test]
    fn envoys_counters_are_checked_against_what_was_written() {
        let r = xds_scale::generate(10, 15001, &Sources::Ads);
        let stats = "cluster_manager.active_clusters: 12\ncluster_manager.cds.update_rejected: 0\nhttp.outbound_0.0.0.0_8080.rds.8080.update_success: 1\nlistener_manager.total_listeners_active: 2\n";
        let s = summarize_envoy(stats, &r);
        assert_eq!(
            s,
            "2 of 3 listeners active, 12 clusters active, route table 8080 loaded"
        );
    }
}
