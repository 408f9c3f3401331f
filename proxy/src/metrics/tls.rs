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

/// The TLS metrics.
#[derive(Debug, Clone, Default)]
pub struct TlsMetrics {
    /// Seconds until the workload certificate expires (negative once it has).
    pub cert_expiry_seconds: Gauge,
    pub days_until_first_cert_expiring: Gauge,
    /// Rotated certificates loaded.
    pub rotations: Counter,
    /// Changed certificate files that did not load.
    pub load_failures: Counter,
    handshakes: Family<Labels, Counter>,
    exchanges: Family<Labels, Counter>,
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
        m
    }

    /// Show `identity`'s expiry as of now.
    pub fn identity_loaded(&self, identity: &Identity) {
        let left = match identity.not_after().duration_since(SystemTime::now()) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
        };
        self.cert_expiry_seconds.set(left);
        self.days_until_first_cert_expiring
            .set(left.max(0) / 86_400);
    }

    /// One metadata exchange finished: `ok` (the peer's metadata learned), `no_metadata` (a
    /// header without it), `not_spoken` (no header), or why it failed.
    pub fn exchange(&self, dir: Direction, result: &'static str) {
        self.exchanges
            .get_or_create(&vec![("direction", dir.as_str()), ("result", result)])
            .inc();
    }

    /// One handshake finished: `ok`, or why not.
    pub fn handshake(&self, dir: Direction, result: &'static str) {
        self.handshakes
            .get_or_create(&vec![("direction", dir.as_str()), ("result", result)])
            .inc();
    }
}
