//! The access-log record of a request the fast path serves.

use super::head;
use crate::http::access_log::RequestLog;
use crate::http::body::RequestEnd;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// The access-log record of a request the fast path serves, as the general path records it.
pub(super) fn request_log(
    started: Instant,
    head: &head::RequestHead<'_>,
    id: Option<&[u8; 36]>,
    end: &RequestEnd,
) -> RequestLog {
    let value = |v: &[u8]| http::HeaderValue::from_bytes(v).ok();
    RequestLog {
        // Only a logged request reads the wall clock; the log prints it to the millisecond,
        // and parsing the head took a few microseconds.
        start: SystemTime::now(),
        started,
        method: http::Method::from_bytes(head.method).ok(),
        uri: head.target.parse().ok(),
        version: http::Version::HTTP_11,
        authority: head.host.and_then(value),
        user_agent: head.user_agent.and_then(value),
        request_id: id.map(|id| &id[..]).or(head.request_id).and_then(value),
        forwarded_for: head.forwarded_for.and_then(value),
        status: 0,
        upstream: None,
        upstream_time: None,
        received: Arc::clone(&end.received),
        envoy: Default::default(),
    }
}
