//! The fast path's chunked-body follower (`ChunkedEnd`): any response body an upstream sends,
//! fed in pieces as reads deliver it. Where the body ends (or that it is malformed) must not
//! depend on how the bytes were cut.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora::fuzzing::ChunkedEnd;

/// Feeds every piece; the body's end as an offset into the whole, or `Err` when malformed.
fn end(pieces: &[&[u8]]) -> Result<Option<usize>, ()> {
    let mut chunked = ChunkedEnd::default();
    let mut at = 0;
    for piece in pieces {
        match chunked.feed(piece) {
            Ok(Some(n)) => {
                assert!(n <= piece.len());
                return Ok(Some(at + n));
            }
            Ok(None) => at += piece.len(),
            Err(_) => return Err(()),
        }
    }
    Ok(None)
}

fuzz_target!(|data: &[u8]| {
    let (pieces, whole) = remora_fuzz::pieces(data);
    let at_once = end(&[whole]);
    let in_pieces = end(&pieces);
    assert_eq!(
        at_once, in_pieces,
        "the body's end depends on how it was read"
    );
});
