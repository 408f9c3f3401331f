//! Policies as users write them, decided against requests and connections, table by table.

use super::compile::Context;
use super::engine::{PolicySet, Reason};
use super::load::{build, Workload};
use super::path::normalize;
use super::{Attributes, Request};
use remora_config::PathNormalization;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

const X: &str = "spiffe://cluster.local/ns/client/sa/sleep";
const Y: &str = "spiffe://cluster.local/ns/other/sa/intruder";

fn workload() -> Workload {
    Workload {
        namespace: Some("server".into()),
        labels: [("app".to_string(), "httpbin".to_string())].into(),
    }
}

fn built(yaml: &str) -> Result<super::load::Built, super::policy::PolicyError> {
    let files = vec![(PathBuf::from("p.yaml"), yaml.as_bytes().to_vec())];
    let ctx = Context {
        trust_domains: vec!["cluster.local".into()],
    };
    build(&files, &ctx, &workload(), "istio-system")
}

fn set(yaml: &str) -> PolicySet {
    built(yaml).unwrap_or_else(|e| panic!("{e}")).set
}

/// A policy for the test workload: `spec` is the YAML under `spec:`, indented two spaces.
fn policy(spec: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: p\n  \
         namespace: server\nspec:\n{spec}"
    )
}

struct Req<'a> {
    principal: Option<&'a str>,
    method: &'a str,
    /// As sent: normalised here as the proxy does.
    path: &'a str,
    host: Option<&'a str>,
    headers: &'a [(&'a str, &'a str)],
    port: u16,
}

const GET: Req<'static> = Req {
    principal: Some(X),
    method: "GET",
    path: "/",
    host: Some("httpbin.server:8080"),
    headers: &[],
    port: 8080,
};

fn source() -> SocketAddr {
    "10.1.0.5:40000".parse().expect("address")
}

fn http(set: &PolicySet, r: &Req<'_>) -> bool {
    let mut headers = http::HeaderMap::new();
    for (k, v) in r.headers {
        headers.append(
            http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            http::HeaderValue::from_str(v).expect("value"),
        );
    }
    let path = normalize(r.path, PathNormalization::Base).expect("normalizable");
    let path = path.split('?').next().unwrap_or("/");
    let a = Attributes {
        source: source(),
        destination: SocketAddr::from(([10, 1, 0, 9], r.port)),
        principal: r.principal,
        peer: None,
        sni: None,
        request: Some(Request {
            method: r.method,
            path,
            query: None,
            host: r.host,
            headers: &headers,
        }),
    };
    set.evaluate(&a).allowed()
}

fn tcp(set: &PolicySet, principal: Option<&str>, port: u16) -> bool {
    let a = Attributes {
        source: source(),
        destination: SocketAddr::from(([10, 1, 0, 9], port)),
        principal,
        peer: None,
        sni: None,
        request: None,
    };
    set.evaluate(&a).allowed()
}

#[test]
fn no_policy_allows_and_allow_nothing_denies() {
    assert!(set("").is_empty());
    assert!(http(&set(""), &GET));
    let nothing = set(&policy("  {}\n"));
    assert!(!http(&nothing, &GET));
    assert!(!tcp(&nothing, Some(X), 9000));
    let everything = set(&policy("  rules:\n  - {}\n"));
    assert!(http(&everything, &GET));
    assert!(tcp(&everything, None, 9000));
}

#[test]
fn allow_principal_and_public_paths() {
    let s = set(&policy(
        "  action: ALLOW\n  rules:\n  - from:\n    - source:\n        principals: \
         [\"cluster.local/ns/client/sa/sleep\"]\n    to:\n    - operation:\n        \
         paths: [\"/public*\"]\n",
    ));
    let cases = [
        (Some(X), "/public/a", true),
        (Some(X), "/public", true),
        (Some(X), "/admin", false),
        (Some(X), "/public/../admin", false),
        (Some(Y), "/public/a", false),
        (None, "/public/a", false),
    ];
    for (principal, path, allowed) in cases {
        let r = Req {
            principal,
            path,
            ..GET
        };
        assert_eq!(http(&s, &r), allowed, "{principal:?} {path}");
    }
}

#[test]
fn deny_admin_is_not_bypassed_by_path_tricks() {
    let s = set(&policy(
        "  action: DENY\n  rules:\n  - to:\n    - operation:\n        paths: [\"/admin\"]\n",
    ));
    for path in [
        "/admin",
        "/./admin",
        "/%2e/admin",
        "/%2E/admin",
        "/x/../admin",
        "/admin/../admin",
        "/x/%2e%2e/admin",
        "/%61dmin",
        "/x\\..\\admin",
        "/admin?x=1",
    ] {
        assert!(!http(&s, &Req { path, ..GET }), "{path} was allowed");
    }
    // Istio's BASE keeps repeated and encoded slashes, and paths are case-sensitive.
    for path in ["//admin", "/admin/", "/ADMIN", "/admin2", "/a%2Fadmin"] {
        assert!(http(&s, &Req { path, ..GET }), "{path} was denied");
    }
}

#[test]
fn deny_wins_over_allow_and_names_its_rule() {
    let yaml = format!(
        "{}---\n{}",
        policy("  rules:\n  - {}\n"),
        policy(
            "  action: DENY\n  rules:\n  - to:\n    - operation:\n        methods: [\"DELETE\"]\n"
        )
        .replace("name: p", "name: no-delete")
    );
    let s = set(&yaml);
    assert!(http(&s, &GET));
    assert!(!http(
        &s,
        &Req {
            method: "DELETE",
            ..GET
        }
    ));
    // Methods are case-sensitive, as Envoy's header matcher is.
    assert!(http(
        &s,
        &Req {
            method: "delete",
            ..GET
        }
    ));
    let a = Attributes {
        source: source(),
        destination: "10.1.0.9:8080".parse().expect("address"),
        principal: None,
        peer: None,
        sni: None,
        request: Some(Request {
            method: "DELETE",
            path: "/",
            query: None,
            host: None,
            headers: &http::HeaderMap::new(),
        }),
    };
    let d = s.evaluate(&a);
    assert_eq!(
        d.reason,
        Reason::DenyMatched("ns[server]-policy[no-delete]-rule[0]")
    );
    assert_eq!(
        d.denial_details(),
        "rbac_access_denied_matched_policy[ns[server]-policy[no-delete]-rule[0]]"
    );
}

#[test]
fn not_fields_exclude() {
    let s = set(&policy(
        "  rules:\n  - from:\n    - source:\n        notPrincipals: [\"*/sa/intruder\"]\n    to:\n    \
         - operation:\n        notPaths: [\"/private/*\"]\n        notMethods: [\"POST\"]\n",
    ));
    assert!(http(&s, &GET));
    assert!(
        http(
            &s,
            &Req {
                principal: None,
                ..GET
            }
        ),
        "plaintext is not the intruder"
    );
    assert!(!http(
        &s,
        &Req {
            principal: Some(Y),
            ..GET
        }
    ));
    assert!(!http(
        &s,
        &Req {
            path: "/private/x",
            ..GET
        }
    ));
    assert!(!http(
        &s,
        &Req {
            method: "POST",
            ..GET
        }
    ));
}

#[test]
fn principal_namespace_and_service_account_forms() {
    let cases = [
        ("principals: [\"cluster.local/ns/client/*\"]", X, true),
        ("principals: [\"*/sa/sleep\"]", X, true),
        ("principals: [\"*\"]", X, true),
        (
            "principals: [\"cluster.local/ns/client/sa/sleep\"]",
            Y,
            false,
        ),
        ("namespaces: [\"client\"]", X, true),
        ("namespaces: [\"cli*\"]", X, true),
        ("namespaces: [\"*\"]", Y, true),
        ("namespaces: [\"client\"]", Y, false),
        ("serviceAccounts: [\"client/sleep\"]", X, true),
        ("serviceAccounts: [\"sleep\"]", X, false),
        ("trustDomains: [\"cluster.local\"]", X, true),
        ("trustDomains: [\"other.td\"]", X, false),
        ("trustDomains: [\"*\"]", Y, true),
        ("notNamespaces: [\"other\"]", Y, false),
    ];
    for (field, principal, allowed) in cases {
        let s = set(&policy(&format!(
            "  rules:\n  - from:\n    - source:\n        {field}\n"
        )));
        let r = Req {
            principal: Some(principal),
            ..GET
        };
        assert_eq!(http(&s, &r), allowed, "{field} for {principal}");
        // Plaintext has no identity: identity fields never match it.
        if !field.starts_with("not") {
            assert!(
                !http(
                    &s,
                    &Req {
                        principal: None,
                        ..GET
                    }
                ),
                "{field} plaintext"
            );
        }
    }
}

#[test]
fn cluster_local_stands_for_the_workloads_trust_domain() {
    let files = vec![(
        PathBuf::from("p.yaml"),
        policy("  rules:\n  - from:\n    - source:\n        principals: [\"cluster.local/ns/client/sa/sleep\"]\n")
            .into_bytes(),
    )];
    let ctx = Context {
        trust_domains: vec!["example.org".into(), "old.td".into()],
    };
    let s = build(&files, &ctx, &workload(), "istio-system")
        .expect("valid")
        .set;
    for (id, allowed) in [
        ("spiffe://example.org/ns/client/sa/sleep", true),
        ("spiffe://old.td/ns/client/sa/sleep", true),
        ("spiffe://cluster.local/ns/client/sa/sleep", false),
    ] {
        assert_eq!(
            http(
                &s,
                &Req {
                    principal: Some(id),
                    ..GET
                }
            ),
            allowed,
            "{id}"
        );
    }
}

#[test]
fn tcp_sees_ports_and_http_only_fields_as_istio_does() {
    let only_9000 = set(&policy(
        "  rules:\n  - to:\n    - operation:\n        ports: [\"9000\"]\n",
    ));
    assert!(tcp(&only_9000, None, 9000));
    assert!(!tcp(&only_9000, None, 9001));
    assert!(http(&only_9000, &Req { port: 9000, ..GET }));
    assert!(!http(&only_9000, &GET));

    // ALLOW with an HTTP-only field: the rule never matches TCP.
    let allow_get = set(&policy(
        "  rules:\n  - to:\n    - operation:\n        ports: [\"9000\"]\n        methods: [\"GET\"]\n",
    ));
    assert!(!tcp(&allow_get, Some(X), 9000));
    assert!(http(&allow_get, &Req { port: 9000, ..GET }));

    // DENY with only HTTP fields: on TCP those are ignored, so it denies everything.
    let deny_admin = set(&policy(
        "  action: DENY\n  rules:\n  - to:\n    - operation:\n        paths: [\"/admin\"]\n",
    ));
    assert!(!tcp(&deny_admin, Some(X), 9000));
    assert!(http(&deny_admin, &GET));
    // With a port, only that port.
    let deny_port = set(&policy(
        "  action: DENY\n  rules:\n  - to:\n    - operation:\n        ports: [\"9000\"]\n        \
         paths: [\"/admin\"]\n",
    ));
    assert!(!tcp(&deny_port, None, 9000));
    assert!(tcp(&deny_port, None, 9001));
    // Request principals: never there (no JWT); on TCP an ALLOW naming them never matches.
    let jwt = set(&policy(
        "  rules:\n  - from:\n    - source:\n        requestPrincipals: [\"*\"]\n",
    ));
    assert!(!http(&jwt, &GET));
    assert!(!tcp(&jwt, Some(X), 9000));
    let no_jwt = set(&policy(
        "  rules:\n  - from:\n    - source:\n        notRequestPrincipals: [\"*\"]\n",
    ));
    assert!(http(&no_jwt, &GET));
}

#[test]
fn conditions_and_addresses() {
    let when = |cond: &str| set(&policy(&format!("  rules:\n  - when:\n    - {cond}\n")));
    let s = when("key: request.headers[x-user]\n      values: [\"alice\", \"bo*\"]");
    assert!(http(
        &s,
        &Req {
            headers: &[("x-user", "bob")],
            ..GET
        }
    ));
    assert!(!http(
        &s,
        &Req {
            headers: &[("x-user", "eve")],
            ..GET
        }
    ));
    assert!(!http(&s, &GET));
    let s = when("key: request.headers[x-user]\n      notValues: [\"eve\"]");
    assert!(http(&s, &GET));
    assert!(!http(
        &s,
        &Req {
            headers: &[("x-user", "eve")],
            ..GET
        }
    ));
    let s = when("key: source.ip\n      values: [\"10.1.0.0/16\"]");
    assert!(http(&s, &GET));
    let s = when("key: source.ip\n      notValues: [\"10.1.0.5\"]");
    assert!(!http(&s, &GET));
    assert!(!tcp(&s, None, 9000));
    let s = when("key: remote.ip\n      values: [\"192.0.2.0/24\"]");
    assert!(!http(&s, &GET));
    assert!(http(
        &s,
        &Req {
            headers: &[("x-forwarded-for", "203.0.113.1, 192.0.2.7")],
            ..GET
        }
    ));
    let s = when("key: destination.port\n      values: [\"8080\"]");
    assert!(http(&s, &GET));
    assert!(!tcp(&s, None, 9000));
    let s = when("key: request.auth.claims[iss]\n      values: [\"*\"]");
    assert!(!http(&s, &GET));
    let s = when("key: source.principal\n      values: [\"cluster.local/ns/client/sa/sleep\"]");
    assert!(http(&s, &GET));
    assert!(!http(
        &s,
        &Req {
            principal: Some(Y),
            ..GET
        }
    ));
    let s = set(&policy("  rules:\n  - from:\n    - source:\n        ipBlocks: [\"10.1.0.0/24\"]\n        notIpBlocks: [\"10.1.0.5\"]\n"));
    assert!(!tcp(&s, None, 9000));
}

#[test]
fn hosts_ignore_case_but_not_ports_and_templates_match_segments() {
    let s = set(&policy("  rules:\n  - to:\n    - operation:\n        hosts: [\"HTTPBIN.server\", \"*.example.com\"]\n"));
    assert!(http(
        &s,
        &Req {
            host: Some("httpbin.server"),
            ..GET
        }
    ));
    assert!(http(
        &s,
        &Req {
            host: Some("a.Example.COM"),
            ..GET
        }
    ));
    assert!(!http(
        &s,
        &Req {
            host: Some("httpbin.server:8080"),
            ..GET
        }
    ));
    assert!(!http(&s, &Req { host: None, ..GET }));
    let s = set(&policy("  rules:\n  - to:\n    - operation:\n        paths: [\"/api/{*}/items\", \"/files/{**}\"]\n"));
    for (path, allowed) in [
        ("/api/v1/items", true),
        ("/api/v1/v2/items", false),
        ("/api//items", false),
        ("/files/", true),
        ("/files/a/b.txt", true),
        ("/files", false),
    ] {
        assert_eq!(http(&s, &Req { path, ..GET }), allowed, "{path}");
    }
}

#[test]
fn policies_select_by_namespace_labels_and_target() {
    let p = |ns: &str, extra: &str| {
        policy(&format!("{extra}  rules:\n  - {{}}\n"))
            .replace("namespace: server", &format!("namespace: {ns}"))
    };
    // Applies: an allow-all means "an ALLOW policy applies"; the test asks whether it does.
    let applies = |yaml: String| !set(&yaml).is_empty();
    assert!(applies(p("server", "")));
    assert!(applies(p("istio-system", "")));
    assert!(!applies(p("elsewhere", "")));
    assert!(applies(p(
        "server",
        "  selector:\n    matchLabels:\n      app: httpbin\n"
    )));
    assert!(!applies(p(
        "server",
        "  selector:\n    matchLabels:\n      app: other\n"
    )));
    assert!(applies(p(
        "istio-system",
        "  selector:\n    matchLabels:\n      app: httpbin\n"
    )));
    assert!(!applies(p(
        "server",
        "  targetRefs:\n  - kind: Gateway\n    group: gateway.networking.k8s.io\n    name: gw\n"
    )));
}

#[test]
fn custom_fails_closed_audit_and_dry_run_decide_nothing() {
    // No external authorizer: what a CUSTOM policy's rules match is denied, as istiod makes
    // DENY rules of a CUSTOM policy whose provider it cannot use.
    let custom = policy(
        "  action: CUSTOM\n  provider:\n    name: ext\n  rules:\n  - to:\n    - operation:\n        paths: [\"/ext\"]\n",
    );
    let s = set(&custom);
    assert_eq!(s.custom, vec!["server/p".to_string()]);
    assert!(http(&s, &GET));
    assert!(!http(
        &s,
        &Req {
            path: "/ext",
            ..GET
        }
    ));
    let audit = set(&policy("  action: AUDIT\n  rules:\n  - {}\n"));
    assert!(http(&audit, &GET));
    let dry = policy("  action: DENY\n  rules:\n  - {}\n").replace(
        "  name: p\n",
        "  name: p\n  annotations:\n    istio.io/dry-run: \"true\"\n",
    );
    let s = set(&dry);
    assert!(http(&s, &GET));
    assert_eq!(s.counts.dry_run, 1);
}

#[test]
fn other_kinds_are_skipped_and_errors_name_file_line_and_field() {
    let mixed = format!(
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata:\n  name: x\nspec:\n  \
         mtls:\n    mode: STRICT\n---\n{}",
        policy("  rules:\n  - {}\n")
    );
    assert_eq!(
        built(&mixed).expect("valid").applied,
        vec!["server/p".to_string()]
    );
    let cases: [(&str, usize, &str); 9] = [
        ("  action: DENY\n", 7, "DENY action without `rules`"),
        (
            "  rules:\n  - to:\n    - operation:\n        portz: [\"1\"]\n",
            10,
            "unknown field `portz`",
        ),
        (
            "  rules:\n  - to:\n    - operation:\n        ports: [\"http\"]\n",
            10,
            "bad port",
        ),
        (
            "  rules:\n  - from:\n    - source:\n        ipBlocks:\n        - 10.0.0.0/40\n",
            11,
            "bad CIDR",
        ),
        (
            "  rules:\n  - when:\n    - key: destination.labels[app]\n      values: [\"a\"]\n",
            9,
            "workload selector",
        ),
        (
            "  rules:\n  - {}\n  - from:\n    - source: {}\n",
            10,
            "must not be empty",
        ),
        (
            "  rules:\n  - to:\n    - operation:\n        paths: [\"/a/{**}/{*}\"]\n",
            10,
            "not the last",
        ),
        (
            "  action: ALLOW\n  provider:\n    name: x\n",
            8,
            "only allowed with the CUSTOM",
        ),
        (
            "  rules:\n  - when:\n    - key: source.ip\n",
            9,
            "at least one of",
        ),
    ];
    for (spec, line, message) in cases {
        let err = built(&policy(spec)).expect_err(spec);
        assert_eq!(err.line(), Some(line), "{spec}: {err}");
        let text = err.to_string();
        assert!(text.starts_with(&format!("p.yaml:{line}")), "{text}");
        assert!(text.contains(message), "{text}");
    }
    let err =
        built(&policy("  {}\n").replace("  namespace: server\n", "")).expect_err("no namespace");
    assert!(err.to_string().contains("metadata.namespace"), "{err}");
    let err = built(&policy("  {}\n").replace("/v1\n", "/v1alpha1\n")).expect_err("old version");
    assert_eq!(err.line(), Some(1));
    assert!(Path::new("p.yaml").extension().is_some());
}

/// The plain-path shortcut changes nothing: a path of bytes canonicalisation keeps is returned
/// as it is, and any other still goes through it.
#[test]
fn plain_paths_are_kept_and_others_still_normalised() {
    use std::borrow::Cow;
    for plain in [
        "/",
        "/a/b",
        "//a//b",
        "/A-b_c~d/9:@!$&'()*+,;=",
        "/api?x=/../y%41",
    ] {
        assert!(
            matches!(normalize(plain, PathNormalization::Base), Ok(Cow::Borrowed(p)) if p == plain),
            "{plain}"
        );
    }
    for (path, normal) in [
        ("/a/./b", "/a/b"),
        ("/a/%2e%2E/b?q=/./", "/b?q=/./"),
        ("/%41b\\c", "/Ab/c"),
        ("/index.html", "/index.html"),
    ] {
        let got = normalize(path, PathNormalization::Base).expect("normalisable");
        assert_eq!(got, normal, "{path}");
    }
    assert!(normalize("/a%00", PathNormalization::Base).is_err());
}
