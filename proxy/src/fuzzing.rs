//! Entry points for the fuzz targets (`fuzz/`, see docs/fuzzing.md) into parsers that are
//! private to their modules: re-exports of the parsers themselves, never copies, so that
//! what is fuzzed is what runs. Not an API for anything else.

/// The fast path's chunked-body follower (`http::h1::chunked`).
pub use crate::http::h1::chunked::{BadChunk, ChunkedEnd};

/// The DNS forwarder's message reading (`dns::message`).
pub mod dns {
    pub use crate::dns::message::{answers, id, is_query, is_truncated, servfail, HEADER_LEN};
}
