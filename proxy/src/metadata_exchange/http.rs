//! The same metadata in HTTP headers, as Istio's sidecars exchange it per request
//! (`x-envoy-peer-metadata`: the node-metadata `Struct`, serialized and base64-encoded;
//! `x-envoy-peer-metadata-id`: the node id).
//!
//! The client's sidecar adds both to each request it sends to a mesh server, and reads and
//! removes the server's from the response. The server's sidecar reads and removes the client's
//! from the request, and answers with its own, each only if the request carried its
//! counterpart. Neither application sees them.

use super::{wire, WorkloadMetadata, MAX_PAYLOAD};
use crate::workload::Workload;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use http::{HeaderMap, HeaderName, HeaderValue};

pub const METADATA: HeaderName = HeaderName::from_static(wire::METADATA_KEY);
pub const METADATA_ID: HeaderName = HeaderName::from_static(wire::ID_KEY);

/// Envoy encodes with padding and decodes with or without it.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Longest header value decoded: the base64 of the largest payload TCP's exchange accepts.
const MAX_ENCODED: usize = MAX_PAYLOAD / 3 * 4 + 4;

/// Our two header values, encoded once at start-up.
#[derive(Debug, Clone)]
pub struct LocalHeaders {
    id: HeaderValue,
    metadata: HeaderValue,
    /// The same, as whole header lines for a head written by hand.
    id_line: Vec<u8>,
    metadata_line: Vec<u8>,
}

impl LocalHeaders {
    /// The headers describing `own`, whose Istio node id is `node_id`.
    pub fn new(own: &Workload, node_id: &str) -> Self {
        let encoded = STANDARD.encode(wire::encode_node(&WorkloadMetadata::of(own)));
        // Base64 is always a valid header value; a node id from the environment may not be.
        let id = HeaderValue::from_str(node_id).unwrap_or(HeaderValue::from_static("unknown"));
        let metadata =
            HeaderValue::from_str(&encoded).unwrap_or(HeaderValue::from_static("unknown"));
        let line = |name: &HeaderName, value: &HeaderValue| {
            [name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"].concat()
        };
        LocalHeaders {
            id_line: line(&METADATA_ID, &id),
            metadata_line: line(&METADATA, &metadata),
            id,
            metadata,
        }
    }

    /// Both header lines, describing us in a request to a mesh server.
    pub fn request_lines(&self) -> [&[u8]; 2] {
        [&self.id_line, &self.metadata_line]
    }

    /// The header lines answering a client that described itself (see `add_to_response`).
    pub fn response_lines(&self, received: Received) -> [&[u8]; 2] {
        [
            if received.id { &self.id_line } else { b"" },
            if received.metadata {
                &self.metadata_line
            } else {
                b""
            },
        ]
    }

    /// Describe us to a mesh server: both headers, replacing any the application set.
    pub fn add_to_request(&self, headers: &mut HeaderMap) {
        headers.insert(METADATA_ID, self.id.clone());
        headers.insert(METADATA, self.metadata.clone());
    }

    /// Answer a client that described itself: each header only if its counterpart came.
    pub fn add_to_response(&self, received: Received, headers: &mut HeaderMap) {
        if received.id {
            headers.insert(METADATA_ID, self.id.clone());
        }
        if received.metadata {
            headers.insert(METADATA, self.metadata.clone());
        }
    }
}

impl Default for LocalHeaders {
    fn default() -> Self {
        LocalHeaders::new(&Workload::default(), "unknown")
    }
}

/// Which of the two headers a message carried.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub id: bool,
    pub metadata: bool,
}

/// Remove the peer's headers from `headers`: which came, and the metadata's value, to decode
/// ([`decode_value`]) when it is not known yet.
pub fn take(headers: &mut HeaderMap) -> (Received, Option<HeaderValue>) {
    let id = headers.remove(METADATA_ID);
    let metadata = headers.remove(METADATA);
    let received = Received {
        id: id.is_some(),
        metadata: metadata.is_some(),
    };
    (received, metadata)
}

/// The metadata in an `x-envoy-peer-metadata` value, if it decodes and says anything.
pub fn decode_value(text: &[u8]) -> Option<WorkloadMetadata> {
    if text.len() > MAX_ENCODED {
        return None;
    }
    let bytes = LENIENT.decode(text).ok()?;
    let metadata = wire::decode_node(&bytes).ok()?.bounded();
    (metadata != WorkloadMetadata::default()).then_some(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reviews() -> Workload {
        Workload {
            pod: "reviews-v2-5d8f".into(),
            name: "reviews-v2".into(),
            namespace: "bookinfo".into(),
            app: "reviews".into(),
            version: "v2".into(),
            ..Workload::default()
        }
    }

    #[test]
    fn what_one_side_adds_the_other_takes_and_removes() {
        let ours = LocalHeaders::new(&reviews(), "sidecar~10.0.0.7~reviews-v2-5d8f.bookinfo~x");
        let mut request = HeaderMap::new();
        request.insert("x-other", HeaderValue::from_static("kept"));
        ours.add_to_request(&mut request);
        let (received, value) = take(&mut request);
        let metadata = value.and_then(|v| decode_value(v.as_bytes()));
        assert_eq!(
            received,
            Received {
                id: true,
                metadata: true
            }
        );
        let metadata = metadata.expect("decoded");
        assert_eq!(metadata.workload, "reviews-v2");
        assert_eq!(metadata.namespace, "bookinfo");
        assert_eq!(metadata.app, "reviews");
        assert_eq!(metadata.version, "v2");
        assert_eq!(metadata.instance, "reviews-v2-5d8f");
        assert!(request.get(METADATA).is_none() && request.get(METADATA_ID).is_none());
        assert_eq!(request.get("x-other").unwrap(), "kept");
    }

    #[test]
    fn a_response_carries_only_what_the_request_did() {
        let ours = LocalHeaders::new(&reviews(), "node");
        let mut response = HeaderMap::new();
        ours.add_to_response(Received::default(), &mut response);
        assert!(response.is_empty());
        let only_id = Received {
            id: true,
            metadata: false,
        };
        ours.add_to_response(only_id, &mut response);
        assert_eq!(response.get(METADATA_ID).unwrap(), "node");
        assert!(response.get(METADATA).is_none());
        // The same as whole lines, for the fast path's heads.
        assert_eq!(
            ours.response_lines(only_id),
            [&b"x-envoy-peer-metadata-id: node\r\n"[..], b""]
        );
        let both = ours.response_lines(Received {
            id: true,
            metadata: true,
        });
        let line = String::from_utf8(both[1].to_vec()).unwrap();
        let value = line
            .strip_prefix("x-envoy-peer-metadata: ")
            .and_then(|l| l.strip_suffix("\r\n"))
            .unwrap();
        assert_eq!(
            decode_value(value.as_bytes()).unwrap().workload,
            "reviews-v2"
        );
    }

    #[test]
    fn unpadded_values_decode_and_garbage_is_removed_without_a_peer() {
        let node = wire::encode_node(&WorkloadMetadata::of(&reviews()));
        let unpadded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&node);
        let mut headers = HeaderMap::new();
        headers.insert(METADATA, HeaderValue::from_str(&unpadded).unwrap());
        let (_, value) = take(&mut headers);
        let metadata = decode_value(value.unwrap().as_bytes());
        assert_eq!(metadata.unwrap().workload, "reviews-v2");

        for garbage in ["not base64 !", "AAAA", ""] {
            let mut headers = HeaderMap::new();
            headers.insert(METADATA, HeaderValue::from_static(garbage));
            let (received, value) = take(&mut headers);
            assert!(received.metadata, "{garbage:?}");
            assert!(
                decode_value(value.unwrap().as_bytes()).is_none(),
                "{garbage:?}"
            );
            assert!(headers.is_empty());
        }
        let mut headers = HeaderMap::new();
        let huge = "A".repeat(MAX_ENCODED + 4);
        headers.insert(METADATA, HeaderValue::from_str(&huge).unwrap());
        assert!(decode_value(take(&mut headers).1.unwrap().as_bytes()).is_none());
    }
}
