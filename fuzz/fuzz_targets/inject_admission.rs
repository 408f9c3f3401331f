//! The injection webhook's input (`webhook::admission::review`): any body the API server (or
//! anyone reaching the webhook) posts is answered with a review or refused as malformed,
//! never a panic; an answer is JSON naming the request's uid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora_inject::config::InjectorConfig;
use remora_inject::injector::Injector;
use remora_inject::webhook::admission::{review, NoNamespaces};
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    static INJECTOR: OnceLock<Injector> = OnceLock::new();
    let injector = INJECTOR.get_or_init(|| Injector::new(InjectorConfig::default()));
    if let Ok(answer) = review(data, injector, &NoNamespaces) {
        assert!(answer.is_object());
        let _ = serde_json::to_vec(&answer);
    }
});
