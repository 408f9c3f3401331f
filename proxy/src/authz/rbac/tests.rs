use super::*;
use crate::authz::Request;
use remora_xds::model::matcher::{CidrRange, HeaderMatch, Pattern, StringMatch, StringMatcher};
use remora_xds::model::rbac::Policy;
use std::collections::BTreeMap;

const SLEEP: &str = "spiffe://cluster.local/ns/default/sa/sleep";
const OTHER: &str = "spiffe://cluster.local/ns/other/sa/curl";

fn peer_is(m: StringMatcher) -> Principal {
    Principal::FilterState {
        key: PEER_PRINCIPAL.into(),
        matcher: m,
    }
}

/// A peer as mutual TLS describes it, from a certificate with these SANs and common name.
fn peer_with(sans: Vec<rcgen::SanType>, common_name: &str) -> crate::tls::Peer {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.subject_alt_names = sans;
    params.distinguished_name = rcgen::DistinguishedName::new();
    if !common_name.is_empty() {
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
    }
    let cert = params.self_signed(&key).expect("certificate");
    crate::tls::Peer::from_chain(&[cert.der().clone()], None).expect("a peer")
}

/// The peer whose certificate names `id` (SLEEP or OTHER) as its one SAN.
fn known_peer(id: &str) -> &'static crate::tls::Peer {
    static PEERS: std::sync::LazyLock<Vec<crate::tls::Peer>> =
        std::sync::LazyLock::new(|| [SLEEP, OTHER].map(|id| peer_with(vec![uri(id)], "")).into());
    PEERS
        .iter()
        .find(|p| p.uri_sans.first().is_some_and(|u| u == id))
        .expect("a known peer")
}

fn uri(u: &str) -> rcgen::SanType {
    rcgen::SanType::URI(u.try_into().expect("a URI"))
}

fn dns(d: &str) -> rcgen::SanType {
    rcgen::SanType::DnsName(d.try_into().expect("a DNS name"))
}

fn method(m: &str) -> Permission {
    Permission::Header(HeaderMatcher {
        name: ":method".into(),
        kind: HeaderMatch::Value(StringMatcher::exact(m)),
        invert: false,
    })
}

fn prefix(p: &str) -> StringMatcher {
    StringMatcher {
        kind: StringMatch::Prefix(p.into()),
        ignore_case: false,
    }
}

fn rules(action: Action, policies: &[(&str, Policy)]) -> Rules {
    Rules {
        action,
        policies: policies
            .iter()
            .map(|(n, p)| (n.to_string(), p.clone()))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn filter(rules: Option<Rules>, shadow: Option<Rules>) -> Rbac {
    Rbac {
        rules,
        shadow_rules: shadow,
        shadow_rules_stat_prefix: String::new(),
        stat_prefix: String::new(),
    }
}

/// istiod's ALLOW policy: `sleep` may GET /info*, and (the JWT half) a request whose claims
/// say so, which no request here has.
fn allow_sleep() -> Policy {
    Policy {
        permissions: vec![Permission::And(vec![
            Permission::Or(vec![method("GET")]),
            Permission::Or(vec![Permission::UrlPath(prefix("/info"))]),
        ])],
        principals: vec![Principal::Or(vec![peer_is(StringMatcher::exact(SLEEP))])],
    }
}

fn request<'a>(
    principal: Option<&'a str>,
    method: &'a str,
    path: &'a str,
    headers: &'a http::HeaderMap,
) -> Attributes<'a> {
    Attributes {
        source: "10.1.0.7:40000".parse().expect("addr"),
        destination: "10.1.0.9:8080".parse().expect("addr"),
        principal,
        peer: principal.map(known_peer),
        sni: None,
        request: Some(Request {
            method,
            path,
            query: Some("a=1"),
            host: Some("httpbin"),
            headers,
        }),
    }
}

#[test]
fn allow_and_deny_filters_decide_in_order() {
    let h = http::HeaderMap::new();
    let allow = filter(
        Some(rules(
            Action::Allow,
            &[("ns[default]-policy[httpbin]-rule[0]", allow_sleep())],
        )),
        None,
    );
    let filters = [allow];
    let out = evaluate(&filters, &request(Some(SLEEP), "GET", "/info/x", &h));
    assert_eq!(out.decided, Some(AuthzOutcome::AllowMatched));
    assert_eq!(out.policy, Some("ns[default]-policy[httpbin]-rule[0]"));
    assert!(out.allowed());
    for (p, m, path) in [
        (Some(OTHER), "GET", "/info"),
        (Some(SLEEP), "POST", "/info"),
        (Some(SLEEP), "GET", "/data"),
        (None, "GET", "/info"),
    ] {
        let out = evaluate(&filters, &request(p, m, path, &h));
        assert_eq!(
            out.decided,
            Some(AuthzOutcome::NoAllowMatched),
            "{p:?} {m} {path}"
        );
        assert!(!out.allowed());
    }

    // A DENY filter first (istiod's order): its match wins over the ALLOW filter's.
    let deny = filter(
        Some(rules(
            Action::Deny,
            &[(
                "ns[default]-policy[deny-other]-rule[0]",
                Policy {
                    permissions: vec![Permission::Any],
                    principals: vec![Principal::Not(Box::new(Principal::Authenticated(None)))],
                },
            )],
        )),
        None,
    );
    let filters = [deny, filters[0].clone()];
    let out = evaluate(&filters, &request(None, "GET", "/info", &h));
    assert_eq!(out.decided, Some(AuthzOutcome::DenyMatched));
    assert_eq!(out.policy, Some("ns[default]-policy[deny-other]-rule[0]"));
    let out = evaluate(&filters, &request(Some(SLEEP), "GET", "/info", &h));
    assert!(out.allowed());
}

#[test]
fn shadow_and_log_rules_never_deny() {
    let h = http::HeaderMap::new();
    let shadow = filter(
        None,
        Some(rules(Action::Deny, &[("dry-run", allow_sleep())])),
    );
    let audit = filter(Some(rules(Action::Log, &[("audit", allow_sleep())])), None);
    let filters = [shadow, audit];
    let out = evaluate(&filters, &request(Some(SLEEP), "GET", "/info", &h));
    assert!(out.allowed());
    assert_eq!(out.decided, None);
    assert_eq!(out.shadow, vec![(true, false, Some("dry-run"))]);
    assert_eq!(out.logged, vec!["audit"]);

    // Counted as the policy files' decisions are: a dry-run denial, an audit, no decision.
    let authz = Authorizer::new(Default::default());
    let verdict = authz.check_rbac(&filters, &request(Some(SLEEP), "GET", "/info", &h), None);
    assert_eq!(verdict, Verdict::Allowed);
    assert!(authz.metrics().policies_in_force());
    let [allowed, denied, shadow_allowed, shadow_denied] =
        authz.metrics().envoy_rbac(AuthzProtocol::Http);
    assert_eq!(
        (allowed, denied, shadow_allowed, shadow_denied),
        (0, 0, 0, 1)
    );
}

#[test]
fn each_filter_counts_its_own_decision_as_envoys_does() {
    use crate::metrics::rbac_filters::{counted, ChainRbac, Filters, RbacFilterStats};
    let h = http::HeaderMap::new();
    let mut dry_run = filter(None, Some(rules(Action::Allow, &[("dry", allow_sleep())])));
    dry_run.shadow_rules_stat_prefix = "istio_dry_run_allow_".into();
    let filters = [
        filter(Some(rules(Action::Deny, &[("d", allow_sleep())])), None),
        dry_run,
        filter(Some(rules(Action::Allow, &[("a", allow_sleep())])), None),
        filter(Some(rules(Action::Log, &[("audit", allow_sleep())])), None),
    ];
    let stats = RbacFilterStats::default();
    let counts = ChainRbac::resolve(&stats, Filters::Http("inbound_0.0.0.0_8080"), &filters);
    let authz = Authorizer::new(Default::default());
    // Another peer: the DENY filter lets it through, the dry-run one would not, the ALLOW
    // one denies, and the LOG filter after it never runs.
    let verdict = authz.check_rbac(
        &filters,
        &request(Some(OTHER), "GET", "/info", &h),
        Some(&counts),
    );
    assert!(matches!(verdict, Verdict::Denied(_)));
    // The policy files' totals count the request once.
    assert_eq!(
        authz.metrics().envoy_rbac(AuthzProtocol::Http),
        [0, 1, 0, 1]
    );
    assert_eq!(
        counted(&stats.http),
        [
            "inbound_0.0.0.0_8080.rbac.allowed 1",
            "inbound_0.0.0.0_8080.rbac.denied 1",
            "inbound_0.0.0.0_8080.rbac.istio_dry_run_allow_.shadow_denied 1",
        ]
    );
}

#[test]
fn a_denial_is_counted_and_named() {
    let h = http::HeaderMap::new();
    let filters = [filter(
        Some(rules(Action::Allow, &[("p", allow_sleep())])),
        None,
    )];
    let authz = Authorizer::new(Default::default());
    assert!(!authz.metrics().policies_in_force());
    // No filter at all: nothing is decided or counted.
    let none: [Rbac; 0] = [];
    assert_eq!(
        authz.check_rbac(&none, &request(None, "GET", "/", &h), None),
        Verdict::Allowed
    );
    assert!(!authz.metrics().policies_in_force());
    let verdict = authz.check_rbac(&filters, &request(Some(OTHER), "GET", "/info", &h), None);
    assert_eq!(
        verdict,
        Verdict::Denied("rbac_access_denied_matched_policy[none]".into())
    );
    assert_eq!(
        authz.check_rbac(&filters, &request(Some(SLEEP), "GET", "/info", &h), None),
        Verdict::Allowed
    );
    assert_eq!(
        authz.metrics().envoy_rbac(AuthzProtocol::Http),
        [1, 1, 0, 0]
    );
}

#[test]
fn connections_have_no_request_fields() {
    // Network RBAC: a path or header never matches a TCP connection, an inverted one does;
    // ports, addresses, SNI and the peer do.
    let sleep = peer_with(vec![uri(SLEEP)], "");
    let tcp = Attributes {
        source: "10.1.0.7:40000".parse().expect("addr"),
        destination: "10.1.0.9:9000".parse().expect("addr"),
        principal: Some(SLEEP),
        peer: Some(&sleep),
        sni: Some("outbound_.9000_._.echo.default.svc.cluster.local"),
        request: None,
    };
    assert!(!permission(&Permission::UrlPath(prefix("/")), &tcp));
    assert!(!permission(&method("GET"), &tcp));
    assert!(permission(&Permission::DestinationPort(9000), &tcp));
    assert!(permission(
        &Permission::DestinationPortRange {
            start: 9000,
            end: 9001
        },
        &tcp
    ));
    assert!(!permission(
        &Permission::DestinationPortRange {
            start: 8000,
            end: 9000
        },
        &tcp
    ));
    assert!(permission(
        &Permission::RequestedServerName(prefix("outbound_.9000_")),
        &tcp
    ));
    let net = CidrRange {
        address: "10.1.0.0".parse().expect("ip"),
        prefix_len: 16,
    };
    assert!(permission(&Permission::DestinationIp(net), &tcp));
    assert!(principal(&Principal::SourceIp(net), &tcp));
    assert!(principal(&Principal::DirectRemoteIp(net), &tcp));
    let regex = StringMatcher {
        kind: StringMatch::Regex(Pattern::new(".*/ns/default/.*").expect("re")),
        ignore_case: false,
    };
    assert!(principal(&peer_is(regex.clone()), &tcp));
    assert!(principal(&Principal::Authenticated(Some(regex)), &tcp));
    let plaintext = Attributes {
        principal: None,
        peer: None,
        ..tcp
    };
    assert!(!principal(&Principal::Authenticated(None), &plaintext));
    let claims = |invert| Principal::Metadata {
        filter: ISTIO_AUTHN.into(),
        path: vec!["request.auth.claims".into(), "iss".into()],
        matcher: StringMatcher::exact("https://accounts.google.com"),
        in_list: true,
        invert,
    };
    assert!(!principal(&claims(false), &tcp));
    assert!(principal(&claims(true), &tcp));
}

#[test]
fn request_headers_as_envoy_sees_them() {
    let mut h = http::HeaderMap::new();
    h.append("x-team", http::HeaderValue::from_static("a"));
    h.append("x-team", http::HeaderValue::from_static("b"));
    let a = request(Some(SLEEP), "GET", "/info", &h);
    let header = |name: &str, m: StringMatcher| {
        Permission::Header(HeaderMatcher {
            name: name.into(),
            kind: HeaderMatch::Value(m),
            invert: false,
        })
    };
    // A repeated header's values each on their own, never joined (Envoy 1.40, after
    // CVE-2026-26308): any value matching is a match, and an inverted matcher inverts that.
    assert!(!permission(
        &header("x-team", StringMatcher::exact("a,b")),
        &a
    ));
    assert!(permission(&header("x-team", StringMatcher::exact("b")), &a));
    let inverted = Permission::Header(HeaderMatcher {
        name: "x-team".into(),
        kind: HeaderMatch::Value(StringMatcher::exact("a")),
        invert: true,
    });
    assert!(!permission(&inverted, &a));
    assert!(permission(
        &header(":path", StringMatcher::exact("/info?a=1")),
        &a
    ));
    assert!(permission(
        &header(":authority", StringMatcher::exact("httpbin")),
        &a
    ));
    let absent = HeaderMatcher {
        name: "x-missing".into(),
        kind: HeaderMatch::Present(true),
        invert: true,
    };
    assert!(principal(&Principal::Header(absent), &a));
}

/// istiod's shadow RBAC filter for a CUSTOM policy names the requests it selects in the
/// metadata key the ext_authz filter reads; another filter's shadow rules (dry-run ALLOW)
/// write under their own prefix.
#[test]
fn shadow_rules_leave_envoys_metadata() {
    let h = http::HeaderMap::new();
    let custom = Rbac {
        shadow_rules_stat_prefix: "istio_ext_authz_".into(),
        ..filter(
            None,
            Some(rules(
                Action::Deny,
                &[(
                    "istio-ext-authz-ns[default]-policy[ext]-rule[0]",
                    allow_sleep(),
                )],
            )),
        )
    };
    let dry_run = Rbac {
        shadow_rules_stat_prefix: "istio_dry_run_allow_".into(),
        ..filter(
            None,
            Some(rules(
                Action::Allow,
                &[("ns[default]-policy[dry]-rule[0]", allow_sleep())],
            )),
        )
    };
    let filters = [dry_run, custom];
    let key = "istio_ext_authz_shadow_effective_policy_id";
    let selected = request(Some(SLEEP), "GET", "/info/x", &h);
    assert_eq!(
        shadow_metadata(&filters, &selected, key),
        Some("istio-ext-authz-ns[default]-policy[ext]-rule[0]")
    );
    assert_eq!(
        shadow_metadata(&filters, &selected, "istio_ext_authz_shadow_engine_result"),
        Some("denied")
    );
    assert_eq!(
        shadow_metadata(
            &filters,
            &selected,
            "istio_dry_run_allow_shadow_effective_policy_id"
        ),
        Some("ns[default]-policy[dry]-rule[0]")
    );
    // Not selected: no policy id is written, the engine result says allowed.
    let other = request(Some(OTHER), "GET", "/info/x", &h);
    assert_eq!(shadow_metadata(&filters, &other, key), None);
    assert_eq!(
        shadow_metadata(&filters, &other, "istio_ext_authz_shadow_engine_result"),
        Some("allowed")
    );
    // A key no filter writes.
    assert_eq!(
        shadow_metadata(&filters, &selected, "shadow_effective_policy_id"),
        None
    );
}

#[test]
fn authenticated_principals_match_uri_sans_then_dns_sans_then_the_subject() {
    // Envoy's rule: any URI SAN, else any DNS SAN, else the subject (RFC 2253).
    let spiffe = peer_with(vec![uri(SLEEP), dns("sleep.default.svc")], "sleep");
    let dns_only = peer_with(vec![dns("a.example.com"), dns("b.example.com")], "client");
    let subject_only = peer_with(vec![], "legacy-client");
    let base = Attributes {
        source: "10.1.0.7:40000".parse().expect("addr"),
        destination: "10.1.0.9:9000".parse().expect("addr"),
        principal: None,
        peer: None,
        sni: None,
        request: None,
    };
    let of = |peer: &crate::tls::Peer, m: StringMatcher| {
        let a = Attributes {
            principal: peer
                .spiffe_id
                .as_ref()
                .map(crate::identity::SpiffeId::as_str),
            peer: Some(peer),
            ..base
        };
        principal(&Principal::Authenticated(Some(m)), &a)
    };
    assert!(of(&spiffe, StringMatcher::exact(SLEEP)));
    assert!(of(&spiffe, StringMatcher::exact("sleep.default.svc")));
    assert!(of(&spiffe, StringMatcher::exact("CN=sleep")));
    assert!(!of(&spiffe, StringMatcher::exact(OTHER)));
    assert!(of(&dns_only, StringMatcher::exact("b.example.com")));
    assert!(of(&dns_only, prefix("a.example")));
    assert!(of(&dns_only, StringMatcher::exact("CN=client")));
    assert!(!of(&dns_only, prefix("spiffe://")));
    assert!(of(&subject_only, StringMatcher::exact("CN=legacy-client")));
    assert!(!of(&subject_only, StringMatcher::exact("legacy-client")));
    // Any authenticated peer, whatever its certificate names; none without mutual TLS.
    for peer in [&spiffe, &dns_only, &subject_only] {
        let a = Attributes {
            peer: Some(peer),
            ..base
        };
        assert!(principal(&Principal::Authenticated(None), &a));
    }
    assert!(!principal(&Principal::Authenticated(None), &base));
}
