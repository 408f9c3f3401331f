//! HTTP/1.1 request framing read beside hyper (`remora::http::framing::RequestFraming`): any
//! bytes a client sends on a connection, fed in pieces. Which request (if any) is refused and
//! why (both `Content-Length` and `Transfer-Encoding`, a fragment in its target, with the
//! fragment's text) must not depend on how the bytes were cut.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora::http::framing::{RefusedHead, RequestFraming};

fn smuggled(pieces: &[&[u8]]) -> (Option<RefusedHead>, bool) {
    let mut framing = RequestFraming::new();
    for piece in pieces {
        if let Some(refused) = framing.feed(piece) {
            assert!(refused.position >= 1);
            return (Some(refused), framing.in_head());
        }
    }
    (None, framing.in_head())
}

fuzz_target!(|data: &[u8]| {
    let (pieces, whole) = remora_fuzz::pieces(data);
    let at_once = smuggled(&[whole]);
    let in_pieces = smuggled(&pieces);
    assert_eq!(
        at_once.0, in_pieces.0,
        "the verdict depends on how the bytes were read"
    );
    if at_once.0.is_none() {
        assert_eq!(at_once.1, in_pieces.1);
    }
    let mut stopped = RequestFraming::stopped();
    assert_eq!(stopped.feed(whole), None);
    let mut after = RequestFraming::after(3);
    if let Some(refused) = after.feed(whole) {
        assert!(refused.position >= 4);
    }
});
