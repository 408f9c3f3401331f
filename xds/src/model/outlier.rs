//! A cluster's outlier detection (Envoy's `outlier_detection`, from a DestinationRule's
//! `outlierDetection`): the consecutive-failure detectors, how long an ejected host stays out,
//! and how many hosts may be out at once. Success-rate and failure-percentage detection are
//! accepted only where they can eject nothing (istiod writes `enforcing_success_rate: 0`).

use std::time::Duration;

/// Outlier detection of one cluster, with Envoy's defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutlierDetection {
    /// Consecutive 5xx (and, without the split, local-origin failures as 5xx) before an
    /// ejection, and the percentage of such detections that eject.
    pub consecutive_5xx: Consecutive,
    /// Consecutive 502, 503 and 504.
    pub consecutive_gateway_failure: Consecutive,
    /// Consecutive local-origin failures (connect failure, timeout, reset), counted apart
    /// only with `split_external_local_origin_errors`.
    pub consecutive_local_origin_failure: Consecutive,
    pub split_external_local_origin_errors: bool,
    /// How often ejected hosts are checked for their return (Envoy: 10 s).
    pub interval: Duration,
    /// Ejection time of a first ejection, multiplied by the ejections in a row (Envoy: 30 s).
    pub base_ejection_time: Duration,
    /// Cap on an ejection's time (Envoy: 300 s, or the base time when larger).
    pub max_ejection_time: Duration,
    /// Share of hosts that may be ejected at once, in percent (Envoy: 10).
    pub max_ejection_percent: u32,
    /// `always_eject_one_host`: the first ejection ignores `max_ejection_percent`.
    pub always_eject_one_host: bool,
}

/// One consecutive-failure detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Consecutive {
    /// Failures in a row that detect an outlier.
    pub threshold: u32,
    /// Percentage of detections that eject (0: detect and count only).
    pub enforcing: u32,
}

impl OutlierDetection {
    /// Envoy's defaults (an empty `outlier_detection`).
    pub const ENVOY_DEFAULT: OutlierDetection = OutlierDetection {
        consecutive_5xx: Consecutive {
            threshold: 5,
            enforcing: 100,
        },
        consecutive_gateway_failure: Consecutive {
            threshold: 5,
            enforcing: 0,
        },
        consecutive_local_origin_failure: Consecutive {
            threshold: 5,
            enforcing: 100,
        },
        split_external_local_origin_errors: false,
        interval: Duration::from_secs(10),
        base_ejection_time: Duration::from_secs(30),
        max_ejection_time: Duration::from_secs(300),
        max_ejection_percent: 10,
        always_eject_one_host: false,
    };
}
