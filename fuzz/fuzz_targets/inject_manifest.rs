//! `remora inject` on any manifest stream (`documents::inject_yaml`): pods and pod templates
//! injected or left alone, anything else passed through, errors named; never a panic. What it
//! writes is YAML that reads back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora_inject::config::InjectorConfig;
use remora_inject::documents::inject_yaml;
use remora_inject::injector::Injector;
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    static INJECTOR: OnceLock<Injector> = OnceLock::new();
    let injector = INJECTOR.get_or_init(|| Injector::new(InjectorConfig::default()));
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok((out, _reports)) = inject_yaml(text, injector, None) {
        let _ = remora_inject::documents::split_documents(&out);
    }
});
