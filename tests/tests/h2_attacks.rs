//! HTTP/2 attacks with real attack clients (tests/peers/h2_attack.py, frames from Python's
//! `hyperframe` and header blocks from `hpack`) against inbound and outbound HTTP/2 connections
//! through the sidecar, while a well-behaved client (the `h2` crate) measures latency on its own
//! connection alongside. The origin is an `h2` server that counts what reaches it and which of
//! its streams the proxy cancelled. docs/hardening.md says which setting guards each attack.

#[path = "h2_attacks/resets.rs"]
mod resets;
#[path = "h2_attacks/support.rs"]
mod support;

use remora_e2e::peer::any_addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use support::*;

/// Rapid Reset twice: streams reset in the same write as their HEADERS (h2's pending-accept
/// guard sends GOAWAY(ENHANCE_YOUR_CALM) after 20), then each reset 2 ms after its HEADERS,
/// when the request is already on its way upstream (the proxy's premature-reset guard closes
/// the connection after 250: docs/hardening.md).
#[test]
fn rapid_reset_is_stopped_each_reset_cancels_its_upstream_request_and_good_traffic_flows() {
    let _serial = lock();
    let Some(net) = setup() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    for leg in &legs(&net) {
        let burst = attack(leg, "rapid-reset", &[]);
        let [burst] = &burst[..] else {
            panic!("one connection")
        };
        assert_eq!(burst.goaway_code(), Some(ENHANCE_YOUR_CALM), "{burst}");
        assert!(
            burst.last_stream_id().is_some_and(|id| id <= 2 * 50 + 1),
            "{}: more than 50 streams before GOAWAY: {burst}",
            leg.name
        );

        let reports = attack_measured(
            leg,
            &remora,
            "rapid-reset",
            &["--repeat", "--spacing", "0.002"],
        );
        assert!(
            reports.len() >= 2,
            "{}: the proxy never closed the attacker",
            leg.name
        );
        for (i, r) in reports.iter().enumerate() {
            // The last may have been cut short by the attacker's own time bound.
            let last = i + 1 == reports.len();
            assert!(
                r.stopped() || last,
                "{}: the proxy never stopped {r}",
                leg.name
            );
            // 250 premature resets, and what was on the wire when the proxy closed.
            assert!(
                r.units() <= 300,
                "{}: too many resets before the close: {r}",
                leg.name
            );
        }
        // Every request the proxy sent upstream for a reset stream was cancelled there.
        assert!(leg.seen.requests.load(Ordering::SeqCst) > 0);
        wait_all_cancelled(leg, &remora);
    }
    let m = remora.metrics();
    for direction in ["outbound", "inbound"] {
        let closes = m.value(
            "remora_http2_premature_reset_closes_total",
            &[("direction", direction)],
        );
        assert!(closes >= 2.0, "{direction}: {closes}\n{m}");
    }
}

/// MadeYouReset: the client never resets a stream itself, it makes the server do so (a zero
/// WINDOW_UPDATE, DATA after END_STREAM), which h2 counts against
/// `max_local_error_reset_streams` before sending GOAWAY(ENHANCE_YOUR_CALM).
#[test]
fn made_you_reset_ends_in_enhance_your_calm_and_cancels_the_upstream_work() {
    let _serial = lock();
    let Some(net) = setup() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    for leg in &legs(&net) {
        // A zero WINDOW_UPDATE, or DATA after END_STREAM: h2 ends the connection at the first.
        for variant in ["window", "data"] {
            let [r] = &attack(
                leg,
                "made-you-reset",
                &["--spacing", "0.002", "--variant", variant],
            )[..] else {
                panic!("one connection")
            };
            assert_eq!(
                r.goaway_code(),
                Some(PROTOCOL_ERROR),
                "{} {variant}: {r}",
                leg.name
            );
            assert!(r.last_stream_id() <= Some(1), "{} {variant}: {r}", leg.name);
        }
        // Stream errors h2 resets the stream for (window overflow, body over content-length),
        // looped: GOAWAY(ENHANCE_YOUR_CALM) after 100 (`max_local_error_reset_streams`).
        let reports = attack_measured(
            leg,
            &remora,
            "made-you-reset",
            &["--repeat", "--spacing", "0.002", "--variant", "both"],
        );
        assert!(
            reports.len() >= 2,
            "{}: the proxy never stopped the attacker",
            leg.name
        );
        for (i, r) in reports.iter().enumerate() {
            if i + 1 == reports.len() && !r.stopped() {
                continue;
            }
            assert_eq!(
                r.goaway_code(),
                Some(ENHANCE_YOUR_CALM),
                "{}: {r}",
                leg.name
            );
            // 100, and what was on the wire when the GOAWAY came.
            assert!(
                r.units() <= 150,
                "{}: too many streams before GOAWAY: {r}",
                leg.name
            );
        }
        assert!(leg.seen.requests.load(Ordering::SeqCst) > 0);
        wait_all_cancelled(leg, &remora);
        // A request malformed by a connection-specific header, looped on one connection:
        // h2 resets each stream before a request exists (where Envoy closes the connection at
        // the first, `xds_h2_malformed`), and counts those resets with the others, so the
        // connection still ends in GOAWAY(ENHANCE_YOUR_CALM); nothing reaches the origin.
        let before = leg.seen.requests.load(Ordering::SeqCst);
        let [r] = &attack(leg, "made-you-reset", &["--variant", "header"])[..] else {
            panic!("one connection")
        };
        assert_eq!(
            r.goaway_code(),
            Some(ENHANCE_YOUR_CALM),
            "{} header: {r}",
            leg.name
        );
        // Reset streams are what ended it, at the server's count, whatever the client had on
        // the wire (it writes 20 at a time). How many of those resets went out before the
        // GOAWAY depends on how many requests one read brought: h2 drops the resets it had not
        // written yet when it goes away (a loaded machine saw none), so only the bound holds.
        assert_eq!(
            r.goaway_debug(),
            Some("too_many_internal_resets"),
            "{} header: {r}",
            leg.name
        );
        assert!(
            r.resets_received() <= 100,
            "{}: malformed requests reset before GOAWAY: {r}",
            leg.name
        );
        assert_eq!(
            leg.seen.requests.load(Ordering::SeqCst),
            before,
            "{}: a malformed request reached the origin",
            leg.name
        );
    }
}

/// Header blocks that never end, or that expand far past the limit through HPACK's dynamic
/// table: the connection is closed after a bounded number of bytes, and nothing reaches the
/// origin.
#[test]
fn continuation_floods_and_hpack_bombs_are_closed_after_bounded_bytes_and_never_forwarded() {
    let _serial = lock();
    let Some(net) = setup() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    for leg in &legs(&net) {
        for name in ["continuation", "hpack-bomb"] {
            let reports = attack_measured(leg, &remora, name, &[]);
            for r in &reports {
                assert!(r.stopped(), "{} {name}: never stopped: {r}", leg.name);
                assert!(r.bytes_sent() <= 1 << 20, "{} {name}: {r}", leg.name);
            }
        }
        assert_eq!(leg.seen.requests.load(Ordering::SeqCst), 0, "{}", leg.name);
    }
}

/// Cookie crumbs count against the header limits as Envoy counts them since CVE-2026-47774:
/// each crumb is a header for `http.max_headers`, and the crumbs' bytes count for
/// `http.max_header_bytes`; over either, the request never reaches the origin.
#[test]
fn cookie_crumbs_over_the_header_limits_never_reach_the_origin() {
    let _serial = lock();
    let Some(net) = setup() else {
        return;
    };
    net.capture_default();
    let _remora = net.remora().start_ready();
    for leg in &legs(&net) {
        // Under the limits: the 50 requests reach the origin, crumbs and all.
        let [ok] = &attack(leg, "cookie-crumbs", &["--crumbs", "20", "--size", "50"])[..] else {
            panic!("one connection")
        };
        assert_eq!(
            leg.seen.smuggled.load(Ordering::SeqCst),
            50,
            "{}: {ok}",
            leg.name
        );
        assert_eq!(
            leg.seen.cookie_fields.load(Ordering::SeqCst),
            20,
            "{}",
            leg.name
        );
        let over: [(&str, &[&str]); 3] = [
            // 150 crumbs of 10 bytes: small, but 150 headers (`http.max_headers` 100).
            ("150 crumbs", &["--crumbs", "150", "--size", "10"]),
            // 100 different crumbs of 700 bytes: 70 KiB of cookie (`http.max_header_bytes` 60).
            ("70 KiB of crumbs", &["--crumbs", "100", "--size", "700"]),
            // 90 identical crumbs of 4000 bytes: 360 KiB joined from 4 KiB on the wire.
            (
                "HPACK-amplified crumbs",
                &["--crumbs", "90", "--size", "4000", "--same"],
            ),
        ];
        for (what, args) in over {
            let reports = attack(leg, "cookie-crumbs", args);
            for r in &reports {
                // Each request answered 431, or the connection ended for it.
                assert!(
                    r.status_count("431") == r.units() || r.stopped(),
                    "{} {what}: {r}",
                    leg.name
                );
            }
            assert_eq!(
                leg.seen.smuggled.load(Ordering::SeqCst),
                50,
                "{} {what}: an over-limit cookie reached the origin",
                leg.name
            );
        }
    }
}

/// Floods of frames that cost the sender little: empty DATA frames end in
/// GOAWAY(ENHANCE_YOUR_CALM) (h2's data-frame budget). PINGs and SETTINGS each need an ACK: h2
/// holds one at a time and reads no further until it is written, so a flooder that does not
/// read is held back by TCP after bounded bytes, and one that reads pays more CPU than the
/// proxy does answering it. Either way the good client is served within its bound.
#[test]
fn empty_data_ping_and_settings_floods_are_closed_or_held_back_with_cpu_bounded() {
    let _serial = lock();
    let Some(net) = setup() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    for leg in &legs(&net) {
        let [r] = &attack_measured(leg, &remora, "empty-data", &[])[..] else {
            panic!("one connection")
        };
        assert_eq!(
            r.goaway_code(),
            Some(ENHANCE_YOUR_CALM),
            "{}: {r}",
            leg.name
        );
        assert!(r.bytes_sent() <= 1 << 20, "{}: {r}", leg.name);
        for name in ["ping", "settings"] {
            attack_measured(leg, &remora, name, &[]);
            // Alone, the proxy's CPU is the flood's: at most one core (a connection is one
            // task), and no more than twice what the attacker spends (this is a debug build).
            let cpu_before = cpu_time(&remora);
            let started = Instant::now();
            let [r] = &attack(leg, name, &[])[..] else {
                panic!("one connection")
            };
            let (cpu, wall) = (cpu_time(&remora) - cpu_before, started.elapsed());
            eprintln!("{} {name} alone: proxy CPU {cpu:?} in {wall:?}", leg.name);
            assert!(
                cpu <= wall && cpu <= r.cpu() * 2,
                "{} {name}: the proxy spent {cpu:?} in {wall:?} answering, the attacker {:?}: {r}",
                leg.name,
                r.cpu()
            );
            let [r] = &attack(leg, name, &["--no-read"])[..] else {
                panic!("one connection")
            };
            assert!(r.blocked(), "{} {name}: never held back: {r}", leg.name);
            assert!(r.bytes_sent() <= 32 << 20, "{} {name}: {r}", leg.name);
        }
    }
}

/// A stream the client resets, and a client connection that dies, each while its response
/// streams from the origin: the proxy resets the upstream stream with CANCEL on the upstream
/// connection it shares, and the other stream on that connection goes on (both directions).
#[test]
fn a_reset_stream_or_a_dead_client_connection_cancels_its_upstream_stream_only() {
    let _serial = lock();
    let Some(net) = setup() else {
        return;
    };
    net.capture_default();
    let _remora = net.remora().start_ready();
    let outbound = Arc::new(resets::Streams::default());
    let inbound = Arc::new(resets::Streams::default());
    let out_listener = net
        .peer
        .bind(net.peer_addr(ORIGIN_PORT))
        .expect("bind the outbound origin");
    let in_listener = net
        .pod
        .bind(any_addr(ORIGIN_PORT))
        .expect("bind the inbound origin");
    for (streams, listener) in [(&outbound, out_listener), (&inbound, in_listener)] {
        let streams = Arc::clone(streams);
        std::thread::spawn(move || runtime().block_on(resets::streaming_origin(listener, streams)));
    }
    runtime().block_on(async {
        let to_peer = net.peer_addr(ORIGIN_PORT);
        resets::resets_reach_the_upstream("outbound", &net.pod, to_peer, &outbound).await;
        let to_pod = net.pod_addr(ORIGIN_PORT);
        resets::resets_reach_the_upstream("inbound", &net.peer, to_pod, &inbound).await;
    });
}
