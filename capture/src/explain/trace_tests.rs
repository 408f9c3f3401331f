//! The tracer on rules the generators write (the same text as the conformance cases: the
//! iptables generator is byte-identical to istio-iptables on them), for both backends.

use super::*;
use crate::explain::{iptables, nft};
use crate::test_support::config;

/// `default-sidecar`'s flags.
const DEFAULT_SIDECAR: &[&str] = &[
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-m",
    "REDIRECT",
    "-i",
    "*",
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
];

fn iptables_rules(argv: &[&str]) -> Ruleset {
    iptables::parse(&crate::generate(&config(argv)).dry_run_output(), Family::V4)
}

fn nft_rules(argv: &[&str]) -> Ruleset {
    nft::parse(&crate::nft::generate_nft(&config(argv)).script())
}

fn outbound(uid: Option<u32>, dst: &str, dport: u16) -> Connection {
    let dst: IpAddr = dst.parse().unwrap();
    Connection {
        direction: Direction::Outbound,
        proto: Proto::Tcp,
        src: None,
        dst: Some(dst),
        sport: None,
        dport: Some(dport),
        uid,
        gid: uid,
        in_iface: None,
        out_iface: Some(if dst.is_loopback() { "lo" } else { "eth0" }.to_owned()),
        mark: 0,
    }
}

fn inbound(dport: u16) -> Connection {
    Connection {
        direction: Direction::Inbound,
        proto: Proto::Tcp,
        src: Some("10.1.0.5".parse().unwrap()),
        dst: Some("10.1.0.9".parse().unwrap()),
        sport: Some(40000),
        dport: Some(dport),
        uid: None,
        gid: None,
        in_iface: Some("eth0".to_owned()),
        out_iface: None,
        mark: 0,
    }
}

fn at(table: &str, chain: &str, rule: usize) -> (String, String, usize) {
    (table.to_owned(), chain.to_owned(), rule)
}

#[test]
fn default_sidecar_outbound_app_traffic_is_redirected_to_15001() {
    for (rules, table, chain) in [
        (iptables_rules(DEFAULT_SIDECAR), "nat", "ISTIO_REDIRECT"),
        (
            nft_rules(DEFAULT_SIDECAR),
            "istio-proxy-nat",
            "istio-redirect",
        ),
    ] {
        let t = trace(&rules, &outbound(Some(1000), "10.0.0.1", 80));
        assert_eq!(
            t.outcome,
            Outcome::Redirected {
                port: 15001,
                at: at(table, chain, 1)
            },
            "{t}"
        );
        assert!(
            t.to_string().contains("Result: redirected to port 15001"),
            "{t}"
        );
    }
}

#[test]
fn default_sidecar_proxy_traffic_returns() {
    let t = trace(
        &iptables_rules(DEFAULT_SIDECAR),
        &outbound(Some(1337), "10.0.0.1", 80),
    );
    assert_eq!(t.outcome, Outcome::Untouched, "{t}");
    // `-m owner --uid-owner 1337 -j RETURN`, the fourth rule of ISTIO_OUTPUT.
    assert!(
        t.matched_rules().contains(&at("nat", "ISTIO_OUTPUT", 4)),
        "{t}"
    );
    let t = trace(
        &nft_rules(DEFAULT_SIDECAR),
        &outbound(Some(1337), "10.0.0.1", 80),
    );
    assert_eq!(t.outcome, Outcome::Untouched, "{t}");
}

#[test]
fn default_sidecar_inbound_capture_and_exclusions() {
    let rules = iptables_rules(DEFAULT_SIDECAR);
    let t = trace(&rules, &inbound(15021));
    assert_eq!(t.outcome, Outcome::Untouched, "{t}");
    assert!(
        t.matched_rules().contains(&at("nat", "ISTIO_INBOUND", 3)),
        "{t}"
    );
    let t = trace(&rules, &inbound(8080));
    assert_eq!(
        t.outcome,
        Outcome::Redirected {
            port: 15006,
            at: at("nat", "ISTIO_IN_REDIRECT", 1)
        },
        "{t}"
    );
    let t = trace(&nft_rules(DEFAULT_SIDECAR), &inbound(8080));
    assert!(
        matches!(t.outcome, Outcome::Redirected { port: 15006, .. }),
        "{t}"
    );
}

#[test]
fn default_sidecar_passthrough_from_127_0_0_6_on_lo_returns() {
    let mut conn = outbound(Some(1337), "10.1.0.9", 8080);
    conn.out_iface = Some("lo".to_owned());
    conn.src = Some("127.0.0.6".parse().unwrap());
    let t = trace(&iptables_rules(DEFAULT_SIDECAR), &conn);
    assert_eq!(t.outcome, Outcome::Untouched, "{t}");
    assert_eq!(t.matched_rules()[1], at("nat", "ISTIO_OUTPUT", 1), "{t}");
    // The proxy calling its app through the pod IP (not from 127.0.0.6) goes inbound.
    conn.src = Some("10.1.0.9".parse().unwrap());
    let t = trace(&iptables_rules(DEFAULT_SIDECAR), &conn);
    assert!(
        matches!(t.outcome, Outcome::Redirected { port: 15006, .. }),
        "{t}"
    );
}

#[test]
fn what_is_not_given_is_unknown_not_guessed() {
    let t = trace(
        &iptables_rules(DEFAULT_SIDECAR),
        &outbound(None, "10.0.0.1", 80),
    );
    match &t.outcome {
        Outcome::Unknown { reason, at: where_ } => {
            assert_eq!(*where_, at("nat", "ISTIO_OUTPUT", 4));
            assert!(reason.contains("--uid"), "{reason}");
        }
        other => panic!("expected unknown, got {other:?}\n{t}"),
    }
    // A failing match elsewhere in the rule still decides it: rule 2 also tests the UID,
    // but its `-o lo` already fails.
    let rule2 = t
        .steps
        .iter()
        .find(|s| matches!(s, Step::Rule { chain, index: 2, .. } if chain == "ISTIO_OUTPUT"));
    assert!(
        matches!(
            rule2,
            Some(Step::Rule {
                result: RuleResult::NoMatch(_),
                ..
            })
        ),
        "{t}"
    );
    let unknown = iptables::parse(
        "*nat\n-A OUTPUT -m statistic --mode random --probability 0.5 -j DROP\nCOMMIT\n",
        Family::V4,
    );
    let t = trace(&unknown, &outbound(Some(1), "10.0.0.1", 80));
    assert!(
        matches!(&t.outcome, Outcome::Unknown { reason, .. } if reason.contains("statistic")),
        "{t}"
    );
}

#[test]
fn tproxy_marks_and_hands_over_inbound_connections() {
    let flags = ["-m", "TPROXY", "-b", "*", "-i", "*"];
    for rules in [iptables_rules(&flags), nft_rules(&flags)] {
        let t = trace(&rules, &inbound(8080));
        assert!(
            matches!(t.outcome, Outcome::Tproxied { port: 15006, .. }),
            "{t}"
        );
        assert_eq!(t.mark, 1337, "{t}");
    }
}

#[test]
fn dns_is_redirected_to_the_agent_with_its_zone() {
    let flags = ["-i", "*", "--redirect-dns", "--dns-servers=10.96.0.10"];
    for rules in [iptables_rules(&flags), nft_rules(&flags)] {
        let mut conn = outbound(Some(1000), "10.96.0.10", 53);
        conn.proto = Proto::Udp;
        let t = trace(&rules, &conn);
        assert!(
            matches!(t.outcome, Outcome::Redirected { port: 15053, .. }),
            "{t}"
        );
        assert_eq!(t.zone, Some(2), "{t}");
    }
}

#[test]
fn invalid_drop_leaves_new_connections_alone_and_policies_apply() {
    let t = trace(
        &iptables_rules(&["--drop-invalid", "-b", "*"]),
        &inbound(8080),
    );
    assert!(matches!(t.outcome, Outcome::Redirected { .. }), "{t}");
    let rules = iptables::parse(
        "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n",
        Family::V4,
    );
    let t = trace(&rules, &inbound(8080));
    assert_eq!(
        t.outcome,
        Outcome::Dropped {
            at: at("filter", "INPUT", 0)
        },
        "{t}"
    );
    assert_eq!(trace(&rules, &inbound(22)).outcome, Outcome::Untouched);
}

#[test]
fn ipv6_connections_use_the_ipv6_rules() {
    let rules = iptables::parse(
        &crate::generate(&config(&["-i", "*", "--assume-ipv6"])).dry_run_output(),
        Family::V4,
    );
    let t = trace(&rules, &outbound(Some(1000), "fd00::1", 80));
    assert!(
        matches!(t.outcome, Outcome::Redirected { port: 15001, .. }),
        "{t}"
    );
    let mut local = outbound(Some(1000), "::1", 80);
    local.src = Some("::1".parse().unwrap());
    let t = trace(&rules, &local);
    assert_eq!(t.outcome, Outcome::Untouched, "{t}");
}
