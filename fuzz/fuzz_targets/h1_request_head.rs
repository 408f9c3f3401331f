//! The HTTP/1.1 fast path's request head parser (`remora::http::h1::head::parse_request`): any
//! bytes a client sends. A head it accepts is written upstream with its hop-by-hop lines
//! dropped; that head must parse again to the same request (no line lost into another, no
//! header smuggled in), and the lookups the route decision makes on it must not fail.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora::http::h1::head::{header_value, parse_request, Limits, MAX_REQUEST_HEADERS};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, buf)) = data.split_first() else {
        return;
    };
    let limits = Limits {
        max_header_bytes: if flags & 1 == 0 { 60 * 1024 } else { 64 },
        max_headers: if flags & 2 == 0 {
            MAX_REQUEST_HEADERS
        } else {
            4
        },
        drop_client_cert: flags & 4 != 0,
        mesh_tls: flags & 8 != 0,
        drop_attempt_count: flags & 16 != 0,
    };
    let Some(head) = parse_request(buf, &limits) else {
        return;
    };
    assert!(head.len <= buf.len());
    assert!(head.len <= limits.max_header_bytes);
    for name in ["host", "content-type", "x-request-id", ":authority", ""] {
        let _ = header_value(buf, head.len, name);
    }
    let _ = (head.is_head(), head.idempotent());

    let mut out = Vec::new();
    head.write_upstream(buf, &[b"x-extra: 1\r\n"], &mut out);
    let relaxed = Limits {
        max_header_bytes: usize::MAX,
        max_headers: MAX_REQUEST_HEADERS,
        ..limits
    };
    // Our line may take a head at the header limit over it (see h1_response_head).
    if out.iter().filter(|&&b| b == b'\n').count() > MAX_REQUEST_HEADERS + 1 {
        return;
    }
    let again = parse_request(&out, &relaxed)
        .unwrap_or_else(|| panic!("the head written upstream does not parse: {out:?}"));
    assert_eq!(
        again.len,
        out.len(),
        "the upstream head has bytes after its end"
    );
    assert_eq!(again.method, head.method);
    assert_eq!(again.target, head.target);
    assert_eq!(again.content_length, head.content_length);
    assert_eq!(again.host, head.host);
});
