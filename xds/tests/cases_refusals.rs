//! What Remora accepts and refuses of `xds/tests/cases/`, through `remora xds validate`'s own
//! path ([`validate_dir`]). `gaps` holds what istiod really sends and Envoy 1.40 accepts
//! (`cases_envoy.rs` checks that) but Remora's model refuses: one resource per feature, each
//! refused with the field named. They are the gaps the traffic-management work must close;
//! when one closes, its line here fails and its resource moves to an accepted case.
//! `envoy-rejects` holds what Envoy rejects: Remora must refuse each too.

mod cases_support;

use cases_support::*;
use remora_xds::refusal::Kind;
use remora_xds::validate::{validate_dir, Verdict};

fn verdicts(case: &str) -> Vec<Verdict> {
    validate_dir(&cases_dir().join(case)).unwrap_or_else(|e| panic!("{case}: {e}"))
}

#[test]
fn remora_accepts_every_resource_of_the_behaviour_cases() {
    for case in [
        "traffic-split",
        "redirect-rewrite",
        "dns-static",
        "tcp-split",
        "istiod-defaults",
        "faults-retries",
        "cors",
        "resilience",
        "mirror",
        "consistent-hash",
        "tls-origination",
    ] {
        let verdicts = verdicts(case);
        let want = ["listeners", "clusters", "routes", "endpoints"]
            .iter()
            .map(|k| raw(case, k).len())
            .sum::<usize>();
        assert_eq!(verdicts.len(), want, "{case}: every resource judged");
        for v in &verdicts {
            assert!(v.refusal.is_none(), "{case}: {v}");
        }
    }
}

/// Each resource of `gaps`: its kind and name, the field refused and why. What istiod writes
/// it for is in the comment.
const GAPS: [(Kind, &str, &str, &str); 4] = [
    // VirtualService rewrite.uriRegexRewrite (and GAMMA's rewrite to `/`).
    (
        Kind::Route,
        "regex-rewrite",
        "virtual_hosts[0].routes[0].route.regex_rewrite",
        "field not supported (in envoy.config.route.v3.RouteAction)",
    ),
    // VirtualService match.withoutHeaders.
    (
        Kind::Route,
        "without-headers",
        "virtual_hosts[0].routes[0].match.headers[0].treat_missing_header_as_empty",
        "field not supported (in envoy.config.route.v3.HeaderMatcher)",
    ),
    // VirtualService route[].headers.request.set `:authority` on a weighted destination.
    (
        Kind::Route,
        "weighted-authority",
        "virtual_hosts[0].routes[0].route.weighted_clusters.clusters[0].host_rewrite_literal",
        "field not supported (in envoy.config.route.v3.WeightedCluster.ClusterWeight)",
    ),
    // A rewrite with ProxyConfig's X-Forwarded-Host on.
    (
        Kind::Route,
        "x-forwarded-host",
        "virtual_hosts[0].routes[0].route.append_x_forwarded_host",
        "field not supported (in envoy.config.route.v3.RouteAction)",
    ),
];

#[test]
fn remora_refuses_each_gap_naming_the_field() {
    let verdicts = verdicts("gaps");
    assert_eq!(verdicts.len(), GAPS.len(), "one verdict per gap");
    for (v, (kind, name, path, reason)) in verdicts.iter().zip(GAPS) {
        assert_eq!((v.kind, v.name.as_str()), (kind, name));
        let r = v
            .refusal
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: accepted"));
        assert_eq!(r.path, path, "{name}: {r}");
        assert_eq!(r.reason, reason, "{name}: {r}");
        assert_eq!((r.kind, r.name.as_str()), (kind, name));
    }
}

/// Each resource of `envoy-rejects`: the field Remora refuses and a part of its reason
/// (Envoy's own reasons are checked in `cases_envoy.rs`).
const ENVOY_REJECTS: [(&str, &str, &str); 4] = [
    (
        "bad-path-regex",
        "virtual_hosts[0].routes[0].match.safe_regex.regex",
        "unclosed group",
    ),
    (
        "bad-header-regex",
        "virtual_hosts[0].routes[0].match.headers[0].string_match.safe_regex.regex",
        "unclosed group",
    ),
    (
        "zero-weights",
        "virtual_hosts[0].routes[0].route.weighted_clusters",
        "the sum of the weights must be greater than 0",
    ),
    (
        "direct-response-status-99",
        "virtual_hosts[0].routes[0].direct_response.status",
        "status 99 is not in [200, 600)",
    ),
];

#[test]
fn remora_refuses_what_envoy_rejects() {
    let verdicts = verdicts("envoy-rejects");
    assert_eq!(verdicts.len(), ENVOY_REJECTS.len());
    for (v, (name, path, reason)) in verdicts.iter().zip(ENVOY_REJECTS) {
        assert_eq!((v.kind, v.name.as_str()), (Kind::Route, name));
        let r = v
            .refusal
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: accepted"));
        assert_eq!(r.path, path, "{name}: {r}");
        assert!(r.reason.contains(reason), "{name}: {r} (want {reason:?})");
    }
}
