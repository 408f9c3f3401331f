//! Capture beyond the defaults, end to end: DNS capture answered by Remora's forwarder, IPv6 and
//! dual-stack pods, `--run-validation`, the native nftables backend, and TPROXY inbound.

use remora_e2e::dns::{self, DnsServer, Transport};
use remora_e2e::peer::{self, any_addr, curl_ok, Server};
use remora_e2e::process::run_bounded;
use remora_e2e::{has_command, skip, PodNet, DEFAULT_CAPTURE_ARGS};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

const OPENED: &str = "remora_connections_opened_total";
const ACTIVE: &str = "remora_connections_active";
const LOOP_REFUSED: &str = "remora_loop_refused_total";
const OUTBOUND: (&str, &str) = ("direction", "outbound");
const INBOUND: (&str, &str) = ("direction", "inbound");
const DNS_REQUESTS: &str = "istio_agent_dns_requests_total";
const DNS_UPSTREAM: &str = "istio_agent_dns_upstream_requests_total";
const DNS_FAILURES: &str = "istio_agent_dns_upstream_failures_total";

/// Bound on a counter catching up with traffic that has already finished.
const METRICS_SETTLE: Duration = Duration::from_secs(3);
/// Bound on one curl request.
const CURL_TIME: Duration = Duration::from_secs(5);
/// Bound on one dig try.
const DIG_TIME: Duration = Duration::from_secs(3);
/// The app's port inside the pod, and the service port on the peer.
const APP_PORT: u16 = 8080;
/// istio-iptables' exit code for a failed `--run-validation`.
const VALIDATION_FAILED: i32 = 126;

/// The injector's capture arguments followed by `extra`.
fn capture_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = DEFAULT_CAPTURE_ARGS.to_vec();
    args.extend_from_slice(extra);
    args
}

/// `http://ADDR/`, with brackets around an IPv6 address.
fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}

fn dig_answer(out: &std::process::Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: dig failed ({}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // dig notes a retry over TCP on a line of its own, starting with `;;`.
    stdout
        .lines()
        .filter(|l| !l.starts_with(";;"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn dns_queries_over_udp_and_tcp_are_answered_through_15053() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    if !has_command("dig") {
        skip::<()>("dig is missing (Debian's bind9-dnsutils)");
        return;
    }
    let resolver = DnsServer::start(&net.peer, IpAddr::V4(net.peer_ip));
    let server = format!("@{}", net.peer_ip);
    let resolv_conf = net.binary().write_file(
        "resolv.conf",
        &format!(
            "search example.org\nnameserver {}\noptions ndots:5\n",
            net.peer_ip
        ),
    );
    let dns_servers = format!("--dns-servers={}", net.peer_ip);
    net.capture(&capture_args(&["--redirect-dns", &dns_servers]));

    // Captured, with nothing on 15053: the pod has no DNS at all.
    let out = dns::dig(
        &net.pod,
        &[&server, "before.example.org"],
        Duration::from_secs(1),
    );
    assert!(
        !out.status.success(),
        "DNS answered without the forwarder: capture is not in place\n{}",
        net.pod_nat_rules()
    );
    assert!(resolver.queries().is_empty(), "{:?}", resolver.queries());

    let remora = net
        .remora()
        .config(&format!("dns:\n  resolv_conf: {}\n", resolv_conf.display()))
        .env("ISTIO_META_DNS_CAPTURE", "true")
        .start_ready();
    let answer = dns::ANSWER.to_string();

    let out = dns::dig(&net.pod, &[&server, "svc.example.org"], DIG_TIME);
    assert_eq!(dig_answer(&out, "UDP query"), answer, "{}", remora.stderr());
    let out = dns::dig(&net.pod, &["+tcp", &server, "tcp.example.org"], DIG_TIME);
    assert_eq!(dig_answer(&out, "TCP query"), answer, "{}", remora.stderr());
    // The resolver truncates this one over UDP: the TC answer must reach dig as it is, so that
    // dig asks again over TCP.
    let out = dns::dig(&net.pod, &[&server, "big.example.org"], DIG_TIME);
    assert_eq!(
        dig_answer(&out, "truncated query"),
        answer,
        "{}",
        remora.stderr()
    );

    let seen: Vec<(Transport, String)> = resolver
        .queries()
        .into_iter()
        .map(|q| (q.transport, q.name))
        .collect();
    assert_eq!(
        seen,
        [
            (Transport::Udp, "svc.example.org".to_string()),
            (Transport::Tcp, "tcp.example.org".to_string()),
            (Transport::Udp, "big.example.org".to_string()),
            (Transport::Tcp, "big.example.org".to_string()),
        ]
    );
    // The forwarder's own queries leave the pod (as UID 1337, which capture exempts) from the
    // pod's address, instead of being captured back into 15053.
    for q in resolver.queries() {
        assert_eq!(q.from.ip(), IpAddr::V4(net.pod_ip), "{q:?}");
    }
    let m = remora.wait_for_metrics(
        "four DNS queries forwarded once each",
        METRICS_SETTLE,
        |m| m.value(DNS_REQUESTS, &[]) >= 4.0,
    );
    assert_eq!(m.value(DNS_REQUESTS, &[]), 4.0, "{m}");
    assert_eq!(m.value(DNS_UPSTREAM, &[]), 4.0, "{m}");
    assert_eq!(m.value(DNS_FAILURES, &[]), 0.0, "{m}");
}

/// The app's view of the inbound hop's source, as one family-independent address (a dual-stack
/// listener reports IPv4 peers as `::ffff:a.b.c.d`).
fn sources(server: &Server) -> Vec<IpAddr> {
    server
        .peers()
        .iter()
        .map(|p| p.ip().to_canonical())
        .collect()
}

/// An outbound request to the peer and an inbound one to the app, both over `family`'s
/// addresses; checks each crossed Remora and what each far end saw.
fn check_traffic(net: &PodNet, remora: &remora_e2e::Remora<'_>, family: IpFamily) {
    let (pod_ip, peer_ip, passthrough): (IpAddr, IpAddr, IpAddr) = match family {
        IpFamily::V4 => (
            net.pod_ip.into(),
            net.peer_ip.into(),
            Ipv4Addr::new(127, 0, 0, 6).into(),
        ),
        IpFamily::V6 => (
            net.pod_ip6().into(),
            net.peer_ip6().into(),
            Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6).into(),
        ),
    };
    let before = remora.metrics();
    let service = Server::http(&net.peer, SocketAddr::new(peer_ip, APP_PORT), "peer\n");
    let out = peer::curl(&net.pod, &["-g", &url(service.addr())], CURL_TIME);
    assert_eq!(curl_ok(&out, &format!("{family:?} outbound GET")), "peer\n");
    assert_eq!(
        sources(&service),
        [pod_ip],
        "{family:?}: the peer sees the pod"
    );

    let app = Server::http(
        &net.pod,
        SocketAddr::new(unspecified(family), APP_PORT),
        "app\n",
    );
    let target = SocketAddr::new(pod_ip, APP_PORT);
    let out = peer::curl(&net.peer, &["-g", &url(target)], CURL_TIME);
    assert_eq!(curl_ok(&out, &format!("{family:?} inbound GET")), "app\n");
    assert_eq!(
        sources(&app),
        [passthrough],
        "{family:?}: the app sees the inbound passthrough source, so the hop crossed Remora"
    );
    let (out0, in0) = (
        before.value(OPENED, &[OUTBOUND]),
        before.value(OPENED, &[INBOUND]),
    );
    remora.wait_for_metrics(
        &format!("{family:?}: one outbound and one inbound connection"),
        METRICS_SETTLE,
        |m| {
            m.value(OPENED, &[OUTBOUND]) >= out0 + 1.0
                && m.value(OPENED, &[INBOUND]) >= in0 + 1.0
                && m.value(ACTIVE, &[]) == 0.0
        },
    );
}

#[derive(Debug, Clone, Copy)]
enum IpFamily {
    V4,
    V6,
}

fn unspecified(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => Ipv4Addr::UNSPECIFIED.into(),
        IpFamily::V6 => Ipv6Addr::UNSPECIFIED.into(),
    }
}

/// A pod with IPv4 and IPv6 addresses, or `None` (skipped) when this machine cannot make one.
fn dual_stack_pod() -> Option<PodNet> {
    let net = PodNet::create_or_skip()?;
    match net.enable_ipv6() {
        Ok(()) => Some(net),
        Err(e) => skip(&format!("no IPv6 in network namespaces: {e}")),
    }
}

#[test]
fn ipv6_outbound_inbound_and_dns_cross_the_proxy() {
    let Some(net) = dual_stack_pod() else {
        return;
    };
    if !has_command("dig") {
        skip::<()>("dig is missing (Debian's bind9-dnsutils)");
        return;
    }
    let resolver = DnsServer::start(&net.peer, IpAddr::V6(net.peer_ip6()));
    let resolv_conf = net
        .binary()
        .write_file("resolv.conf", &format!("nameserver {}\n", net.peer_ip6()));
    let dns_servers = format!("--dns-servers={}", net.peer_ip6());
    net.capture(&capture_args(&[
        "--assume-ipv6",
        "--redirect-dns",
        &dns_servers,
    ]));
    let remora = net
        .remora()
        .config(&format!("dns:\n  resolv_conf: {}\n", resolv_conf.display()))
        .env("ISTIO_META_DNS_CAPTURE", "true")
        .start_ready();

    // Inbound reaches the app from ::6, which capture put on lo.
    check_traffic(&net, &remora, IpFamily::V6);

    // IPv6 DNS is redirected to [::1]:15053.
    let server = format!("@{}", net.peer_ip6());
    let out = dns::dig(&net.pod, &[&server, "v6.example.org"], DIG_TIME);
    assert_eq!(
        dig_answer(&out, "query to an IPv6 resolver"),
        dns::ANSWER.to_string(),
        "{}",
        remora.stderr()
    );
    let queries = resolver.queries();
    assert_eq!(queries.len(), 1, "{queries:?}");
    assert_eq!(queries[0].from.ip(), IpAddr::V6(net.pod_ip6()));
    remora.wait_for_metrics("the IPv6 query crossed 15053", METRICS_SETTLE, |m| {
        m.value(DNS_REQUESTS, &[]) == 1.0
    });
}

#[test]
fn dual_stack_capture_programs_both_families() {
    let Some(net) = dual_stack_pod() else {
        return;
    };
    net.capture(&capture_args(&["--dual-stack"]));
    let remora = net.remora().start_ready();

    check_traffic(&net, &remora, IpFamily::V4);
    check_traffic(&net, &remora, IpFamily::V6);
}

#[test]
fn without_dual_stack_the_ipv6_side_of_a_dual_stack_pod_is_left_alone() {
    let Some(net) = dual_stack_pod() else {
        return;
    };
    // The first address decides, as in istio-iptables: IPv4 here, so no ip6tables rules.
    net.capture(DEFAULT_CAPTURE_ARGS);
    let _remora = net.remora().start_ready();
    let app = Server::http(
        &net.pod,
        SocketAddr::new(unspecified(IpFamily::V6), APP_PORT),
        "app\n",
    );

    let target = SocketAddr::new(net.pod_ip6().into(), APP_PORT);
    let out = peer::curl(&net.peer, &["-g", &url(target)], CURL_TIME);

    assert_eq!(curl_ok(&out, "uncaptured IPv6 inbound GET"), "app\n");
    assert_eq!(
        sources(&app),
        [IpAddr::V6(net.peer_ip6())],
        "not through Remora"
    );
}

#[test]
fn run_validation_passes_with_the_rules_and_exits_126_without_them() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let validate = ["--run-validation", "--probe-timeout=1s"];

    // Nothing installed: the probe is not redirected.
    let mut args = capture_args(&validate);
    args.push("--skip-rule-apply");
    let out = net.capture_output(&args);
    assert_eq!(
        out.status.code(),
        Some(VALIDATION_FAILED),
        "validation without rules: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = net.capture_output(&capture_args(&validate));
    assert!(
        out.status.success(),
        "validation with the rules just installed failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(net.pod_nat_rules().contains("ISTIO_REDIRECT"));
}

#[test]
fn native_nftables_capture_carries_outbound_and_inbound() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    if !has_command("nft") {
        skip::<()>("nft is missing (Debian's nftables)");
        return;
    }
    net.capture(&capture_args(&["--native-nftables"]));
    let remora = net.remora().start_ready();

    check_traffic(&net, &remora, IpFamily::V4);
    let mut nft = net.pod.command("nft");
    nft.args(["list", "ruleset"]);
    let ruleset = run_bounded(&mut nft, Duration::from_secs(10));
    let ruleset = ruleset.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    assert!(
        ruleset
            .as_deref()
            .is_ok_and(|r| r.contains("istio-proxy-nat")),
        "no native nftables table in the pod: {ruleset:?}"
    );
    assert!(
        !net.pod_nat_rules().contains("ISTIO_REDIRECT"),
        "iptables rules were written although nftables was asked for"
    );
}

/// The injector's arguments in TPROXY mode: the same exemptions by UID and GID 1337.
const TPROXY_CAPTURE_ARGS: &[&str] = &[
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-g",
    "1337",
    "-m",
    "TPROXY",
    "-i",
    "*",
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
];
/// Istio runs the TPROXY sidecar as root (for CAP_NET_ADMIN) in the proxy's group.
const TPROXY_UID: u32 = 0;
const PROXY_GID: u32 = 1337;

#[test]
fn tproxy_inbound_shows_the_app_the_client_and_gid_alone_exempts_the_proxy() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture(TPROXY_CAPTURE_ARGS);
    let remora = net
        .remora()
        .user(TPROXY_UID, PROXY_GID)
        .env("ISTIO_META_INTERCEPTION_MODE", "TPROXY")
        .start_ready();
    let app = Server::http(&net.pod, any_addr(APP_PORT), "app\n");

    let out = peer::curl(&net.peer, &[&url(net.pod_addr(APP_PORT))], CURL_TIME);
    assert_eq!(
        curl_ok(&out, "inbound GET in TPROXY mode"),
        "app\n",
        "{}",
        remora.stderr()
    );
    assert_eq!(
        sources(&app),
        [IpAddr::V4(net.peer_ip)],
        "the app sees the original client, not a passthrough source"
    );
    remora.wait_for_metrics(
        "the inbound connection crossed Remora",
        METRICS_SETTLE,
        |m| m.value(OPENED, &[INBOUND]) >= 1.0 && m.value(ACTIVE, &[INBOUND]) == 0.0,
    );

    // As UID 0 the proxy matches no UID rule: only `--gid-owner 1337 -j RETURN` keeps its
    // upstream connection from being captured again.
    let service = Server::http(&net.peer, net.peer_addr(APP_PORT), "peer\n");
    let out = peer::curl(&net.pod, &[&url(service.addr())], CURL_TIME);
    assert_eq!(curl_ok(&out, "outbound GET in TPROXY mode"), "peer\n");
    assert_eq!(sources(&service), [IpAddr::V4(net.pod_ip)]);
    let m = remora.wait_for_metrics(
        "the outbound connection crossed Remora",
        METRICS_SETTLE,
        |m| m.value(OPENED, &[OUTBOUND]) >= 1.0,
    );
    assert_eq!(m.value(LOOP_REFUSED, &[]), 0.0, "{m}");
}

#[test]
fn tproxy_without_the_gid_exemption_captures_the_proxys_own_upstream() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    // The same rules exempting GID 4242 instead: nothing exempts a UID-0 proxy any more.
    let mut args = TPROXY_CAPTURE_ARGS.to_vec();
    let gid = args.iter().position(|a| *a == "-g").expect("a -g flag") + 1;
    args[gid] = "4242";
    net.capture(&args);
    let remora = net
        .remora()
        .user(TPROXY_UID, PROXY_GID)
        .env("ISTIO_META_INTERCEPTION_MODE", "TPROXY")
        .start_ready();
    let service = Server::http(&net.peer, net.peer_addr(APP_PORT), "peer\n");

    let (status, body) = peer::curl_status(&net.pod, &[&url(service.addr())], CURL_TIME);

    // The HTTP path answers 503 once its retries are refused too; a TCP client is reset.
    assert_ne!(
        (status, body.as_str()),
        (200, "peer\n"),
        "the proxy's upstream was not captured; rules:\n{}",
        net.pod_nat_rules()
    );
    assert!(service.peers().is_empty());
    remora.wait_for_metrics(
        "the loop guard refused the captured upstream",
        METRICS_SETTLE,
        |m| m.value(LOOP_REFUSED, &[("guard", "own_upstream")]) >= 1.0,
    );
}

#[test]
fn tproxy_ipv6_inbound_shows_the_app_the_client() {
    let Some(net) = dual_stack_pod() else {
        return;
    };
    let mut args = TPROXY_CAPTURE_ARGS.to_vec();
    args.push("--dual-stack");
    net.capture(&args);
    let remora = net
        .remora()
        .user(TPROXY_UID, PROXY_GID)
        .env("ISTIO_META_INTERCEPTION_MODE", "TPROXY")
        .start_ready();
    let app = Server::http(
        &net.pod,
        SocketAddr::new(unspecified(IpFamily::V6), APP_PORT),
        "app\n",
    );

    let target = SocketAddr::new(net.pod_ip6().into(), APP_PORT);
    let out = peer::curl(&net.peer, &["-g", &url(target)], CURL_TIME);

    assert_eq!(
        curl_ok(&out, "IPv6 inbound GET in TPROXY mode"),
        "app\n",
        "{}",
        remora.stderr()
    );
    assert_eq!(sources(&app), [IpAddr::V6(net.peer_ip6())]);
    remora.wait_for_metrics(
        "the inbound connection crossed Remora",
        METRICS_SETTLE,
        |m| m.value(OPENED, &[INBOUND]) >= 1.0,
    );
}
