//! Conditions readiness waits for beyond "listeners bound": each is named when required and
//! cleared when met. istiod mode requires `workload certificate` until the CA has issued one;
//! the xDS client adds its own (first clusters and listeners applied) the same way. 15021
//! answers 503 naming what is still pending, as pilot-agent's check waits on Envoy's.

use std::sync::Mutex;

/// The workload certificate from istiod's CA.
pub const CERTIFICATE: &str = "workload certificate";

/// The pending conditions; few and set at start, so a mutex read per probe is nothing.
#[derive(Debug, Default)]
pub struct Readiness {
    pending: Mutex<Vec<&'static str>>,
}

impl Readiness {
    /// Readiness now also waits for `condition`.
    pub fn require(&self, condition: &'static str) {
        let mut pending = self.lock();
        if !pending.contains(&condition) {
            pending.push(condition);
        }
    }

    /// `condition` is met (for good: a later loss is not readiness' business, as in Envoy).
    pub fn satisfy(&self, condition: &'static str) {
        self.lock().retain(|c| *c != condition);
    }

    /// What is still awaited, in the order required; empty when ready.
    pub fn pending(&self) -> Vec<&'static str> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<&'static str>> {
        // A panic while holding this lock leaves a plain Vec behind, still consistent.
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_are_required_then_satisfied() {
        let r = Readiness::default();
        assert!(r.pending().is_empty());
        r.require(CERTIFICATE);
        r.require("xds");
        r.require(CERTIFICATE);
        assert_eq!(r.pending(), vec![CERTIFICATE, "xds"]);
        r.satisfy(CERTIFICATE);
        assert_eq!(r.pending(), vec!["xds"]);
        r.satisfy("xds");
        assert!(r.pending().is_empty());
    }
}
