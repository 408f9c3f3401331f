//! Path normalisation (`remora::authz::path::normalize`), on any request target a client
//! sends, in every mode: never a panic, a result is ASCII, and normalising it again changes
//! nothing (else a policy on the normal form could be bypassed by a second pass upstream).
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora::authz::path::normalize;
use remora_config::PathNormalization;

fuzz_target!(|data: &[u8]| {
    let Ok(target) = std::str::from_utf8(data) else {
        return;
    };
    for mode in [
        PathNormalization::None,
        PathNormalization::Base,
        PathNormalization::MergeSlashes,
        PathNormalization::DecodeAndMergeSlashes,
    ] {
        let Ok(once) = normalize(target, mode) else {
            continue;
        };
        if mode == PathNormalization::None {
            assert_eq!(once, target);
            continue;
        }
        if target.starts_with('/') {
            assert!(once.starts_with('/'), "{target:?} normalised to {once:?}");
        }
        let twice = normalize(&once, mode).expect("a normal path normalises");
        assert_eq!(once, twice, "normalising {target:?} again changed it");
    }
});
