//! Istio's metadata exchange from a peer: the TCP exchange's preamble and payload
//! (`wire::payload_len`, `wire::decode`) and the `x-envoy-peer-metadata` header value
//! (`http::decode_value`). Whatever decodes must encode and decode again to the same workload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora::metadata_exchange::{http, wire, MAX_PAYLOAD};

fuzz_target!(|data: &[u8]| {
    // The header value, as text from a request or response.
    if let Some(metadata) = http::decode_value(data) {
        let node = wire::encode_node(&metadata);
        let again = wire::decode_node(&node).expect("our own encoding decodes");
        assert_eq!(again, metadata);
    }
    // The TCP exchange: a preamble, then the payload it announces.
    if let Some(preamble) = data.get(..wire::PREAMBLE_LEN) {
        let preamble: [u8; wire::PREAMBLE_LEN] = preamble.try_into().expect("eight bytes");
        if let Some(len) = wire::payload_len(preamble) {
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            if len <= MAX_PAYLOAD {
                if let Some(payload) = data.get(wire::PREAMBLE_LEN..wire::PREAMBLE_LEN + len) {
                    if let Ok(Some(metadata)) = wire::decode(payload) {
                        let header = wire::encode(&metadata);
                        let again = wire::decode(&header[wire::PREAMBLE_LEN..]).expect("decodes");
                        assert_eq!(again.as_ref(), Some(&metadata));
                    }
                }
            }
        }
    }
    let _ = wire::decode(data);
});
