//! Outlier detection as Envoy's consecutive-failure detectors do it: each upstream answer or
//! failure is counted on its host ([`count`], then [`detect`]); the failure that brings a
//! counter to its threshold ejects the host at once (Envoy posts it to its main thread, and its
//! workers learn of it a moment later). An ejected host stays out for `base_ejection_time` times its
//! ejections in a row (capped by `max_ejection_time`) and comes back at the first `interval`
//! tick after that, as Envoy's interval timer brings it back. The ticks are not a task: each
//! is computed from the cluster state's start when a host is looked at.

use super::stats::{inc, ClusterStats};
use remora_xds::model::outlier::{Consecutive, OutlierDetection};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// What one attempt on a host came to, as Envoy's router and TCP proxy report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream answered with this status.
    Status(u16),
    /// The connection was opened (HTTP: the answer is reported after).
    Connected,
    /// The connection was opened and that is all a TCP proxy learns.
    ConnectedFinal,
    /// The connection could not be opened (refused, unreachable, handshake failed, timed out).
    ConnectFailed,
    /// The request went out and the connection or stream was reset before an answer.
    LocalFailure,
    /// No answer within the timeout.
    Timeout,
    /// No answer within the route's per-try timeout: the attempt is cut (and may be retried).
    PerTryTimeout,
}

/// The per-host state of one cluster: in flight, and outlier detection's counters.
#[derive(Debug)]
pub struct HostState {
    pub address: SocketAddr,
    /// Requests (HTTP) or connections (TCP) in flight: LEAST_REQUEST's load.
    pub rq_active: AtomicU32,
    /// Connection slots held (per-host `max_connections`).
    pub cx_active: AtomicU32,
    pub rq_total: AtomicU64,
    pub rq_error: AtomicU64,
    pub cx_connect_fail: AtomicU64,
    consecutive_5xx: AtomicU32,
    consecutive_gateway: AtomicU32,
    consecutive_local: AtomicU32,
    /// When the ejection ends, in ms of the cluster state's clock; 0: not ejected.
    ejected_until: AtomicU64,
    /// When it last came back (ms), for the multiplier's decay; 0: never ejected.
    unejected_at: AtomicU64,
    /// Envoy's ejection-time multiplier.
    backoff: AtomicU32,
    pub num_ejections: AtomicU32,
}

impl HostState {
    pub fn new(address: SocketAddr) -> Self {
        HostState {
            address,
            rq_active: AtomicU32::new(0),
            cx_active: AtomicU32::new(0),
            rq_total: AtomicU64::new(0),
            rq_error: AtomicU64::new(0),
            cx_connect_fail: AtomicU64::new(0),
            consecutive_5xx: AtomicU32::new(0),
            consecutive_gateway: AtomicU32::new(0),
            consecutive_local: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            unejected_at: AtomicU64::new(0),
            backoff: AtomicU32::new(0),
            num_ejections: AtomicU32::new(0),
        }
    }

    /// When its ejection ends (ms; 0: not ejected).
    pub fn ejection_end(&self) -> u64 {
        self.ejected_until.load(Ordering::Acquire)
    }

    /// Whether the host is out at `now` (ms). An ejection that is over is ended here, with
    /// the counters reset as Envoy resets them when a host comes back.
    pub fn ejected(&self, now: u64) -> bool {
        let until = self.ejected_until.load(Ordering::Acquire);
        if until == 0 {
            return false;
        }
        if now < until {
            return true;
        }
        if self
            .ejected_until
            .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.consecutive_5xx.store(0, Ordering::Relaxed);
            self.consecutive_gateway.store(0, Ordering::Relaxed);
            self.consecutive_local.store(0, Ordering::Relaxed);
            self.unejected_at.store(until, Ordering::Relaxed);
        }
        false
    }
}

/// Which detector fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detector {
    Consecutive5xx,
    GatewayFailure,
    LocalOrigin,
}

/// Count `outcome` on `host`; the detectors it brings to their threshold, in Envoy's order.
pub fn count(host: &HostState, od: &OutlierDetection, outcome: Outcome) -> [Option<Detector>; 2] {
    let bump = |c: &AtomicU32, threshold: u32| c.fetch_add(1, Ordering::Relaxed) + 1 == threshold;
    let reset = |c: &AtomicU32| c.store(0, Ordering::Relaxed);
    let http = |status: u16| -> [Option<Detector>; 2] {
        if !(500..600).contains(&status) {
            reset(&host.consecutive_5xx);
            reset(&host.consecutive_gateway);
            return [None, None];
        }
        let mut fired = [None, None];
        if matches!(status, 502..=504) {
            if bump(
                &host.consecutive_gateway,
                od.consecutive_gateway_failure.threshold,
            ) {
                fired[0] = Some(Detector::GatewayFailure);
            }
        } else {
            reset(&host.consecutive_gateway);
        }
        if bump(&host.consecutive_5xx, od.consecutive_5xx.threshold) {
            fired[1] = Some(Detector::Consecutive5xx);
        }
        fired
    };
    if od.split_external_local_origin_errors {
        match outcome {
            Outcome::Status(s) => http(s),
            Outcome::Connected | Outcome::ConnectedFinal => {
                reset(&host.consecutive_local);
                [None, None]
            }
            Outcome::ConnectFailed
            | Outcome::LocalFailure
            | Outcome::Timeout
            | Outcome::PerTryTimeout => {
                let t = od.consecutive_local_origin_failure.threshold;
                [
                    bump(&host.consecutive_local, t).then_some(Detector::LocalOrigin),
                    None,
                ]
            }
        }
    } else {
        // Without the split, Envoy maps what happened locally to the status it answers.
        match outcome {
            Outcome::Status(s) => http(s),
            Outcome::Connected => [None, None],
            Outcome::ConnectedFinal => http(200),
            Outcome::ConnectFailed | Outcome::LocalFailure => http(503),
            Outcome::Timeout | Outcome::PerTryTimeout => http(504),
        }
    }
}

/// The detector's configuration for `d`.
pub fn detector(od: &OutlierDetection, d: Detector) -> Consecutive {
    match d {
        Detector::Consecutive5xx => od.consecutive_5xx,
        Detector::GatewayFailure => od.consecutive_gateway_failure,
        Detector::LocalOrigin => od.consecutive_local_origin_failure,
    }
}

/// Count a detection, and eject `host` if Envoy would: the host is not already out, the
/// ejected share stays within `max_ejection_percent` (or it is the first and
/// `always_eject_one_host`), and the `enforcing` draw says so. `ejected_now` is how many hosts
/// of the cluster are out, `hosts` how many it has; `roll` a number in 0..100.
#[allow(clippy::too_many_arguments)] // each is one fact Envoy's decision reads
pub fn detect(
    host: &HostState,
    od: &OutlierDetection,
    d: Detector,
    stats: &ClusterStats,
    now: u64,
    ejected_now: usize,
    hosts: usize,
    roll: u32,
) -> bool {
    if host.ejected(now) {
        return false;
    }
    let o = &stats.outlier;
    let (detected, enforced) = match d {
        Detector::Consecutive5xx => (
            &o.ejections_detected_consecutive_5xx,
            &o.ejections_enforced_consecutive_5xx,
        ),
        Detector::GatewayFailure => (
            &o.ejections_detected_consecutive_gateway_failure,
            &o.ejections_enforced_consecutive_gateway_failure,
        ),
        Detector::LocalOrigin => (
            &o.ejections_detected_consecutive_local_origin_failure,
            &o.ejections_enforced_consecutive_local_origin_failure,
        ),
    };
    inc(detected);
    // The detector's counter starts again whether or not the host goes out.
    let counter = match d {
        Detector::Consecutive5xx => {
            inc(&o.ejections_consecutive_5xx);
            &host.consecutive_5xx
        }
        Detector::GatewayFailure => &host.consecutive_gateway,
        Detector::LocalOrigin => &host.consecutive_local,
    };
    counter.store(0, Ordering::Relaxed);
    let share = 100.0 * (ejected_now + 1) as f64 / hosts.max(1) as f64;
    let allowed = share <= f64::from(od.max_ejection_percent.min(100))
        || (od.always_eject_one_host && ejected_now == 0);
    if !allowed {
        inc(&o.ejections_overflow);
        return false;
    }
    if d == Detector::Consecutive5xx {
        inc(&o.ejections_total);
    }
    if roll >= detector(od, d).enforcing {
        return false;
    }
    inc(&o.ejections_enforced_total);
    inc(enforced);
    eject(host, od, now);
    true
}

/// Take the host out from `now` (ms) for its multiplier's time, to the next interval tick.
fn eject(host: &HostState, od: &OutlierDetection, now: u64) {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let (interval, base, max) = (
        ms(od.interval).max(1),
        ms(od.base_ejection_time),
        ms(od.max_ejection_time),
    );
    // The multiplier falls by one per interval tick the host spent back in service.
    let back = host.unejected_at.load(Ordering::Relaxed);
    let mut backoff = host.backoff.load(Ordering::Relaxed);
    if back != 0 {
        let ticks = u32::try_from(now.saturating_sub(back) / interval).unwrap_or(u32::MAX);
        backoff = backoff.saturating_sub(ticks);
    }
    if u64::from(backoff).saturating_mul(base) < max.saturating_add(base) {
        backoff += 1;
    }
    host.backoff.store(backoff, Ordering::Relaxed);
    host.num_ejections.fetch_add(1, Ordering::Relaxed);
    let time = u64::from(backoff).saturating_mul(base).min(max);
    // Envoy's timer brings hosts back on its ticks, counted from the detector's start.
    let end = now.saturating_add(time);
    let tick = end.div_ceil(interval).saturating_mul(interval).max(1);
    host.ejected_until.store(tick, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn od(consecutive_5xx: u32) -> OutlierDetection {
        OutlierDetection {
            consecutive_5xx: Consecutive {
                threshold: consecutive_5xx,
                enforcing: 100,
            },
            interval: Duration::from_secs(1),
            base_ejection_time: Duration::from_secs(3),
            max_ejection_time: Duration::from_secs(7),
            max_ejection_percent: 100,
            ..OutlierDetection::ENVOY_DEFAULT
        }
    }

    fn fire(
        h: &HostState,
        od: &OutlierDetection,
        s: &ClusterStats,
        out: Outcome,
        now: u64,
    ) -> bool {
        count(h, od, out)
            .into_iter()
            .flatten()
            .any(|d| detect(h, od, d, s, now, 0, 2, 0))
    }

    #[test]
    fn the_failure_that_reaches_the_threshold_ejects_and_time_grows() {
        let od = od(3);
        let s = ClusterStats::new("c");
        let h = HostState::new("10.0.0.1:80".parse().expect("addr"));
        assert!(!fire(&h, &od, &s, Outcome::Status(500), 100));
        assert!(!fire(&h, &od, &s, Outcome::Status(503), 200));
        // A success starts the count again.
        assert!(!fire(&h, &od, &s, Outcome::Status(200), 300));
        assert!(!fire(&h, &od, &s, Outcome::Status(500), 400));
        assert!(!fire(&h, &od, &s, Outcome::LocalFailure, 500));
        assert!(fire(&h, &od, &s, Outcome::Timeout, 600));
        assert!(h.ejected(601));
        // 3 s from 600 ms is 3.6 s, back at the 4 s tick.
        assert!(h.ejected(3999));
        assert!(!h.ejected(4000));
        assert_eq!(
            s.outlier
                .ejections_enforced_consecutive_5xx
                .load(Ordering::Relaxed),
            1
        );
        // Straight back out: twice the base time (6 s), from 4.5 s to the 11 s tick.
        for t in [4500, 4501] {
            assert!(!fire(&h, &od, &s, Outcome::Status(500), t));
        }
        assert!(fire(&h, &od, &s, Outcome::Status(500), 4502));
        assert!(h.ejected(10_999));
        assert!(!h.ejected(11_000));
        // Capped by max_ejection_time (7 s) on the third.
        for t in [11_001, 11_002] {
            fire(&h, &od, &s, Outcome::Status(500), t);
        }
        assert!(fire(&h, &od, &s, Outcome::Status(500), 11_003));
        // 7 s from 11.003 s: back at the 19 s tick.
        assert!(h.ejected(18_999));
        assert!(!h.ejected(19_000));
        assert_eq!(h.num_ejections.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn split_counts_local_failures_apart_and_percent_caps_ejections() {
        let mut od = od(2);
        od.split_external_local_origin_errors = true;
        od.consecutive_local_origin_failure.threshold = 2;
        let s = ClusterStats::new("c");
        let h = HostState::new("10.0.0.1:80".parse().expect("addr"));
        assert_eq!(count(&h, &od, Outcome::LocalFailure), [None, None]);
        assert_eq!(count(&h, &od, Outcome::Status(500)), [None, None]);
        assert_eq!(
            count(&h, &od, Outcome::LocalFailure),
            [Some(Detector::LocalOrigin), None]
        );
        // With one of two hosts out already, 100 % allows it; 50 % does not.
        od.max_ejection_percent = 50;
        assert!(!detect(&h, &od, Detector::LocalOrigin, &s, 10, 1, 2, 0));
        assert_eq!(s.outlier.ejections_overflow.load(Ordering::Relaxed), 1);
        // Detected but not enforced at 0 %.
        od.consecutive_local_origin_failure.enforcing = 0;
        assert!(!detect(&h, &od, Detector::LocalOrigin, &s, 10, 0, 2, 0));
        assert_eq!(
            s.outlier
                .ejections_detected_consecutive_local_origin_failure
                .load(Ordering::Relaxed),
            2
        );
        // Gateway failures: only 502, 503 and 504 (enforced here).
        od.consecutive_gateway_failure = Consecutive {
            threshold: 2,
            enforcing: 100,
        };
        let h = HostState::new("10.0.0.2:80".parse().expect("addr"));
        assert_eq!(count(&h, &od, Outcome::Status(502)), [None, None]);
        assert_eq!(
            count(&h, &od, Outcome::Status(500)),
            [None, Some(Detector::Consecutive5xx)]
        );
        assert_eq!(count(&h, &od, Outcome::Status(504)), [None, None]);
        assert_eq!(
            count(&h, &od, Outcome::Status(503)),
            [Some(Detector::GatewayFailure), None]
        );
    }
}
