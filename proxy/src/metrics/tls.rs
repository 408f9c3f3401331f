//! Mesh TLS: the workload certificate's expiry (Envoy's `server.days_until_first_cert_expiring`
//! and Istio agent's `cert_expiry_seconds`), rotations, and handshakes and metadata exchanges by
//! outcome.

use crate::identity::Identity;
use crate::Direction;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::time::SystemTime;

type Labels = Vec<(&'static str, &'static str)>;

/// Envoy's `days_until_first_cert_expiring` while it holds no certificate (UINT32_MAX).
const NO_CERTIFICATE_DAYS: i64 = u32::MAX as i64;

/// The TLS metrics.
#[derive(Debug, Clone)]
pub struct TlsMetrics {
    /// Seconds until the workload certificate expires (negative once it has), by Istio's
    /// `resource_name` (`default`: the workload certificate); no series before one is loaded,
    /// as Istio's agent exports it only for a certificate it holds.
    cert_expiry_seconds: Family<Labels, Gauge>,
    pub days_until_first_cert_expiring: Gauge,
    /// Rotated certificates loaded.
    pub rotations: Counter,
    /// Changed certificate files that did not load.
    pub load_failures: Counter,
    handshakes: Family<Labels, Counter>,
    exchanges: Family<Labels, Counter>,
    /// CSRs sent to istiod's CA (pilot-agent's `num_outgoing_requests{request_type="csr"}`).
    ca_requests: Family<Labels, Counter>,
    /// CA requests that installed nothing, by pilot-agent's name, and by reason in Remora's.
    ca_failed_requests: Family<Labels, Counter>,
    ca_failures: Family<Labels, Counter>,
}

impl Default for TlsMetrics {
    fn default() -> Self {
        let days = Gauge::default();
        days.set(NO_CERTIFICATE_DAYS);
        TlsMetrics {
            cert_expiry_seconds: Family::default(),
            days_until_first_cert_expiring: days,
            rotations: Counter::default(),
            load_failures: Counter::default(),
            handshakes: Family::default(),
            exchanges: Family::default(),
            ca_requests: Family::default(),
            ca_failed_requests: Family::default(),
            ca_failures: Family::default(),
        }
    }
}

impl TlsMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = TlsMetrics::default();
        registry.register(
            "istio_agent_cert_expiry_seconds",
            "Seconds until the workload certificate expires",
            m.cert_expiry_seconds.clone(),
        );
        registry.register(
            "envoy_server_days_until_first_cert_expiring",
            "Days until the first certificate expires",
            m.days_until_first_cert_expiring.clone(),
        );
        registry.register(
            "remora_tls_certificate_rotations",
            "Rotated workload certificates loaded",
            m.rotations.clone(),
        );
        registry.register(
            "remora_tls_certificate_load_failures",
            "Changed certificate files that could not be loaded (the running certificate stayed)",
            m.load_failures.clone(),
        );
        registry.register(
            "remora_tls_handshakes",
            "Mesh TLS handshakes by direction and result",
            m.handshakes.clone(),
        );
        registry.register(
            "remora_metadata_exchanges",
            "Istio metadata exchanges on istio-peer-exchange connections, by direction and result",
            m.exchanges.clone(),
        );
        registry.register(
            "istio_agent_num_outgoing_requests",
            "Requests sent to istiod's CA, by request type",
            m.ca_requests.clone(),
        );
        registry.register(
            "istio_agent_num_failed_outgoing_requests",
            "Requests to istiod's CA that failed, by request type",
            m.ca_failed_requests.clone(),
        );
        registry.register(
            "remora_istiod_certificate_failures",
            "Certificate requests to istiod's CA that installed nothing, by reason (token, root, \
             unavailable, unauthenticated, ca_error, mismatch, csr); the held certificate stayed",
            m.ca_failures.clone(),
        );
        m
    }

    /// A CSR was sent to the CA.
    pub fn ca_request(&self) {
        self.ca_requests
            .get_or_create(&vec![("request_type", "csr")])
            .inc();
    }

    /// A certificate request installed nothing, for `reason`.
    pub fn ca_failure(&self, reason: &'static str) {
        self.ca_failed_requests
            .get_or_create(&vec![("request_type", "csr")])
            .inc();
        self.ca_failures
            .get_or_create(&vec![("reason", reason)])
            .inc();
    }

    /// Failed certificate requests for `reason`.
    pub fn ca_failures(&self, reason: &'static str) -> u64 {
        self.ca_failures
            .get(&vec![("reason", reason)])
            .map_or(0, |c| c.get())
    }

    /// Show `identity`'s expiry as of now.
    pub fn identity_loaded(&self, identity: &Identity) {
        let left = match identity.not_after().duration_since(SystemTime::now()) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
        };
        self.cert_expiry_seconds
            .get_or_create(&vec![("resource_name", "default")])
            .set(left);
        self.days_until_first_cert_expiring
            .set(left.max(0) / 86_400);
    }

    /// Seconds until the workload certificate expires, once one is loaded.
    pub fn cert_expiry_seconds(&self) -> Option<i64> {
        self.cert_expiry_seconds
            .get(&vec![("resource_name", "default")])
            .map(|g| g.get())
    }

    /// One metadata exchange finished: `ok` (the peer's metadata learned), `no_metadata` (a
    /// header without it), `not_spoken` (no header), or why it failed.
    pub fn exchange(&self, dir: Direction, result: &'static str) {
        self.exchanges
            .get_or_create(&vec![("direction", dir.as_str()), ("result", result)])
            .inc();
    }

    /// Handshakes in direction `dir` that ended with `result`.
    pub fn handshakes(&self, dir: Direction, result: &'static str) -> u64 {
        self.handshakes
            .get(&vec![("direction", dir.as_str()), ("result", result)])
            .map_or(0, |c| c.get())
    }

    /// One handshake finished: `ok`, or why not.
    pub fn handshake(&self, dir: Direction, result: &'static str) {
        self.handshakes
            .get_or_create(&vec![("direction", dir.as_str()), ("result", result)])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_certificate_expiry_reads_as_envoy_and_istios_agent_show_it() {
        let mut registry = Registry::default();
        let m = TlsMetrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("envoy_server_days_until_first_cert_expiring 4294967295"),
            "{text}"
        );
        assert!(!text.contains("istio_agent_cert_expiry_seconds{"), "{text}");
        assert_eq!(m.cert_expiry_seconds(), None);
    }
}
