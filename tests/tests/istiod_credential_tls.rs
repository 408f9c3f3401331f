//! TLS origination with a DestinationRule's `credentialName`, end to end: istiod writes the
//! cluster's TLS with SDS references to the ADS stream (`kubernetes://NAME` for the client
//! certificate, `kubernetes://NAME-cacert` for the roots) and serves those secrets itself
//! (pilot/pkg/xds/sds.go). The pod's sidecar, behind `remora capture`, takes its certificate,
//! its configuration and those secrets from the harness's control plane (`remora_e2e::istiod`,
//! gRPC over TLS in the peer namespace) and originates MUTUAL TLS to an origin outside the
//! mesh (Python's `ssl`, i.e. OpenSSL, requiring a client certificate of its CA). A real
//! Envoy 1.40, given the same resources over ADS by its own control plane, is the oracle.
//!
//! Per proxy, in order, each outcome compared with Envoy's and with the expected one:
//! - the request reaches the origin with the DestinationRule's SNI and the client
//!   certificate of the secret (its names seen by the origin);
//! - the secret is rotated (a certificate with another name): the next connections present
//!   the new one;
//! - a cluster added later whose endpoints are held back warms, as Envoy's does: listed
//!   under `dynamic_warming_clusters`, its requests answered 503 `NC`; once its endpoints are
//!   served it is in force and reaches the origin;
//! - a secret whose key does not match its certificate is NACKed (Remora names the resource
//!   and the field) and the running one stays: requests still present the rotated one;
//! - a cluster added later naming a secret istiod does not have warms, as Envoy's does: it is
//!   listed under `/config_dump`'s `dynamic_warming_clusters`, and its requests find no
//!   cluster (503, access-log flag `NC`), nothing reaching the origin;
//! - the other cluster is still served meanwhile;
//! - once the secret's initial fetch times out (Envoy's 15 s default, which istiod's
//!   `SDSAdsConfig` leaves in place) the cluster is in force without it and its connections
//!   fail (503 `UF`);
//! - at the end, each secret's SDS counters in `/stats` (`sds.<name>.update_success`,
//!   `update_rejected`, `update_attempt`, `update_failure`, `init_fetch_timeout`) are
//!   Envoy's.
//!
//! Envoy's NACK of the mismatched key says what failed (`Failed to load private key from
//! <inline>, … KEY_VALUES_MISMATCH`) without the resource; Remora's names the secret and the
//! field, which the test checks.

mod credential_tls;

use credential_tls::*;
use remora_e2e::certs::MeshCa;
use remora_e2e::envoy::Envoy;
use remora_e2e::http_client;
use remora_e2e::istiod::ads::type_url;
use remora_e2e::istiod::secrets::{credential, credential_roots};
use remora_e2e::istiod::{Ads, ControlPlane, HostsFile, ISTIOD_HOST, ISTIOD_PORT};
use remora_e2e::service::{peer_program, Service};
use remora_e2e::PodNet;
use serde_json::Value;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The per-secret SDS counters on which Remora follows Envoy along this story.
const SDS_COMPARED: [&str; 5] = [
    "update_success",
    "update_rejected",
    "init_fetch_timeout",
    "update_attempt",
    "update_failure",
];

/// What a proxy shows besides its answers: its access log and its admin pages.
struct Views<'a> {
    access_log: &'a dyn Fn() -> String,
    admin: &'a dyn Fn(&str) -> String,
}

impl Views<'_> {
    /// The response flags of the last request to `host` logged (waiting a little for the line:
    /// a proxy logs after it answered).
    fn flags(&self, host: &str, before: usize) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = (self.access_log)();
            let found = log
                .lines()
                .filter(|l| l.starts_with("ACCESS ") && l.ends_with(host))
                .nth(before)
                .and_then(|l| l.split(' ').nth(2).map(str::to_string));
            if found.is_some() || Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// How many requests to `host` were logged.
    fn logged(&self, host: &str) -> usize {
        (self.access_log)()
            .lines()
            .filter(|l| l.starts_with("ACCESS ") && l.ends_with(host))
            .count()
    }

    /// Envoy's per-secret SDS counters from `/stats` (`sds.<name>.<counter>: value`) that the
    /// two proxies are compared on, sorted by name.
    fn sds_stats(&self) -> Vec<(String, u64)> {
        let mut stats: Vec<(String, u64)> = (self.admin)("/stats")
            .lines()
            .filter(|l| l.starts_with("sds."))
            .filter_map(|l| {
                let (name, value) = l.split_once(": ")?;
                let compared = SDS_COMPARED
                    .iter()
                    .any(|c| name.ends_with(&format!(".{c}")));
                compared.then(|| Some((name.to_string(), value.trim().parse().ok()?)))?
            })
            .collect();
        stats.sort();
        stats
    }

    /// The clusters `/config_dump` lists as warming.
    fn warming(&self) -> Vec<String> {
        let dump: Value =
            serde_json::from_str(&(self.admin)("/config_dump")).unwrap_or(Value::Null);
        dump["configs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| {
                c["@type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("ClustersConfigDump"))
            })
            .flat_map(|c| {
                c["dynamic_warming_clusters"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|c| c["cluster"]["name"].as_str().map(str::to_string))
            .collect()
    }
}

/// One pod and what it talks to: its control plane (its own CA for the workload and
/// istiod's serving certificate), and the origin in the peer namespace.
struct World {
    plane: ControlPlane,
    _origin: Service,
    _hosts: HostsFile,
    mesh_root: PathBuf,
    token: PathBuf,
    origin_ca: MeshCa,
    client_ca: MeshCa,
}

fn world(net: &PodNet) -> World {
    net.capture_default();
    for (ns, args) in [
        (&net.pod, vec!["route", "add", "default", "dev", "eth0"]),
        (&net.peer, vec!["addr", "add", "10.1.0.2/32", "dev", "eth0"]),
    ] {
        let out = ns.command("ip").args(&args).output().expect("ip");
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    }
    let mesh = Arc::new(MeshCa::new("cluster.local"));
    let origin_ca = MeshCa::new("origin CA");
    let client_ca = MeshCa::new("client CA");
    let dir = net.binary().make_dir("origin");
    let server = origin_ca.dns_server(ORIGIN_NAME);
    let files = [
        ("cert.pem", server.chain.as_str()),
        ("key.pem", server.key.as_str()),
        ("client-ca.pem", &client_ca.root_pem()),
    ];
    for (name, pem) in files {
        std::fs::write(dir.join(name), pem).expect("write the origin's files");
    }
    let script = peer_program("tls_origin.py");
    let path = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let origin = Service::start(
        &net.peer,
        "python3",
        &[
            &script.to_string_lossy(),
            &ORIGIN_PORT.to_string(),
            &path("cert.pem"),
            &path("key.pem"),
            &path("client-ca.pem"),
        ],
        SocketAddr::from((ORIGIN_IP, ORIGIN_PORT)),
    );
    let token = net
        .binary()
        .write_file("istio-token", &format!("{TOKEN}\n"));
    let mesh_root = net.binary().write_file("root-cert.pem", &mesh.root_pem());
    let hosts = HostsFile::write(&net.pod, &[(net.peer_ip.into(), ISTIOD_HOST)])
        .expect("name istiod inside the pod");
    let plane = ControlPlane::start(&net.peer, net.peer_addr(ISTIOD_PORT), mesh, TOKEN);
    World {
        plane,
        _origin: origin,
        _hosts: hosts,
        mesh_root,
        token,
        origin_ca,
        client_ca,
    }
}

/// What one request came to: the status, and from the origin's answer the SNI it saw and the
/// names of the client certificate presented.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    status: u16,
    sni: Option<String>,
    client: Vec<String>,
    /// The access log's response flags, where the step looks at them.
    flags: Option<String>,
    /// The clusters `/config_dump` lists as warming, where the step looks at them.
    warming: Vec<String>,
}

/// `GET` through the sidecar. The origin closes the connection after each answer
/// (`/close-delimited`), so every request is a new upstream connection: a rotated secret
/// applies to new connections (in Envoy too), never to one already pooled.
fn get(net: &PodNet, host: &str) -> Outcome {
    let r = http_client::get_once(
        &net.pod,
        SocketAddr::from((VIP, 80)),
        host,
        "/close-delimited",
        &[],
    );
    let (status, body) = match r {
        Ok(r) => (r.status, r.text()),
        Err(_) => (0, String::new()),
    };
    let origin: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    Outcome {
        status,
        sni: origin["sni"].as_str().map(str::to_string),
        client: origin["client"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        flags: None,
        warming: Vec::new(),
    }
}

/// `get`, with the flags the access log gives the request and the warming clusters.
fn get_logged(net: &PodNet, host: &str, views: &Views) -> Outcome {
    let before = views.logged(host);
    let mut outcome = get(net, host);
    outcome.flags = views.flags(host, before);
    outcome.warming = views.warming();
    outcome
}

fn ok(client: &[&str]) -> Outcome {
    Outcome {
        status: 200,
        sni: Some(ORIGIN_NAME.into()),
        client: client.iter().map(|s| s.to_string()).collect(),
        flags: None,
        warming: Vec::new(),
    }
}

/// Requests `host` until the outcome is `want` (bounded); the last outcome.
fn until(net: &PodNet, host: &str, want: &Outcome) -> Outcome {
    let deadline = Instant::now() + STEP_TIME;
    loop {
        let got = get(net, host);
        if got == *want || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + STEP_TIME;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {STEP_TIME:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The NACKs of secrets so far.
fn secret_nacks(ads: &Ads) -> Vec<String> {
    ads.requests()
        .into_iter()
        .filter(|r| r.type_url == type_url::SECRET)
        .filter_map(|r| r.error_detail)
        .collect()
}

/// The steps of the module's story through the sidecar of `net`, once it is configured:
/// (what, outcome) per step.
fn story(net: &PodNet, world: &World, views: &Views) -> Vec<(&'static str, Outcome)> {
    let ads = world.plane.ads();
    let mut steps = Vec::new();
    steps.push(("first", until(net, HOST, &ok(&[CLIENT_NAME]))));

    // Rotation: a certificate that also names ROTATED_NAME.
    let rotated = world.client_ca.dns_names(&[CLIENT_NAME, ROTATED_NAME]);
    serve_secrets(
        ads,
        "v2",
        (&rotated.chain, &rotated.key),
        &world.origin_ca.root_pem(),
    );
    steps.push((
        "rotated",
        until(net, HOST, &ok(&[CLIENT_NAME, ROTATED_NAME])),
    ));

    // A new cluster whose endpoints have not arrived warms (its initial fetch timeout, 15 s,
    // is far off), then goes in force when they do. Before the refused key below: Envoy
    // NACKs a cluster added after it refused a secret the cluster names.
    let late = [(HOST, CREDENTIAL), (LATE_HOST, CREDENTIAL)];
    serve_config_withholding(ads, "v2", &late, &[LATE_HOST]);
    wait_until("the late cluster's endpoints asked for", || {
        ads.requests().iter().any(|r| {
            r.type_url == type_url::ENDPOINT && r.resource_names.contains(&cluster_name(LATE_HOST))
        })
    });
    steps.push((
        "endpoints withheld: the cluster warms",
        get_logged(net, LATE_HOST, views),
    ));
    serve_config(ads, "v3", &late);
    steps.push((
        "endpoints served: the cluster is in force",
        until(net, LATE_HOST, &ok(&[CLIENT_NAME, ROTATED_NAME])),
    ));

    // A key that is not the certificate's: refused, the rotated one stays.
    let other = world.client_ca.dns_server(CLIENT_NAME);
    let before = secret_nacks(ads).len();
    serve_secrets(
        ads,
        "v3",
        (&rotated.chain, &other.key),
        &world.origin_ca.root_pem(),
    );
    wait_until("the mismatched secret NACKed", || {
        secret_nacks(ads).len() > before
    });
    steps.push(("mismatched key refused", get(net, HOST)));

    // A cluster naming a secret istiod does not have.
    serve_config(
        ads,
        "v4",
        &[
            (HOST, CREDENTIAL),
            (LATE_HOST, CREDENTIAL),
            (PENDING_HOST, ABSENT),
        ],
    );
    wait_until("the absent secret asked for", || {
        ads.requests().iter().any(|r| {
            r.type_url == type_url::SECRET && r.resource_names.contains(&credential(ABSENT))
        })
    });
    steps.push((
        "secret never served: the cluster warms",
        get_logged(net, PENDING_HOST, views),
    ));
    steps.push(("the other cluster still served", get(net, HOST)));
    // The secret's initial fetch times out: the cluster goes in force without it.
    let deadline = Instant::now() + STEP_TIME;
    while !views.warming().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    steps.push((
        "after the initial fetch timeout",
        get_logged(net, PENDING_HOST, views),
    ));
    steps
}

fn expected() -> Vec<(&'static str, Outcome)> {
    let failed = |flags: &str, warming: &[&str]| Outcome {
        status: 503,
        sni: None,
        client: vec![],
        flags: Some(flags.into()),
        warming: warming.iter().map(|s| s.to_string()).collect(),
    };
    vec![
        ("first", ok(&[CLIENT_NAME])),
        ("rotated", ok(&[CLIENT_NAME, ROTATED_NAME])),
        (
            "endpoints withheld: the cluster warms",
            failed("NC", &[&cluster_name(LATE_HOST)]),
        ),
        (
            "endpoints served: the cluster is in force",
            ok(&[CLIENT_NAME, ROTATED_NAME]),
        ),
        ("mismatched key refused", ok(&[CLIENT_NAME, ROTATED_NAME])),
        (
            "secret never served: the cluster warms",
            failed("NC", &[&cluster_name(PENDING_HOST)]),
        ),
        (
            "the other cluster still served",
            ok(&[CLIENT_NAME, ROTATED_NAME]),
        ),
        ("after the initial fetch timeout", failed("UF", &[])),
    ]
}

/// The first configuration and secrets.
fn serve_first(world: &World) {
    let client = world.client_ca.dns_server(CLIENT_NAME);
    serve_secrets(
        world.plane.ads(),
        "v1",
        (&client.chain, &client.key),
        &world.origin_ca.root_pem(),
    );
    serve_config(world.plane.ads(), "v1", &[(HOST, CREDENTIAL)]);
}

/// The steps of the story, and the proxy's per-secret SDS counters at its end.
type Told = (Vec<(&'static str, Outcome)>, Vec<(String, u64)>);

fn remora_story(net: &PodNet) -> Told {
    let world = world(net);
    serve_first(&world);
    let sidecar = remora_e2e::istiod::injected_sidecar(net)
        .config(&format!(
            "istiod:\n  token_file: {}\n  root_cert_file: {}\n",
            world.token.display(),
            world.mesh_root.display(),
        ))
        .start_ready();
    let ads = world.plane.ads();
    // Asked for as Envoy asks: both names, on the ADS stream, once the cluster named them.
    let asked: Vec<String> = ads
        .requests()
        .into_iter()
        .filter(|r| r.type_url == type_url::SECRET)
        .flat_map(|r| r.resource_names)
        .collect();
    for name in [credential(CREDENTIAL), credential_roots(CREDENTIAL)] {
        assert!(asked.contains(&name), "{name} not asked for: {asked:?}");
    }
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, remora_e2e::ADMIN_PORT));
    let access_log = || sidecar.stdout();
    let admin_page = |path: &str| {
        remora_e2e::peer::http_get(&net.pod, admin, path, STEP_TIME)
            .map(|r| r.body)
            .unwrap_or_default()
    };
    let views = Views {
        access_log: &access_log,
        admin: &admin_page,
    };
    let steps = story(net, &world, &views);
    // The config dump lists them as Envoy's does, the key redacted.
    let dump = remora_e2e::peer::http_get(&net.pod, admin, "/config_dump", STEP_TIME)
        .map(|r| r.body)
        .unwrap_or_default();
    let dump: Value = serde_json::from_str(&dump).unwrap_or(Value::Null);
    let secrets = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| {
            c["@type"]
                .as_str()
                .is_some_and(|t| t.ends_with("SecretsConfigDump"))
        })
        .map(|c| c["dynamic_active_secrets"].clone())
        .unwrap_or(Value::Null);
    let named = |n: &str| {
        secrets
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == n)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        named(&credential(CREDENTIAL))["secret"]["tls_certificate"]["private_key"]["inline_bytes"],
        "W3JlZGFjdGVkXQ==",
        "the key shown redacted: {secrets}"
    );
    assert!(
        named(&credential_roots(CREDENTIAL))["secret"]["validation_context"]["trusted_ca"]
            .is_object(),
        "{secrets}"
    );
    let nacks = secret_nacks(ads);
    assert!(
        nacks.iter().any(|n| n.contains(&format!(
            "secret {}: tls_certificate.private_key: does not match",
            credential(CREDENTIAL)
        ))),
        "the NACK names the resource and the field: {nacks:?}"
    );
    let logs = sidecar.stderr();
    assert!(
        logs.contains(&credential(ABSENT)) && logs.contains("not received from the control plane"),
        "the failed connection names the secret awaited:\n{logs}"
    );
    (steps, views.sds_stats())
}

fn envoy_story(net: &PodNet, binary: &std::path::Path) -> Told {
    let world = world(net);
    serve_first(&world);
    let envoy = Envoy::start_sidecar(
        &net.pod,
        binary,
        net.binary(),
        &remora_e2e::istiod::envoy_bootstrap(net, &world.mesh_root, TOKEN, true).to_string(),
    );
    let access_log = || envoy.logs();
    let admin_page = |path: &str| envoy.admin(path).1;
    let views = Views {
        access_log: &access_log,
        admin: &admin_page,
    };
    let steps = story(net, &world, &views);
    assert!(
        !secret_nacks(world.plane.ads()).is_empty(),
        "Envoy NACKs the mismatched key too:\n{}",
        envoy.logs()
    );
    (steps, views.sds_stats())
}

#[test]
fn credential_name_secrets_from_istiod_originate_as_envoy_does() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let (remora, remora_sds) = remora_story(&net);
    assert_eq!(remora, expected(), "Remora");
    // Each secret counts its own updates, under its stat name: the certificate's refused key
    // is a rejection, and the secret never served timed out.
    let stat = |name: &str, counter: &str| {
        let name = format!("sds.kubernetes_{name}.{counter}");
        remora_sds.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    };
    assert!(
        stat(CREDENTIAL, "update_success") >= Some(2),
        "{remora_sds:?}"
    );
    assert_eq!(
        stat(CREDENTIAL, "update_rejected"),
        Some(1),
        "{remora_sds:?}"
    );
    assert_eq!(
        stat(ABSENT, "init_fetch_timeout"),
        Some(1),
        "{remora_sds:?}"
    );
    let Some(binary) = remora_e2e::envoy::binary_or_skip() else {
        return;
    };
    let Some(envoy_net) = PodNet::create_or_skip() else {
        return;
    };
    let (envoy, envoy_sds) = envoy_story(&envoy_net, &binary);
    assert_eq!(remora, envoy, "Remora and Envoy");
    assert_eq!(
        remora_sds, envoy_sds,
        "per-secret SDS statistics of Remora and Envoy"
    );
}
