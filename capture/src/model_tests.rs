//! Resolution of flags, environment and pod facts into a [`CaptureConfig`].

use std::cell::Cell;

use clap::Parser;

use super::*;
use crate::flags::CaptureArgs;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: CaptureArgs,
}

/// Pod facts for tests; records whether it was asked.
#[derive(Default)]
struct Pod {
    ipv6: bool,
    nameservers: Option<Vec<&'static str>>,
    asked_ipv6: Cell<Option<bool>>,
}

impl PodNetwork for Pod {
    fn is_ipv6(&self, dual_stack: bool) -> Result<bool, CaptureError> {
        self.asked_ipv6.set(Some(dual_stack));
        Ok(self.ipv6)
    }

    fn nameservers(&self) -> Result<Vec<String>, CaptureError> {
        let servers = self
            .nameservers
            .as_ref()
            .expect("resolv.conf must not be read here");
        Ok(servers.iter().map(|s| s.to_string()).collect())
    }
}

fn resolve_with(
    argv: &[&str],
    env: &[(&str, &str)],
    pod: &Pod,
) -> Result<CaptureConfig, CaptureError> {
    let argv = std::iter::once("capture").chain(argv.iter().copied());
    let args = Cli::try_parse_from(argv).expect("flags parse").args;
    CaptureConfig::resolve(&args, &Environment::from_pairs(env.iter().copied()), pod)
}

fn resolve(argv: &[&str]) -> CaptureConfig {
    resolve_with(argv, &[], &Pod::default()).expect("resolves")
}

fn flag_error(argv: &[&str], env: &[(&str, &str)]) -> FlagError {
    match resolve_with(argv, env, &Pod::default()) {
        Err(CaptureError::Flag(e)) => e,
        other => panic!("expected a flag error, got {other:?}"),
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn defaults_match_istio_iptables() {
    let cfg = resolve(&[]);
    assert_eq!(cfg.proxy_port, "15001");
    assert_eq!(cfg.inbound_capture_port, "15006");
    assert_eq!(cfg.inbound_tunnel_port, "15008");
    assert_eq!(cfg.proxy_uids, ["1337"]);
    assert_eq!(cfg.proxy_gids, ["1337"]);
    assert_eq!(cfg.mode, InterceptionMode::Redirect);
    assert_eq!(
        (cfg.tproxy_mark.as_str(), cfg.tproxy_route_table.as_str()),
        ("1337", "133")
    );
    assert_eq!(cfg.inbound, InboundCapture::Off);
    assert_eq!(
        cfg.outbound_cidrs,
        OutboundCidrs::Only(CidrsByFamily::default())
    );
    assert_eq!(cfg.owner_groups, OwnerGroups::AllExcept(vec![]));
    assert_eq!(cfg.ipv4_loopback_cidr, "127.0.0.1/32");
    assert_eq!(cfg.dns, DnsCapture::Off);
    assert!(!cfg.drop_invalid && !cfg.ipv6);
}

#[test]
fn gid_defaults_to_uid_and_empty_ids_mean_default() {
    let cfg = resolve(&["-u", "3,4"]);
    assert_eq!(cfg.proxy_gids, ["3", "4"]);
    let cfg = resolve(&["-u", "", "-g", ""]);
    assert_eq!(
        (cfg.proxy_uids, cfg.proxy_gids),
        (strings(&["1337"]), strings(&["1337"]))
    );
    let cfg = resolve(&["-u", "1000", "-g", "2000,"]);
    assert_eq!(cfg.proxy_gids, ["2000"]);
}

#[test]
fn lists_drop_empty_items_and_keep_order() {
    let cfg = resolve(&[
        "-b",
        "*",
        "-d",
        "7000,,6000,",
        "-q",
        "32000,31000",
        "-o",
        "",
    ]);
    assert_eq!(
        cfg.inbound,
        InboundCapture::AllExcept(strings(&["7000", "6000"]))
    );
    assert_eq!(cfg.outbound_ports, ["32000", "31000"]);
    assert!(cfg.outbound_exclude_ports.is_empty());
    assert_eq!(resolve(&["-b", ","]).inbound, InboundCapture::Only(vec![]));
    assert_eq!(
        resolve(&["-b", "80", "-d", "90"]).inbound,
        InboundCapture::Only(strings(&["80"]))
    );
}

#[test]
fn wildcards() {
    assert_eq!(resolve(&["-i", "*"]).outbound_cidrs, OutboundCidrs::All);
    let err = flag_error(&["-x", "*"], &[]);
    assert_eq!(err.flag, "--istio-service-exclude-cidr");
    let err = flag_error(&["-i", "*,10.0.0.0/8"], &[]);
    assert_eq!(err.value, "*");
}

#[test]
fn cidrs_split_by_family() {
    let cfg = resolve(&[
        "-i",
        "10.0.0.0/8,2001:db8::/32,127.0.0.1/32",
        "-x",
        "1.1.0.0/16",
    ]);
    let OutboundCidrs::Only(include) = &cfg.outbound_cidrs else {
        panic!("not a list")
    };
    let text = |v: &[Cidr]| v.iter().map(Cidr::to_string).collect::<Vec<_>>();
    assert_eq!(text(&include.v4), ["10.0.0.0/8", "127.0.0.1/32"]);
    assert_eq!(text(&include.v6), ["2001:db8::/32"]);
    assert!(include.has_loopback());
    assert_eq!(text(&cfg.outbound_exclude_cidrs.v4), ["1.1.0.0/16"]);
    assert_eq!(
        flag_error(&["-i", "10.0.0.0/8,10.0.0.1"], &[]).value,
        "10.0.0.1"
    );
}

#[test]
fn environment_fills_unset_flags_only() {
    let env = [
        ("ISTIO_INBOUND_PORTS", "*"),
        ("PROXY_UID", "5"),
        ("ISTIO_SERVICE_CIDR", "*"),
    ];
    let cfg = resolve_with(&["-u", "7"], &env, &Pod::default()).unwrap();
    assert_eq!(cfg.inbound, InboundCapture::AllExcept(vec![]));
    assert_eq!(cfg.proxy_uids, ["7"]);
    assert_eq!(cfg.outbound_cidrs, OutboundCidrs::All);
    // A flag given as '' beats the variable.
    let cfg = resolve_with(&["-b", ""], &env, &Pod::default()).unwrap();
    assert_eq!(cfg.inbound, InboundCapture::Off);
    // -p has no variable in istio-iptables.
    let env = [("ENVOY_PORT", "1")];
    assert_eq!(
        resolve_with(&[], &env, &Pod::default()).unwrap().proxy_port,
        "15001"
    );
}

#[test]
fn errors_name_where_the_value_came_from() {
    let err = flag_error(&[], &[("ISTIO_SERVICE_CIDR", "nope")]);
    assert_eq!(err.flag, "ISTIO_SERVICE_CIDR");
    let message = err.to_string();
    assert!(
        message.contains("\"nope\"") && message.contains("ISTIO_SERVICE_CIDR"),
        "{message}"
    );
}

#[test]
fn ports_must_be_ports() {
    for bad in ["", "0", "65536", "abc", "+80", "15001 "] {
        assert_eq!(
            flag_error(&["-p", bad], &[]).flag,
            "--envoy-port",
            "{bad:?}"
        );
    }
    assert_eq!(flag_error(&["-z", "x"], &[]).flag, "--inbound-capture-port");
}

#[test]
fn values_cannot_inject_rule_text() {
    for bad in ["80 -j ACCEPT", "80\n-A OUTPUT -j DROP", "\"80\"", "8'0"] {
        let err = flag_error(&["-b", bad], &[]);
        assert_eq!(err.flag, "--istio-inbound-ports", "{bad:?}");
    }
    assert_eq!(
        flag_error(&["-c", "eth0 eth1"], &[]).flag,
        "--istio-exclude-interfaces"
    );
    let err = flag_error(&[], &[("ISTIO_OUTBOUND_OWNER_GROUPS", "a b")]);
    assert_eq!(err.flag, "ISTIO_OUTBOUND_OWNER_GROUPS");
}

#[test]
fn interception_mode() {
    assert_eq!(
        resolve(&["-m", "REDIRECT"]).mode,
        InterceptionMode::Redirect
    );
    assert_eq!(resolve(&["-m", ""]).mode, InterceptionMode::Redirect);
    assert_eq!(resolve(&["-m", "TPROXY"]).mode, InterceptionMode::Tproxy);
    assert_eq!(flag_error(&["-m", "tproxy"], &[]).value, "tproxy");
    // The mark and table are only numbers that matter in TPROXY mode.
    assert_eq!(resolve(&["-t", "", "-r", "x"]).tproxy_mark, "");
    assert_eq!(
        flag_error(&["-m", "TPROXY", "-t", "0x539"], &[]).flag,
        "--istio-inbound-tproxy-mark"
    );
    let err = flag_error(&["-m", "TPROXY", "-r", ""], &[]);
    assert_eq!(err.flag, "--istio-inbound-tproxy-route-table");
}

#[test]
fn owner_groups() {
    let env = [("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "888,ftp")];
    let cfg = resolve_with(&[], &env, &Pod::default()).unwrap();
    assert_eq!(
        cfg.owner_groups,
        OwnerGroups::AllExcept(strings(&["888", "ftp"]))
    );
    let env = [
        ("ISTIO_OUTBOUND_OWNER_GROUPS", "java,202"),
        ("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "1"),
    ];
    let cfg = resolve_with(&[], &env, &Pod::default()).unwrap();
    assert_eq!(
        cfg.owner_groups,
        OwnerGroups::Only(strings(&["java", "202"]))
    );
    // Set but empty is not unset (istio-iptables reads it the same way).
    let env = [("ISTIO_OUTBOUND_OWNER_GROUPS", "")];
    let cfg = resolve_with(&[], &env, &Pod::default()).unwrap();
    assert_eq!(cfg.owner_groups, OwnerGroups::Only(vec![]));
    let many = (0..65).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let err = flag_error(&[], &[("ISTIO_OUTBOUND_OWNER_GROUPS", &many)]);
    assert!(err.reason.contains("at most 64"), "{err}");
}

#[test]
fn ipv4_loopback_cidr() {
    let env = [("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/8")];
    assert_eq!(
        resolve_with(&[], &env, &Pod::default())
            .unwrap()
            .ipv4_loopback_cidr,
        "127.0.0.1/8"
    );
    for bad in ["", "10.0.0.1/32", "127.0.0.1/7", "::1/128", "127.0.0.1"] {
        let err = flag_error(&[], &[("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", bad)]);
        assert_eq!(err.flag, "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "{bad:?}");
    }
}

#[test]
fn dns_capture() {
    let cfg = resolve(&["--redirect-dns", "--dns-servers=127.0.0.53,::127.0.0.53"]);
    let servers = DnsCapture::Servers {
        v4: strings(&["127.0.0.53"]),
        v6: strings(&["::127.0.0.53"]),
    };
    assert_eq!(cfg.dns, servers);
    // No nameservers: capture is off, as in istio-iptables.
    assert_eq!(
        resolve(&["--redirect-dns", "--dns-servers="]).dns,
        DnsCapture::Off
    );
    // Capture-all never needs nameservers.
    assert_eq!(
        resolve(&["--redirect-dns", "--capture-all-dns"]).dns,
        DnsCapture::AllPort53
    );
    assert_eq!(resolve(&["--capture-all-dns"]).dns, DnsCapture::Off);
    let env = [
        ("ISTIO_META_DNS_CAPTURE", "true"),
        ("CAPTURE_ALL_DNS", "true"),
    ];
    assert_eq!(
        resolve_with(&[], &env, &Pod::default()).unwrap().dns,
        DnsCapture::AllPort53
    );
    assert_eq!(
        flag_error(&["--redirect-dns", "--dns-servers=x"], &[]).value,
        "x"
    );
}

#[test]
fn dns_servers_come_from_resolv_conf_when_not_given() {
    let pod = Pod {
        nameservers: Some(vec!["10.96.0.10", "FD00:0::10", "bogus"]),
        ..Pod::default()
    };
    let cfg = resolve_with(&["--redirect-dns"], &[], &pod).unwrap();
    let servers = DnsCapture::Servers {
        v4: strings(&["10.96.0.10"]),
        v6: strings(&["fd00::10"]),
    };
    assert_eq!(cfg.dns, servers);
}

#[test]
fn ipv6_is_assumed_or_discovered() {
    let pod = Pod {
        ipv6: true,
        ..Pod::default()
    };
    assert!(resolve_with(&[], &[], &pod).unwrap().ipv6);
    assert_eq!(pod.asked_ipv6.get(), Some(false));
    let pod = Pod::default();
    assert!(resolve_with(&["--assume-ipv6"], &[], &pod).unwrap().ipv6);
    assert_eq!(pod.asked_ipv6.get(), None, "not discovered when assumed");
    let pod = Pod::default();
    resolve_with(&[], &[("ISTIO_DUAL_STACK", "true")], &pod).unwrap();
    assert_eq!(pod.asked_ipv6.get(), Some(true));
}

#[test]
fn drop_invalid_reads_both_variables() {
    assert!(resolve(&["--drop-invalid"]).drop_invalid);
    let env = [("INVALID_DROP", "true")];
    assert!(
        resolve_with(&[], &env, &Pod::default())
            .unwrap()
            .drop_invalid
    );
}
