//! Istio's request-timeout, fault-injection and retry tasks ([`super::traffic`]) through Envoy
//! and Remora: per request the same outcome (status, backend, headers, the attempts the
//! backend saw) and the same response flags; fractions of faulted requests within a stated
//! tolerance in both; and the same per-try timeouts and connection closes counted on the
//! cluster.

use super::traffic::{DELAY_MS, PER_TRY_MS, TIMEOUT_MS};
use super::{A, WEB};
use crate::{nets_or_skip, worlds, Outcome, World};
use remora_e2e::backend::{CLOSE_AFTER, SEEN_HEADER, SLOW};
use remora_e2e::stat_deltas::{self, Stats};
use std::time::{Duration, Instant};

const GRPC: &[(&str, &str)] = &[("content-type", "application/grpc")];

/// Extra request headers.
type Headers = &'static [(&'static str, &'static str)];

/// `x-case` (the route), how the backend misbehaves, extra request headers.
const CASES: &[(&str, &str, Headers)] = &[
    // Istio's default policy: gRPC UNAVAILABLE and CANCELLED retried, a 503 not (no status
    // code listed), nor a reset after the request went out.
    ("istio-default", "503", &[]),
    ("istio-default", "grpc14", &[]),
    ("istio-default", "grpc1", &[]),
    ("istio-default", "grpc13", &[]),
    ("istio-default", "reset", &[]),
    ("no-retries", "grpc14", &[]),
    // VirtualService policies (previous_hosts on a one-host cluster: retried on that host).
    ("5xx", "503", &[]),
    ("5xx", "status500", &[]),
    ("5xx", "status409", &[]),
    ("5xx", "503x1", &[]),
    ("5xx", "reset", &[]),
    ("gateway-error", "status502", &[]),
    ("gateway-error", "status504", &[]),
    ("gateway-error", "status500", &[]),
    ("retriable-4xx", "status409", &[]),
    ("retriable-4xx", "status404", &[]),
    ("codes", "status418", &[]),
    ("codes", "503", &[]),
    ("reset", "reset", &[]),
    ("reset", "503", &[]),
    ("grpc", "grpc4", &[]),
    ("grpc", "grpc13", &[]),
    ("grpc", "grpc8", &[]),
    ("grpc", "grpc14", &[]),
    ("per-try", "slow-once", &[]),
    ("per-try", "slow", &[]),
    ("per-try-default", "slow", &[]),
    ("backoff", "503x2", &[]),
    // Request timeouts.
    ("timeout", "slow", &[]),
    ("timeout", "ok", &[]),
    // Fault injection.
    ("abort", "ok", &[]),
    ("abort", "ok", GRPC),
    ("abort-grpc", "ok", &[]),
    ("abort-grpc", "ok", GRPC),
    ("delay", "ok", &[]),
    ("delay-abort", "ok", &[]),
    ("delay-timeout", "ok", &[]),
    ("direct-abort", "ok", &[]),
    ("direct-delay", "ok", &[]),
    ("redirect-delay", "ok", &[]),
];

/// What one case came to in one world.
#[derive(Debug, PartialEq)]
struct Seen {
    outcome: Outcome,
    /// How many requests of the case's path the backend saw, asked afterwards.
    attempts: Option<String>,
}

fn run(
    world: &World,
    case: &str,
    how: &str,
    id: usize,
    extra: &[(&str, &str)],
) -> (Seen, Duration) {
    let path = format!("/flaky/{how}/{id}");
    let mut headers = vec![("x-case", case)];
    headers.extend_from_slice(extra);
    let started = Instant::now();
    let mut outcome = world.get(WEB, &path, &headers);
    let took = started.elapsed();
    // What is left of a deadline depends on timing: compared as present or not.
    if let Some(left) = outcome
        .upstream_headers
        .get_mut("x-envoy-expected-rq-timeout-ms")
    {
        *left = "(a deadline)".into();
    }
    let asked = world.get(WEB, &format!("/seen{path}"), &[]);
    let attempts = asked.response_headers.get(SEEN_HEADER).cloned();
    (Seen { outcome, attempts }, took)
}

/// `"GET /flaky/… HTTP/1.1" STATUS FLAGS` of each `/flaky/` request logged, once there are `n`.
fn flaky_lines(world: &World, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let lines: Vec<String> = world
            .access_lines()
            .into_iter()
            .filter(|l| l.starts_with("\"GET /flaky/"))
            .collect();
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn faults_retries_and_timeouts_have_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = worlds(&nets, &binary);
    let mut differences = Vec::new();
    for (id, (case, how, extra)) in CASES.iter().enumerate() {
        let (expected, e_took) = run(&envoy, case, how, id, extra);
        let (got, r_took) = run(&remora, case, how, id, extra);
        // What both must show, so that agreeing on nothing cannot pass.
        for (name, seen, took) in [("envoy", &expected, e_took), ("remora", &got, r_took)] {
            let o = &seen.outcome;
            let attempts = seen.attempts.as_deref();
            let ok = match (*case, *how) {
                ("istio-default", "503") => o.status == 503 && attempts == Some("1"),
                ("istio-default", "grpc14") | ("5xx", "503") => attempts == Some("3"),
                ("5xx", "503x1") => o.status == 200 && attempts == Some("2"),
                ("abort", _) => attempts == Some("0") && o.backend.is_none(),
                ("delay", _) => o.status == 200 && took >= Duration::from_millis(DELAY_MS - 5),
                ("delay-timeout", _) => o.status == 200,
                ("direct-abort", _) => o.status == 503 && attempts == Some("0"),
                ("direct-delay", _) => {
                    o.status == 200 && took >= Duration::from_millis(195) && o.backend.is_none()
                }
                ("redirect-delay", _) => o.status == 301 && took >= Duration::from_millis(195),
                ("timeout", "slow") => {
                    o.status == 504
                        && attempts == Some("1")
                        // Envoy's timer may fire a few microseconds early.
                        && took >= Duration::from_millis(TIMEOUT_MS - 5)
                        && took < SLOW
                }
                ("per-try", "slow-once") => o.status == 200 && attempts == Some("2"),
                ("per-try", "slow") => {
                    o.status == 504 && took >= Duration::from_millis(3 * PER_TRY_MS - 5)
                }
                _ => true,
            };
            if !ok {
                differences.push(format!(
                    "{name}: x-case {case} {how}: {seen:?} in {took:?} is not what the task says"
                ));
            }
        }
        if expected != got {
            differences.push(format!(
                "x-case {case} /flaky/{how} {extra:?}\n  envoy:  {expected:?}\n  remora: {got:?}"
            ));
        }
    }
    // A route with a fault on a listener whose chain has no fault filter: nothing injected.
    let unfiltered = |w: &World| w.get_at(8080, WEB, "/flaky/ok/unfiltered", &[]);
    let (e, r) = (unfiltered(&envoy), unfiltered(&remora));
    if e != r || e.status != 200 {
        differences.push(format!(
            "a fault without the fault filter\n  envoy:  {e:?}\n  remora: {r:?}"
        ));
    }
    let (e, r) = (
        flaky_lines(&envoy, CASES.len() + 1),
        flaky_lines(&remora, CASES.len() + 1),
    );
    if e.len() != r.len() {
        differences.push(format!("access-log lines: envoy {e:?}\nremora {r:?}"));
    }
    for (e, r) in e.iter().zip(&r) {
        if e != r {
            differences.push(format!("access log\n  envoy:  {e}\n  remora: {r}"));
        }
    }
    assert!(
        r.iter().any(|l| l.ends_with(" DI,FI")) && r.iter().any(|l| l.contains(" URX")),
        "remora's flags: {r:?}"
    );
    assert!(
        differences.is_empty(),
        "{} differences from Envoy:\n{}\n\n{}",
        differences.len(),
        differences.join("\n"),
        remora.proxy.diagnostics()
    );
}

/// Istio's fault fractions: half the requests aborted (MILLION denominator), a tenth delayed
/// (HUNDRED), in each proxy within the stated bounds.
#[test]
fn fault_fractions_have_envoys_proportions() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = worlds(&nets, &binary);
    for world in [&remora, &envoy] {
        let name = world.proxy.name();
        const ABORTS: usize = 200;
        let aborted = (0..ABORTS)
            .filter(|i| {
                let o = world.get(
                    WEB,
                    &format!("/flaky/ok/half-{i}"),
                    &[("x-case", "abort-half")],
                );
                assert!(
                    (o.status == 500 && o.backend.is_none())
                        || (o.status == 200 && o.backend.as_deref() == Some("a")),
                    "{name}: {o:?}"
                );
                o.status == 500
            })
            .count();
        // 100 expected, a standard deviation of about 7: over four of them either way.
        assert!(
            (70..=130).contains(&aborted),
            "{name}: {aborted} of {ABORTS} aborted"
        );
        const DELAYS: usize = 100;
        let delayed = (0..DELAYS)
            .filter(|i| {
                let started = Instant::now();
                let o = world.get(
                    WEB,
                    &format!("/flaky/ok/tenth-{i}"),
                    &[("x-case", "delay-tenth")],
                );
                assert_eq!(o.status, 200, "{name}: {o:?}");
                started.elapsed() >= Duration::from_millis(200)
            })
            .count();
        // 10 expected, a standard deviation of 3: about four of them either way.
        assert!(
            (2..=22).contains(&delayed),
            "{name}: {delayed} of {DELAYS} delayed"
        );
    }
}

/// The cluster statistics compared for the per-try timeouts and the closes: what an attempt
/// cut by its per-try timeout counts (and what it does not: `upstream_rq_timeout`), and how
/// each pooled connection ended.
const CLOSE_STATS: &[&str] = &[
    "upstream_rq_per_try_timeout",
    "upstream_rq_timeout",
    "upstream_rq_total",
    "upstream_rq_retry",
    "upstream_rq_completed",
    "upstream_rq_200",
    "upstream_rq_504",
    "upstream_rq_503",
    "upstream_rq_5xx",
    // A retried answer: counted in the `retry.*` copy only, not among the requests' answers.
    "retry.upstream_rq_completed",
    "retry.upstream_rq_503",
    "retry.upstream_rq_5xx",
    "upstream_cx_http1_total",
    // A request opening a connection waits for it as a pending one.
    "upstream_rq_pending_total",
    "upstream_cx_destroy",
    "upstream_cx_destroy_local",
    "upstream_cx_destroy_remote",
    "upstream_cx_destroy_with_active_rq",
    "upstream_cx_destroy_local_with_active_rq",
    "upstream_cx_destroy_remote_with_active_rq",
];

/// `x-case` (the route, and so its retry policy), how the backend misbehaves, and a delta
/// both proxies must show. The route table edits every request's headers, so each goes
/// through hyper's client here; Remora's own HTTP/1.1 exchange (routes that edit nothing)
/// counts its connections in `xds_hcm_stats`.
const CLOSE_CASES: &[(&str, &str, &str)] = &[
    // A per-try timeout, retried, then answered: the cut attempt's connection closed by the
    // proxy with the request on it.
    (
        "per-try",
        "slow-once",
        "upstream_cx_destroy_local_with_active_rq +1",
    ),
    // Every attempt cut: the router's 504, and no request timeout.
    ("per-try", "slow", "upstream_rq_per_try_timeout +3"),
    // The backend closes its kept-alive connection, idle.
    ("no-retries", "close", "upstream_cx_destroy_remote +1"),
    // Istio's default policy; the connection counted as HTTP/1.1.
    ("istio-default", "close", "upstream_cx_http1_total +1"),
    ("5xx", "close", "upstream_cx_destroy_remote +1"),
    // The backend resets the connection a request is on.
    (
        "no-retries",
        "reset",
        "upstream_cx_destroy_remote_with_active_rq +1",
    ),
    (
        "5xx",
        "reset",
        "upstream_cx_destroy_remote_with_active_rq +3",
    ),
    // A 503 retried: its connection let go with the answer's body unread, and its code
    // counted apart from the request's answer.
    (
        "5xx",
        "503x1",
        "upstream_cx_destroy_local_with_active_rq +1",
    ),
    ("5xx", "503x1", "retry.upstream_rq_503 +1"),
];

fn cluster_a(world: &World) -> Stats {
    world.cluster_stats(A, CLOSE_STATS)
}

/// What one case changed on cluster A, once the backend's closes have landed.
fn close_case(world: &World, case: &str, how: &str, id: usize) -> Vec<String> {
    let before = cluster_a(world);
    let o = world.get(
        WEB,
        &format!("/flaky/{how}/closes-{id}"),
        &[("x-case", case)],
    );
    assert!(o.status != 0, "{}: {o:?}", world.proxy.name());
    std::thread::sleep(CLOSE_AFTER * 4);
    let prefix = format!("cluster.{A}.");
    stat_deltas::delta(&before, &cluster_a(world))
        .into_iter()
        .map(|d| d.replacen(&prefix, "", 1))
        .collect()
}

#[test]
fn per_try_timeouts_and_connection_closes_count_as_envoys() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = worlds(&nets, &binary);
    let mut differences = Vec::new();
    for (id, (case, how, must)) in CLOSE_CASES.iter().enumerate() {
        let (expected, got) = (
            close_case(&envoy, case, how, id),
            close_case(&remora, case, how, id),
        );
        for (name, deltas) in [("envoy", &expected), ("remora", &got)] {
            if !deltas.iter().any(|d| d == must) {
                differences.push(format!(
                    "{name}: x-case {case} {how}: no {must} in {deltas:?}"
                ));
            }
        }
        if expected != got {
            differences.push(format!(
                "x-case {case} /flaky/{how}\n  envoy:  {expected:?}\n  remora: {got:?}"
            ));
        }
    }
    assert!(
        differences.is_empty(),
        "{} differences from Envoy:\n{}\n\n{}",
        differences.len(),
        differences.join("\n"),
        remora.proxy.diagnostics()
    );
}
