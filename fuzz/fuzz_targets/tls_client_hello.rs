//! The ClientHello reader (`remora::tls::client_hello::parse`) on any first bytes: complete,
//! incomplete or invalid, and a prefix of a complete hello is never called invalid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora::tls::client_hello::{parse, Parsed};

fuzz_target!(|data: &[u8]| {
    let whole = parse(data);
    if let Parsed::Complete(hello) = &whole {
        let _ = hello.offers_any(&[b"istio", b"h2"]);
    }
    if matches!(whole, Parsed::Complete(_) | Parsed::Incomplete) {
        // Detection reads a hello as it arrives: no prefix of one that parses is invalid.
        for cut in [data.len() / 2, data.len().saturating_sub(1), 5, 9] {
            if let Some(prefix) = data.get(..cut) {
                assert_ne!(
                    parse(prefix),
                    Parsed::Invalid,
                    "a prefix of {whole:?} is invalid"
                );
            }
        }
    }
});
