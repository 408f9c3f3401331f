//! The `x-envoy-*` request headers only Envoy's own hops may set: the router's controls
//! (deadlines, retries, an alternate stat name), tracing and tagging ones, and
//! `x-envoy-internal`. Envoy's connection manager takes them off every request it does not
//! deem internal, before its router could read them; under Istio's bootstrap (no
//! `internal_address_config`) it deems none internal, so a sidecar's application cannot set
//! its own deadline or retries this way (Envoy 1.40, seen by `xds_differential`). Remora takes
//! them off every request routed by xDS, on hyper's path (the HTTP/1.1 fast path hands such
//! requests over).

use http::header::HeaderMap;

/// The headers taken off: Envoy's `cleanInternalHeaders` (its edge-only ones aside) and
/// `x-envoy-internal`.
pub const NAMES: [&str; 15] = [
    "x-envoy-internal",
    "x-envoy-retriable-status-codes",
    "x-envoy-retriable-header-names",
    "x-envoy-retry-on",
    "x-envoy-retry-grpc-on",
    "x-envoy-max-retries",
    "x-envoy-upstream-alt-stat-name",
    "x-envoy-upstream-rq-timeout-ms",
    "x-envoy-upstream-rq-per-try-timeout-ms",
    "x-envoy-upstream-rq-timeout-alt-response",
    "x-envoy-expected-rq-timeout-ms",
    "x-envoy-force-trace",
    "x-envoy-ip-tags",
    "x-envoy-original-url",
    "x-envoy-hedge-on-per-try-timeout",
];

/// Take the internal headers off a client's request.
pub fn strip(headers: &mut HeaderMap) {
    for name in NAMES {
        headers.remove(name);
    }
}

/// Whether `name` is one of them (any case).
pub fn is_internal(name: &[u8]) -> bool {
    match name.get(..8) {
        Some(prefix) if prefix.eq_ignore_ascii_case(b"x-envoy-") => NAMES
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n.as_bytes())),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn internal_headers_are_taken_off_and_the_rest_kept() {
        let mut headers = HeaderMap::new();
        for name in NAMES.iter().chain(&[
            "x-envoy-attempt-count",
            "x-envoy-decorator-operation",
            "x-other",
        ]) {
            headers.insert(*name, HeaderValue::from_static("1"));
        }
        strip(&mut headers);
        let mut kept: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        kept.sort_unstable();
        assert_eq!(
            kept,
            [
                "x-envoy-attempt-count",
                "x-envoy-decorator-operation",
                "x-other"
            ]
        );
        assert!(is_internal(b"X-Envoy-Retry-On") && is_internal(b"x-envoy-internal"));
        assert!(
            !is_internal(b"x-envoy-attempt-count")
                && !is_internal(b"x-other")
                && !is_internal(b"x")
        );
    }
}
