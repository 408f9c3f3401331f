//! Protocol detection on a client's first bytes (`remora::detect::classify`): whatever they
//! are, a verdict or "wait for more", and a verdict once enough bytes have arrived.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora::detect::{classify, Verdict};

fuzz_target!(|data: &[u8]| {
    let verdict = classify(data);
    // Detection itself never yields the verdicts that come from the connection's events.
    assert!(!matches!(
        verdict,
        Some(
            Verdict::ServerFirst
                | Verdict::Timeout
                | Verdict::ClientClosed
                | Verdict::ClientFailed
                | Verdict::UpstreamFailed
        )
    ));
    // Once decided, more bytes never turn the verdict back into "wait" (detection reads
    // until it decides, then stops).
    if let Some(v) = verdict {
        let mut longer = data.to_vec();
        longer.extend_from_slice(b"\r\n\r\nmore");
        if let Some(w) = classify(&longer) {
            if v != Verdict::Tls {
                assert_eq!(v, w, "a decided verdict changed with more bytes");
            }
        } else {
            panic!("a decided verdict became undecided with more bytes: {v:?}");
        }
    }
});
