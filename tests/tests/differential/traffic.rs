//! Istio's traffic-management tasks that need no second service, as istiod writes their
//! VirtualServices, served to Envoy and Remora alike (`xds_differential.rs` runs them):
//!
//! - **request timeouts** (`timeout: 0.5s` on a slow upstream: 504 `UT`, after the request
//!   reached it);
//! - **fault injection** (a delay, 7 s in Istio's task, shortened here; an HTTP abort; a gRPC
//!   abort; a delay and an abort together; fractions of requests);
//! - **retries** on a flaky upstream (`retries: {attempts, retryOn, perTryTimeout}`, and
//!   Istio's default policy), the attempts counted at the backend.
//!
//! Each behaviour is a route of the `web` virtual host for `/flaky/` chosen by the request's
//! `x-case` header; the backend misbehaves as the path says ([`remora_e2e::backend`]).

use super::{istio_retry_policy, A};
use serde_json::{json, Value};

/// The shortened delay of Istio's fault-injection task (7 s there).
pub const DELAY_MS: u64 = 500;
/// The route timeout of Istio's request-timeouts task (0.5 s there too).
pub const TIMEOUT_MS: u64 = 500;
/// A per-try timeout, well under the backend's slow answer.
pub const PER_TRY_MS: u64 = 300;

/// What istiod writes for a VirtualService `retries` block: Istio's default policy with the
/// task's attempts and retryOn (status codes among them become `retriable_status_codes`).
fn retries(retry_on: &str, attempts: u32, codes: &[u16]) -> Value {
    let mut p = istio_retry_policy();
    p["retry_on"] = json!(retry_on);
    p["num_retries"] = json!(attempts);
    if !codes.is_empty() {
        p["retriable_status_codes"] = json!(codes);
    }
    p
}

/// istiod's per-route fault config (percentages over a million).
fn fault(f: Value) -> Value {
    let mut f = f;
    f["@type"] = json!("type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault");
    json!({"envoy.filters.http.fault": f})
}

fn million(percent: f64) -> Value {
    json!({"numerator": (percent * 10_000.0) as u32, "denominator": "MILLION"})
}

fn secs(ms: u64) -> String {
    format!("{}s", ms as f64 / 1000.0)
}

/// A fault config aborting every request with a 503.
pub fn abort_all() -> Value {
    fault(json!({"abort": {"http_status": 503, "percentage": million(100.0)}}))
}

/// The `/flaky/` routes, one per `x-case`.
pub fn routes() -> Vec<Value> {
    let route = |case: &str, action: Value, per_filter: Option<Value>| {
        let mut r = json!({
            "match": {"prefix": "/flaky/", "headers": [{"name": "x-case", "string_match": {"exact": case}}]},
            "route": action
        });
        if let Some(f) = per_filter {
            r["typed_per_filter_config"] = f;
        }
        r
    };
    let local = |case: &str, action: Value, per_filter: Value| {
        let mut r = json!({
            "match": {"prefix": "/flaky/", "headers": [{"name": "x-case", "string_match": {"exact": case}}]},
            "typed_per_filter_config": per_filter
        });
        if let (Some(r), Some(a)) = (r.as_object_mut(), action.as_object()) {
            r.extend(a.clone());
        }
        r
    };
    let to_a = |retry: Option<Value>| {
        let mut a = json!({"cluster": A, "timeout": "0s"});
        if let Some(r) = retry {
            a["retry_policy"] = r;
        }
        a
    };
    let with = |mut a: Value, key: &str, v: Value| {
        a[key] = v;
        a
    };
    let default = || Some(istio_retry_policy());
    let mut per_try = retries("5xx", 2, &[]);
    per_try["per_try_timeout"] = json!(secs(PER_TRY_MS));
    let mut per_try_default = istio_retry_policy();
    per_try_default["per_try_timeout"] = json!(secs(PER_TRY_MS));
    let mut backoff = retries("5xx", 3, &[]);
    backoff["retry_back_off"] = json!({"base_interval": "0.05s"});
    vec![
        route("istio-default", to_a(default()), None),
        route("no-retries", to_a(None), None),
        route("5xx", to_a(Some(retries("5xx", 2, &[]))), None),
        route(
            "gateway-error",
            to_a(Some(retries("gateway-error", 2, &[]))),
            None,
        ),
        route(
            "retriable-4xx",
            to_a(Some(retries("retriable-4xx", 2, &[]))),
            None,
        ),
        route(
            "codes",
            to_a(Some(retries("retriable-status-codes", 2, &[418]))),
            None,
        ),
        route("reset", to_a(Some(retries("reset", 2, &[]))), None),
        route(
            "grpc",
            to_a(Some(retries(
                "deadline-exceeded,internal,resource-exhausted",
                2,
                &[],
            ))),
            None,
        ),
        route(
            "per-try",
            with(to_a(Some(per_try)), "timeout", json!("5s")),
            None,
        ),
        route("per-try-default", to_a(Some(per_try_default)), None),
        route("backoff", to_a(Some(backoff)), None),
        route(
            "timeout",
            with(to_a(default()), "timeout", json!(secs(TIMEOUT_MS))),
            None,
        ),
        route(
            "abort",
            to_a(default()),
            Some(fault(
                json!({"abort": {"http_status": 503, "percentage": million(100.0)}}),
            )),
        ),
        route(
            "abort-grpc",
            to_a(default()),
            Some(fault(
                json!({"abort": {"grpc_status": 14, "percentage": million(100.0)}}),
            )),
        ),
        route(
            "delay",
            to_a(default()),
            Some(fault(
                json!({"delay": {"fixed_delay": secs(DELAY_MS), "percentage": million(100.0)}}),
            )),
        ),
        route(
            "delay-abort",
            to_a(default()),
            Some(fault(json!({
                "delay": {"fixed_delay": "0.2s", "percentage": million(100.0)},
                "abort": {"http_status": 400, "percentage": million(100.0)}
            }))),
        ),
        route(
            "delay-timeout",
            with(to_a(default()), "timeout", json!("0.3s")),
            Some(fault(
                json!({"delay": {"fixed_delay": secs(DELAY_MS), "percentage": million(100.0)}}),
            )),
        ),
        // Faults on routes that answer here: Envoy's fault filter runs before its router.
        local(
            "direct-abort",
            json!({"direct_response": {"status": 200, "body": {"inline_string": "direct"}}}),
            abort_all(),
        ),
        local(
            "direct-delay",
            json!({"direct_response": {"status": 200, "body": {"inline_string": "direct"}}}),
            fault(json!({"delay": {"fixed_delay": "0.2s", "percentage": million(100.0)}})),
        ),
        local(
            "redirect-delay",
            json!({"redirect": {"path_redirect": "/moved"}}),
            fault(json!({"delay": {"fixed_delay": "0.2s", "percentage": million(100.0)}})),
        ),
        route(
            "abort-half",
            to_a(default()),
            Some(fault(
                json!({"abort": {"http_status": 500, "percentage": million(50.0)}}),
            )),
        ),
        route(
            "delay-tenth",
            to_a(default()),
            Some(fault(json!({"delay": {"fixed_delay": "0.2s",
                "percentage": {"numerator": 10, "denominator": "HUNDRED"}}}))),
        ),
    ]
}
