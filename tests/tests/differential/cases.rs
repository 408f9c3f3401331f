//! The requests of the differential test (`xds_differential.rs`) whose single outcome Envoy
//! and Remora must agree on: by Host and path to port 80 ([`CASES`]), by Host to port 8080
//! ([`CASES_8080`]), and written byte for byte ([`RAW_CASES`]). Each exercises a route of
//! [`super::routes`].

use super::WEB;

/// One request: Host, path, extra headers.
pub type Case = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// The requests whose single outcome both proxies must agree on.
pub const CASES: &[Case] = &[
    // Virtual host by Host: exact, the port ignored, case, short names, the VIP.
    (WEB, "/", &[]),
    ("web.test.svc.cluster.local:80", "/", &[]),
    ("web.test.svc.cluster.local:8080", "/", &[]),
    ("WEB.Test.svc.cluster.local", "/", &[]),
    ("web", "/", &[]),
    ("10.96.0.10", "/", &[]),
    ("10.96.0.10:80", "/", &[]),
    // Wildcards: suffix, prefix, the longest suffix first, exact over wildcard.
    ("x.wild.test", "/", &[]),
    ("x.deep.wild.test", "/", &[]),
    ("exact.wild.test", "/", &[]),
    ("wild.test", "/", &[]),
    ("api.anything", "/", &[]),
    ("api.anything:9999", "/", &[]),
    // No virtual host: 404 NR.
    ("nowhere.test", "/", &[]),
    // Paths: exact, prefix, case, regex, path-separated prefix.
    (WEB, "/exact", &[]),
    (WEB, "/exact/more", &[]),
    (WEB, "/exact?q=1", &[]),
    (WEB, "/EXACT", &[]),
    (WEB, "/prefix/x", &[]),
    (WEB, "/prefixx", &[]),
    (WEB, "/caseless/x", &[]),
    (WEB, "/CASELESS/x", &[]),
    (WEB, "/re/123", &[]),
    (WEB, "/re/12a", &[]),
    (WEB, "/re/123?x=y", &[]),
    (WEB, "/sep", &[]),
    (WEB, "/sep/x", &[]),
    (WEB, "/separate", &[]),
    // Headers: exact, present, regex, inverted, several values.
    (WEB, "/hdr", &[("x-version", "v2")]),
    (WEB, "/hdr", &[("x-version", "v3")]),
    (WEB, "/hdr", &[]),
    (WEB, "/hdr-present", &[("x-flag", "")]),
    (WEB, "/hdr-present", &[("x-flag", "yes")]),
    (WEB, "/hdr-present", &[]),
    (WEB, "/hdr-regex", &[("x-user", "user-42")]),
    (WEB, "/hdr-regex", &[("x-user", "admin")]),
    (WEB, "/hdr-invert", &[("x-env", "prod")]),
    (WEB, "/hdr-invert", &[("x-env", "dev")]),
    (WEB, "/hdr-invert", &[]),
    (WEB, "/hdr", &[("x-version", "v2"), ("x-version", "v3")]),
    // A repeated header's values each on their own (Envoy 1.40): the second value matches,
    // and an inverted matcher is not matched when any value is.
    (WEB, "/hdr", &[("x-version", "v3"), ("x-version", "v2")]),
    (WEB, "/hdr-invert", &[("x-env", "dev"), ("x-env", "prod")]),
    (WEB, "/hdr-prefix", &[("x-user", "user-1")]),
    (WEB, "/hdr-prefix", &[("x-user", "admin")]),
    (WEB, "/hdr-suffix", &[("x-host", "a.test")]),
    (WEB, "/hdr-suffix", &[("x-host", "a.prod")]),
    (WEB, "/hdr-contains", &[("x-tag", "amidb")]),
    (WEB, "/hdr-contains", &[("x-tag", "ab")]),
    (WEB, "/hdr-ignore-case", &[("x-case", "VALUE")]),
    (WEB, "/hdr-ignore-case", &[("x-case", "valu")]),
    // Query parameters: exact, present, case, several, encoded.
    (WEB, "/query?canary=true", &[]),
    (WEB, "/query?canary=TRUE", &[]),
    (WEB, "/query?x=1&canary=true", &[]),
    (WEB, "/query?canary=false", &[]),
    (WEB, "/query", &[]),
    (WEB, "/query-present?debug", &[]),
    (WEB, "/query-present?debug=1", &[]),
    (WEB, "/query-present?nodebug=1", &[]),
    (WEB, "/query?canary=%74rue", &[]),
    (WEB, "/query?canary=true&canary=false", &[]),
    (WEB, "/query?canary=false&canary=true", &[]),
    (WEB, "/query-prefix?p=ABc", &[]),
    (WEB, "/query-prefix?p=b", &[]),
    // Exact paths without case, encoded separators, trailing dots.
    (WEB, "/Exact-CI", &[]),
    (WEB, "/exact-ci/x", &[]),
    (WEB, "/prefix%2Fx", &[]),
    ("web.test.svc.cluster.local.", "/", &[]),
    // Redirects.
    (WEB, "/old", &[]),
    (WEB, "/old?keep=1", &[]),
    (WEB, "/v1/items?id=3", &[]),
    (WEB, "/to-https/x", &[]),
    (WEB, "/strip?a=b", &[]),
    (WEB, "/moved-host/x", &[]),
    (WEB, "/moved-port/x", &[]),
    ("web.test.svc.cluster.local:80", "/moved-port/x", &[]),
    ("web.test.svc.cluster.local:80", "/to-https/x", &[]),
    ("web.test.svc.cluster.local:8080", "/to-https/x?q", &[]),
    ("web.test.svc.cluster.local:8080", "/moved-host/x", &[]),
    (WEB, "/own-query?a=b", &[]),
    // Direct responses.
    (WEB, "/teapot", &[]),
    (WEB, "/empty-direct", &[]),
    (WEB, "/unavailable", &[]),
    // Rewrites.
    (WEB, "/rewrite/x?y=1", &[]),
    (WEB, "/rewrite", &[]),
    (WEB, "/rewrite-exact", &[]),
    (WEB, "/host-rewrite/x", &[]),
    // Header edits: route, virtual host and table; removals; request and response.
    (WEB, "/edits", &[("x-remove-me", "1"), ("x-keep", "1")]),
    (WEB, "/edits", &[("x-appended", "client")]),
    (WEB, "/edits", &[("x-overwritten", "client")]),
    // Timeouts, missing clusters, no endpoints.
    (WEB, "/slow", &[]),
    (WEB, "/no-cluster", &[]),
    (WEB, "/no-endpoint", &[]),
    // Istio's default retry policy: a backend that resets once.
    (WEB, "/reset-once", &[]),
    (WEB, "/reset-once", &[]),
    // An endpoint that refuses every connection, retried to the end; a 503 retried or not.
    (WEB, "/dead", &[]),
    (WEB, "/503-once-retried", &[]),
    (WEB, "/503-once", &[]),
    (WEB, "/503-once", &[]),
    // Envoy's internal headers from a client: taken off before the router (under Istio's
    // bootstrap no request is internal), so neither its deadline (0: none, in place of the
    // route's 0.5 s) nor its retry on 5xx applies, and none goes upstream.
    (
        WEB,
        "/slow-unbounded",
        &[("x-envoy-upstream-rq-timeout-ms", "0")],
    ),
    (
        WEB,
        "/503-once-by-header",
        &[("x-envoy-retry-on", "5xx"), ("x-envoy-max-retries", "1")],
    ),
    (WEB, "/exact", &[("x-envoy-internal", "true")]),
    // CORS (istiod's policy on the route): an allowed origin (exact, prefix, regex), one
    // that is not, none; a preflight is OPTIONS (in RAW_CASES).
    (WEB, "/cors", &[("origin", "https://a.example")]),
    (WEB, "/cors", &[("origin", "https://b.test")]),
    (WEB, "/cors-strict", &[("origin", "https://c42.example")]),
    (WEB, "/cors", &[("origin", "https://evil.example")]),
    (WEB, "/cors", &[("origin", "")]),
    (WEB, "/cors", &[]),
    (WEB, "/cors-fault", &[("origin", "https://a.example")]),
    (WEB, "/cors-no-cluster", &[("origin", "https://a.example")]),
];

/// Requests to the VIP's port 8080, whose table matches the Host's port.
pub const CASES_8080: &[Case] = &[
    ("web.test.svc.cluster.local:8080", "/", &[]),
    ("web.test.svc.cluster.local", "/", &[]),
    ("web:8080", "/", &[]),
    ("web", "/", &[]),
    ("web.test.svc.cluster.local:9999", "/", &[]),
    ("other.test", "/", &[]),
    // A CORS policy where the chain has no cors filter: nothing.
    (
        "web.test.svc.cluster.local",
        "/cors",
        &[("origin", "https://a.example")],
    ),
];

/// Requests written byte for byte, each on a connection of its own: protocol versions, forms
/// of target (a fragment among them), hop-by-hop headers, bodies.
pub const RAW_CASES: &[&str] = &[
    "GET / HTTP/1.0\r\nHost: web.test.svc.cluster.local\r\n\r\n",
    "GET http://web.test.svc.cluster.local/absolute HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n",
    "GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
    "GET /hop HTTP/1.1\r\nHost: web\r\nConnection: close, x-hop\r\nx-hop: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Connection: keep-alive\r\nUpgrade: foo\r\n\r\n",
    "POST /edits HTTP/1.1\r\nHost: web\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    "POST /chunked HTTP/1.1\r\nHost: web\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "HEAD /teapot HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n",
    "GET /edits HTTP/1.1\r\nHost: web\r\nx-forwarded-proto: https\r\nx-forwarded-for: 192.0.2.1\r\nx-request-id: given\r\nConnection: close\r\n\r\n",
    "GET /old HTTP/1.1\r\nHost: web\r\nx-forwarded-proto: https\r\nConnection: close\r\n\r\n",
    "GET /a/../exact HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n",
    // A fragment: stripped and the rest routed, by Envoy under Istio's bootstrap runtime
    // (`http_reject_path_with_fragment` off) and logged without it. Escaped, `#` is part of
    // the path.
    "GET /exact#frag HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n",
    "GET /query?canary=true#x HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n",
    "GET /exact%23frag HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n",
    // istiod's `normalize_path`: dot segments, escaped dots and unreserved characters,
    // backslashes; the query kept as written.
    "GET /x/./y/%2e%2e/../edits?a=/../b HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n",
    "GET /v1/%69tems%2Fz\\w HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n",
    // CORS preflights: from an allowed origin (answered by the proxy), from another (forwarded,
    // or answered without an allowed origin where unmatched preflights are not forwarded);
    // OPTIONS without a requested method is no preflight.
    "OPTIONS /cors HTTP/1.1\r\nHost: web\r\nOrigin: https://a.example\r\nAccess-Control-Request-Method: PUT\r\nAccess-Control-Request-Headers: x-custom\r\nConnection: close\r\n\r\n",
    "OPTIONS /cors HTTP/1.1\r\nHost: web\r\nOrigin: https://evil.example\r\nAccess-Control-Request-Method: PUT\r\nConnection: close\r\n\r\n",
    "OPTIONS /cors-strict HTTP/1.1\r\nHost: web\r\nOrigin: https://evil.example\r\nAccess-Control-Request-Method: PUT\r\nConnection: close\r\n\r\n",
    "OPTIONS /cors HTTP/1.1\r\nHost: web\r\nOrigin: https://b.x\r\nConnection: close\r\n\r\n",
    "OPTIONS /cors-fault HTTP/1.1\r\nHost: web\r\nOrigin: https://a.example\r\nAccess-Control-Request-Method: PUT\r\nConnection: close\r\n\r\n",
    // CONNECT: no route takes it (Envoy matches only `connect_matcher` routes), and the
    // connection ends; an upgrade the connection manager does not name is refused 403.
    "CONNECT web:80 HTTP/1.1\r\nHost: web:80\r\n\r\n",
    "GET /exact HTTP/1.1\r\nHost: web\r\nConnection: Upgrade\r\nUpgrade: foo\r\n\r\n",
    "OPTIONS * HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n",
];
