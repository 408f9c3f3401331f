//! DNS proxying from istiod's name table, end to end: the pod's Remora runs in istiod mode with
//! DNS capture on (`ISTIO_META_DNS_CAPTURE=true`, `remora capture --redirect-dns`), asks the
//! harness's control plane for the name table (NDS) over the same ADS stream as the rest, and
//! answers the pod's queries for mesh names itself; other names still reach the pod's resolver
//! (a DNS server in the peer namespace that answers every name with one address). The clients
//! are real: `dig`, and glibc's resolver through Python's `socket.getaddrinfo`, which applies
//! the pod's resolv.conf search list and follows CNAMEs as an application's resolver does.

use remora_e2e::dns::{self, DnsServer};
use remora_e2e::istiod::ads::type_url;
use remora_e2e::istiod::{Ads, ControlPlane, PodFiles, ISTIOD_PORT};
use remora_e2e::process::run_bounded;
use remora_e2e::{has_command, skip, PodNet, DEFAULT_CAPTURE_ARGS};
use serde_json::json;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "projected-token-for-sleep";
const STEP_TIME: Duration = Duration::from_secs(30);
const DIG_TIME: Duration = Duration::from_secs(3);
/// A Kubernetes service of the pod's own namespace.
const REVIEWS: &str = "reviews.client.svc.cluster.local";
const REVIEWS_IP: &str = "10.96.0.7";
/// A ServiceEntry host without addresses, given one by istiod's auto-allocation.
const EXTERNAL: &str = "api.payments.example";
const EXTERNAL_IP: &str = "240.240.0.1";
const SEARCH: &str = "client.svc.cluster.local";

fn name_table() -> serde_json::Value {
    json!({"table": {
        REVIEWS: {"ips": [REVIEWS_IP], "registry": "Kubernetes",
            "shortname": "reviews", "namespace": "client"},
        EXTERNAL: {"ips": [EXTERNAL_IP], "registry": "External",
            "shortname": EXTERNAL, "namespace": "client"}
    }})
}

fn wait_until(what: &str, timeout: Duration, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `dig` in the pod with its whole output: (status line word, answer lines).
fn dig(net: &PodNet, args: &[&str]) -> (String, Vec<String>) {
    let mut cmd = net.pod.command("dig");
    cmd.args(["+tries=1", "+noall", "+comments", "+answer"])
        .arg(format!("+time={}", DIG_TIME.as_secs()))
        .args(args);
    let out = run_bounded(&mut cmd, DIG_TIME * 2 + Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("dig {args:?}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let status = text
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("NO ANSWER")
        .to_string();
    let answers = text
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    (status, answers)
}

/// glibc's answer for `name` (IPv4), as an application in the pod gets it.
fn getaddrinfo(net: &PodNet, name: &str) -> String {
    let script = format!(
        "import socket\nprint(sorted({{a[4][0] for a in socket.getaddrinfo({name:?}, 80, socket.AF_INET, socket.SOCK_STREAM)}}))"
    );
    let mut cmd = net.pod.command("python3");
    cmd.args(["-c", &script]);
    let out = run_bounded(&mut cmd, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("getaddrinfo {name}: {e}"));
    assert!(
        out.status.success(),
        "getaddrinfo {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn mesh_names_from_istiod(delta: bool) {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    if !has_command("dig") {
        skip::<()>("dig is missing (Debian's bind9-dnsutils)");
        return;
    }
    let PodFiles {
        ca,
        token,
        root,
        hosts: _hosts,
    } = PodFiles::write(&net, TOKEN);
    // The pod's resolv.conf as kubelet writes it, bind-mounted by `ip netns exec` over
    // /etc/resolv.conf for the application (removed with the hosts file's directory).
    let resolv = format!(
        "search {SEARCH} svc.cluster.local cluster.local\nnameserver {}\noptions ndots:5\n",
        net.peer_ip
    );
    std::fs::write(
        std::path::Path::new("/etc/netns")
            .join(net.pod.name())
            .join("resolv.conf"),
        &resolv,
    )
    .expect("the pod's resolv.conf");
    let resolv_conf = net.binary().write_file("resolv.conf", &resolv);
    let resolver = DnsServer::start(&net.peer, IpAddr::V4(net.peer_ip));
    let dns_servers = format!("--dns-servers={}", net.peer_ip);
    let mut capture = DEFAULT_CAPTURE_ARGS.to_vec();
    capture.extend_from_slice(&["--redirect-dns", &dns_servers]);
    net.capture(&capture);

    let plane = ControlPlane::start(
        &net.peer,
        net.peer_addr(ISTIOD_PORT),
        Arc::clone(&ca),
        TOKEN,
    );
    let ads: Arc<Ads> = Arc::clone(plane.ads());
    ads.set_empty();
    let mut sidecar = remora_e2e::istiod::injected_sidecar(&net)
        .config(&format!(
            "istiod:\n  token_file: {}\n  root_cert_file: {}\ndns:\n  resolv_conf: {}\n",
            token.display(),
            root.display(),
            resolv_conf.display()
        ))
        .env("ISTIO_META_DNS_CAPTURE", "true")
        .env("ISTIO_META_DNS_AUTO_ALLOCATE", "true")
        .env("ISTIO_DELTA_XDS", delta.to_string())
        .start();
    sidecar.wait_ready(STEP_TIME);
    let server = format!("@{}", net.peer_ip);

    // NDS is asked for on the same stream, with the node saying DNS capture is on; until a
    // table comes, a query gets SERVFAIL as pilot-agent answers it.
    wait_until("an NDS request", STEP_TIME, || {
        ads.requests()
            .iter()
            .any(|r| r.type_url == type_url::NAME_TABLE)
    });
    let (status, _) = dig(&net, &[&server, REVIEWS]);
    assert_eq!(status, "SERVFAIL", "{}", sidecar.stderr());

    ads.set(type_url::NAME_TABLE, "n1", &[name_table()]);
    wait_until("an ACK of the name table", STEP_TIME, || {
        ads.requests()
            .iter()
            .any(|r| r.type_url == type_url::NAME_TABLE && r.answers() && r.error_detail.is_none())
    });
    let before = resolver.queries().len();

    // FQDN, `name.namespace`, and the bare name of a service of the pod's namespace; the
    // auto-allocated address of a ServiceEntry host. TTL 30, from the table.
    for (name, ip) in [
        (REVIEWS, REVIEWS_IP),
        ("reviews.client", REVIEWS_IP),
        ("reviews.client.svc", REVIEWS_IP),
        ("reviews", REVIEWS_IP),
        (EXTERNAL, EXTERNAL_IP),
    ] {
        let (status, answers) = dig(&net, &[&server, name]);
        assert_eq!(status, "NOERROR", "{name}: {}", sidecar.stderr());
        assert_eq!(answers, [format!("{name}. 30 IN A {ip}")], "{name}");
    }
    // The same over TCP.
    let (_, answers) = dig(&net, &["+tcp", &server, "reviews"]);
    assert_eq!(answers, [format!("reviews. 30 IN A {REVIEWS_IP}")]);
    // A known name without IPv6: NOERROR and no records, not NXDOMAIN.
    let (status, answers) = dig(&net, &[&server, "AAAA", REVIEWS]);
    assert_eq!((status.as_str(), answers.len()), ("NOERROR", 0));
    // The search expansion glibc asks first: a CNAME to the name, and its address.
    let expanded = format!("{EXTERNAL}.{SEARCH}");
    let (_, answers) = dig(&net, &[&server, &expanded]);
    assert_eq!(
        answers,
        [
            format!("{expanded}. 30 IN CNAME {EXTERNAL}."),
            format!("{EXTERNAL}. 30 IN A {EXTERNAL_IP}")
        ]
    );
    assert_eq!(
        resolver.queries().len(),
        before,
        "mesh names reached the upstream resolver: {:?}",
        resolver.queries()
    );

    // An application's resolver: search list, CNAME and all.
    assert_eq!(getaddrinfo(&net, EXTERNAL), format!("['{EXTERNAL_IP}']"));
    assert_eq!(getaddrinfo(&net, "reviews"), format!("['{REVIEWS_IP}']"));
    assert_eq!(resolver.queries().len(), before, "{:?}", resolver.queries());

    // Names istiod does not know are forwarded as before, in the cluster domain too (the
    // cluster's DNS has the last word there, as behind pilot-agent).
    let answer = dns::ANSWER.to_string();
    for name in ["www.example.org", "gone.client.svc.cluster.local"] {
        let (status, answers) = dig(&net, &[&server, name]);
        assert_eq!(status, "NOERROR", "{name}");
        assert_eq!(answers, [format!("{name}. 60 IN A {answer}")], "{name}");
    }
    let forwarded: Vec<String> = resolver.queries()[before..]
        .iter()
        .map(|q| q.name.clone())
        .collect();
    assert_eq!(
        forwarded,
        ["www.example.org", "gone.client.svc.cluster.local"]
    );

    // A new table replaces the old one whole.
    ads.set(
        type_url::NAME_TABLE,
        "n2",
        &[json!({"table": {EXTERNAL: {"ips": ["240.240.0.2"], "registry": "External"}}})],
    );
    wait_until("the new table answering", STEP_TIME, || {
        dig(&net, &[&server, EXTERNAL]).1 == [format!("{EXTERNAL}. 30 IN A 240.240.0.2")]
    });
    let (_, answers) = dig(&net, &[&server, "reviews"]);
    assert_eq!(
        answers,
        [format!("reviews. 60 IN A {answer}")],
        "forwarded now"
    );

    // A table with a bad address is NACKed naming it; the one in force stays.
    ads.set(
        type_url::NAME_TABLE,
        "n3",
        &[json!({"table": {EXTERNAL: {"ips": ["not-an-ip"], "registry": "External"}}})],
    );
    wait_until("a NACK of the name table", STEP_TIME, || {
        ads.requests().iter().any(|r| {
            r.type_url == type_url::NAME_TABLE
                && r.error_detail
                    .as_deref()
                    .is_some_and(|e| e.contains("table[api.payments.example].ips[0]"))
        })
    });
    let (_, answers) = dig(&net, &[&server, EXTERNAL]);
    assert_eq!(answers, [format!("{EXTERNAL}. 30 IN A 240.240.0.2")]);
    let requests = ads.requests();
    assert!(requests.iter().all(|r| r.delta == delta), "{requests:?}");
}

#[test]
fn mesh_names_from_istiods_name_table_delta() {
    mesh_names_from_istiod(true);
}

#[test]
fn mesh_names_from_istiods_name_table_state_of_the_world() {
    mesh_names_from_istiod(false);
}
