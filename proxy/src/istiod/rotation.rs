//! Keeping the workload certificate from istiod's CA current: one certificate at start, a new
//! one (new key, new CSR) after `SECRET_GRACE_PERIOD_RATIO` of its lifetime, and on failure
//! retries with exponential back-off and jitter while the certificate held keeps serving.
//! A new certificate is swapped into the [`Store`] whole, so new handshakes use it at once and
//! open connections keep theirs.

use super::ca::{identity_from_response, CaError, Issuer, KeyAndCsr};
use crate::identity::{SpiffeId, Store};
use crate::metrics::TlsMetrics;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The first retry's delay; each failure doubles it, up to [`BACKOFF_MAX`].
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// The longest wait between two attempts: a certificate near expiry must not wait longer.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// How often the expiry gauge is brought up to date between renewals.
const EXPIRY_REFRESH: Duration = Duration::from_secs(1);
/// Renewal is spread over this share of the lifetime around the grace point (Istio's
/// `SECRET_GRACE_PERIOD_RATIO_JITTER`), so pods started together do not renew together.
const RENEW_JITTER_RATIO: f64 = 0.01;

/// What the rotation loop needs.
pub struct Rotation<I> {
    pub issuer: I,
    pub spiffe_id: SpiffeId,
    pub ttl: Duration,
    pub grace_period_ratio: f64,
    /// Roots for a response that carries only a leaf: the mesh root file.
    pub fallback_roots: Vec<u8>,
    pub store: Arc<Store>,
    pub metrics: TlsMetrics,
    /// Told once the first certificate is held (readiness).
    pub on_first: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl<I: Issuer> Rotation<I> {
    /// Fetch, install, wait, forever.
    pub async fn run(mut self) {
        let mut backoff = Backoff::default();
        loop {
            match self.renew().await {
                Ok(renew_in) => {
                    backoff = Backoff::default();
                    tracing::debug!(?renew_in, "next workload certificate renewal");
                    self.wait(renew_in).await;
                }
                Err(e) => {
                    let wait = backoff.next_delay();
                    let held = self.store.current();
                    tracing::warn!(
                        error = %e,
                        retry_in = ?wait,
                        serving = held.as_ref().map(|i| i.spiffe_id.to_string()),
                        "no certificate from the CA; retrying"
                    );
                    self.metrics.ca_failure(e.reason());
                    self.wait(wait).await;
                }
            }
        }
    }

    /// Sleep `duration`, keeping `istio_agent_cert_expiry_seconds` moving with the clock as
    /// the file watcher does, since an operator alerts on it while renewals fail.
    async fn wait(&self, duration: Duration) {
        let until = tokio::time::Instant::now() + duration;
        let mut refresh = tokio::time::interval(EXPIRY_REFRESH);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => return,
                _ = refresh.tick() => {
                    if let Some(identity) = self.store.current() {
                        self.metrics.identity_loaded(&identity);
                    }
                }
            }
        }
    }

    /// One request: a new key, a CSR, the CA's answer checked and installed. Returns how long
    /// until the next renewal.
    pub async fn renew(&mut self) -> Result<Duration, CaError> {
        let material = KeyAndCsr::generate(self.spiffe_id.as_str())?;
        self.metrics.ca_request();
        let chain = self.issuer.issue(material.csr_pem, self.ttl).await?;
        let identity = identity_from_response(
            &chain,
            &material.key_pem,
            &self.spiffe_id,
            &self.fallback_roots,
            self.issuer.address(),
        )?;
        let renewal = self.store.is_loaded();
        tracing::info!(
            spiffe_id = %identity.spiffe_id,
            serial = identity.chain.first().map_or("", |c| c.serial.as_str()),
            expires = %humantime::format_rfc3339_seconds(identity.not_after()),
            renewal,
            "workload certificate from the CA installed"
        );
        let renew_in = renew_delay(
            identity.not_before(),
            identity.not_after(),
            SystemTime::now(),
            jittered(self.grace_period_ratio),
        );
        self.metrics.identity_loaded(&identity);
        if renewal {
            self.metrics.rotations.inc();
        }
        self.store.set(Arc::new(identity));
        if let Some(tell) = self.on_first.take() {
            tell();
        }
        Ok(renew_in)
    }
}

/// How long from `now` until `ratio` of the certificate's lifetime has passed; zero when that
/// is already behind us (a clock skewed against istiod's).
pub fn renew_delay(
    not_before: SystemTime,
    not_after: SystemTime,
    now: SystemTime,
    ratio: f64,
) -> Duration {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    let at = not_before + lifetime.mul_f64(ratio.clamp(0.0, 1.0));
    at.duration_since(now).unwrap_or_default()
}

fn jittered(ratio: f64) -> f64 {
    let spread = RENEW_JITTER_RATIO * (fastrand::f64() * 2.0 - 1.0);
    (ratio + spread).clamp(0.0, 1.0)
}

/// Exponential back-off with jitter: each delay is drawn between half and all of the current
/// step, so many sidecars failing together (istiod restarting) do not retry together.
#[derive(Debug, Clone)]
pub struct Backoff {
    step: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            step: BACKOFF_INITIAL,
        }
    }
}

impl Backoff {
    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(BACKOFF_MAX);
        step.mul_f64(0.5 + fastrand::f64() * 0.5)
    }
}

#[cfg(test)]
#[path = "rotation_tests.rs"]
mod tests;
