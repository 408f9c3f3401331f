use super::*;
use crate::istiod::test_ca::{Signing, TestCa};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use tokio::time::Instant;

const ID: &str = "spiffe://cluster.local/ns/default/sa/sleep";

/// Signs with a [`TestCa`] after failing the first `fail_first` calls; records when it was
/// called on tokio's clock.
#[derive(Clone)]
struct FakeCa {
    ca: Arc<TestCa>,
    calls: Arc<Mutex<Vec<Instant>>>,
    fail_first: Arc<AtomicUsize>,
    wrong_key: bool,
}

impl FakeCa {
    fn new(fail_first: usize) -> FakeCa {
        FakeCa {
            ca: Arc::new(TestCa::new()),
            calls: Arc::default(),
            fail_first: Arc::new(AtomicUsize::new(fail_first)),
            wrong_key: false,
        }
    }

    fn calls(&self) -> Vec<Instant> {
        self.calls.lock().unwrap().clone()
    }
}

impl Issuer for FakeCa {
    async fn issue(&self, csr: String, ttl: Duration) -> Result<Vec<String>, CaError> {
        self.calls.lock().unwrap().push(Instant::now());
        let failing = self
            .fail_first
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(CaError::Call {
                address: "fake".into(),
                code: tonic::Code::Unavailable,
                message: "down".into(),
            });
        }
        let how = Signing {
            other_key: self.wrong_key,
            ..Signing::default()
        };
        Ok(self.ca.sign(&csr, ttl, &how))
    }

    fn address(&self) -> &str {
        "fake:15012"
    }
}

fn rotation(ca: &FakeCa, ttl: Duration, told: Arc<AtomicBool>) -> (Rotation<FakeCa>, Arc<Store>) {
    let store = Arc::new(Store::default());
    let r = Rotation {
        issuer: ca.clone(),
        spiffe_id: SpiffeId::parse(ID).unwrap(),
        ttl,
        grace_period_ratio: 0.5,
        fallback_roots: Vec::new(),
        store: Arc::clone(&store),
        metrics: TlsMetrics::default(),
        on_first: Some(Box::new(move || told.store(true, Ordering::SeqCst))),
    };
    (r, store)
}

#[tokio::test(start_paused = true)]
async fn renews_at_the_grace_ratio_of_the_lifetime() {
    let ca = FakeCa::new(0);
    let told = Arc::new(AtomicBool::new(false));
    let (r, store) = rotation(&ca, Duration::from_secs(100), Arc::clone(&told));
    let start = Instant::now();
    let task = tokio::spawn(r.run());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(told.load(Ordering::SeqCst));
    let first = store.current().unwrap();
    assert_eq!(first.spiffe_id.as_str(), ID);
    tokio::time::sleep(Duration::from_secs(160)).await;
    let calls = ca.calls();
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert!(calls[0].duration_since(start) < Duration::from_secs(1));
    for pair in calls.windows(2) {
        let gap = pair[1].duration_since(pair[0]).as_secs_f64();
        // Half of 100 s, give or take Istio's 1% jitter of the lifetime, and less up to a
        // second because X.509 validity is in whole seconds (issued "earlier" than now).
        assert!((48.0..=51.0).contains(&gap), "renewed after {gap}s");
    }
    let now = store.current().unwrap();
    assert_ne!(now.chain[0].serial, first.chain[0].serial);
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_exponentially_and_keep_serving() {
    let ca = FakeCa::new(4);
    let told = Arc::new(AtomicBool::new(false));
    let (r, store) = rotation(&ca, Duration::from_secs(3600), Arc::clone(&told));
    let metrics = r.metrics.clone();
    let start = Instant::now();
    let task = tokio::spawn(r.run());
    tokio::time::sleep(Duration::from_secs(30)).await;
    let calls: Vec<f64> = ca
        .calls()
        .iter()
        .map(|c| c.duration_since(start).as_secs_f64())
        .collect();
    assert_eq!(calls.len(), 5, "{calls:?}");
    // Each wait is half to all of 1 s, 2 s, 4 s, 8 s.
    for (i, pair) in calls.windows(2).enumerate() {
        let step = f64::from(1u32 << i);
        let wait = pair[1] - pair[0];
        assert!(
            wait >= step / 2.0 - 0.01 && wait <= step + 0.01,
            "wait {i}: {wait}"
        );
    }
    assert_eq!(metrics.ca_failures("unavailable"), 4);
    assert!(told.load(Ordering::SeqCst));
    assert!(store.is_loaded());
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_certificate_for_another_key_is_never_installed() {
    let mut ca = FakeCa::new(0);
    ca.wrong_key = true;
    let told = Arc::new(AtomicBool::new(false));
    let (r, store) = rotation(&ca, Duration::from_secs(60), Arc::clone(&told));
    let metrics = r.metrics.clone();
    let task = tokio::spawn(r.run());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!store.is_loaded());
    assert!(!told.load(Ordering::SeqCst));
    assert!(metrics.ca_failures("mismatch") >= 2);
    task.abort();
}

#[test]
fn renewal_point_is_the_ratio_of_the_lifetime() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let end = t0 + Duration::from_secs(86_400);
    assert_eq!(renew_delay(t0, end, t0, 0.5), Duration::from_secs(43_200));
    assert_eq!(
        renew_delay(t0, end, t0 + Duration::from_secs(40_000), 0.5),
        Duration::from_secs(3_200)
    );
    // Past the point already (a skewed clock): renew now.
    assert_eq!(renew_delay(t0, end, end, 0.5), Duration::ZERO);
}

#[test]
fn backoff_doubles_up_to_its_cap() {
    let mut b = Backoff::default();
    let mut step = BACKOFF_INITIAL;
    for _ in 0..12 {
        let d = b.next_delay();
        assert!(d >= step / 2 && d <= step, "{d:?} for step {step:?}");
        step = (step * 2).min(BACKOFF_MAX);
    }
    assert_eq!(step, BACKOFF_MAX);
}
