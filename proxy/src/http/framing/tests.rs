use super::*;

/// Feed `bytes` whole, then again split at every position, and check both agree.
fn feed_all(bytes: &[u8]) -> (Option<RefusedHead>, RequestFraming) {
    let mut whole = RequestFraming::new();
    let found = whole.feed(bytes);
    for split in 0..=bytes.len() {
        let mut parts = RequestFraming::new();
        let (a, b) = bytes.split_at(split);
        let found_split = parts.feed(a).or_else(|| parts.feed(b));
        assert_eq!(found, found_split, "split at {split}");
        assert_eq!(whole.state, parts.state, "split at {split}");
    }
    let mut bytewise = RequestFraming::new();
    let found_bytewise = bytes.chunks(1).find_map(|b| bytewise.feed(b));
    assert_eq!(found, found_bytewise, "byte by byte");
    (found, whole)
}

/// The head at `position` refused for both Content-Length and Transfer-Encoding.
fn both(position: u64) -> RefusedHead {
    RefusedHead {
        position,
        why: HeadFault::LengthAndChunked,
    }
}

#[test]
fn plain_requests_pass_and_end_idle() {
    let (found, f) =
        feed_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(found, None);
    assert_eq!(f.heads, 2);
    assert!(!f.in_head());
    assert_eq!(f.state, State::Idle);
}

#[test]
fn content_length_with_transfer_encoding_is_reported_in_either_order() {
    let (found, f) = feed_all(
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    );
    assert_eq!(found, Some(both(1)));
    assert_eq!(f.state, State::Stopped);
    let (found, _) = feed_all(
        b"POST / HTTP/1.1\r\ntransfer-encoding: CHUNKED\r\ncontent-LENGTH: 3\r\n\r\n0\r\n\r\n",
    );
    assert_eq!(found, Some(both(1)));
    // hyper does not even parse a length that comes after the encoding; it is still refused.
    let (found, _) = feed_all(
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n0\r\n\r\n",
    );
    assert_eq!(found, Some(both(1)));
}

#[test]
fn a_content_length_body_is_skipped_even_when_it_looks_like_a_head() {
    let body = b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut stream =
        format!("POST /a HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    stream.extend_from_slice(body);
    stream.extend_from_slice(b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n");
    let (found, f) = feed_all(&stream);
    assert_eq!(found, None);
    assert_eq!(f.heads, 2);
    // And the next head is inspected: the third request is reported as the third.
    stream.extend_from_slice(
        b"POST /c HTTP/1.1\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    assert_eq!(feed_all(&stream).0, Some(both(3)));
}

#[test]
fn a_chunked_body_with_extensions_and_trailers_is_skipped() {
    let data = b"Content-Length: 3\r\nX: y\r\n\r\n";
    let mut stream = b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    stream.extend_from_slice(format!("{:x};name=value\r\n", data.len()).as_bytes());
    stream.extend_from_slice(data);
    stream.extend_from_slice(
        b"\r\n0\r\nContent-Length: 9\r\n\r\n\
          \r\nPUT /b HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    assert_eq!(feed_all(&stream).0, Some(both(2)));
}

#[test]
fn the_head_timer_runs_only_inside_a_head() {
    let mut f = RequestFraming::new();
    f.feed(b"\r\n");
    assert!(!f.in_head(), "blank lines before a request are idle");
    f.feed(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Le");
    assert!(f.in_head());
    f.feed(b"ngth: 4\r\n\r\nab");
    assert!(!f.in_head(), "a body is not a head");
    f.feed(b"cd");
    assert!(!f.in_head());
    assert_eq!(f.state, State::Idle);
    f.feed(b"G");
    assert!(f.in_head());
}

#[test]
fn upgrades_connect_and_refused_framing_stop_the_inspection() {
    for first in [
        &b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"[..],
        b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ] {
        let mut stream = first.to_vec();
        stream.extend_from_slice(
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        let (found, f) = feed_all(&stream);
        assert_eq!(found, None, "{}", String::from_utf8_lossy(first));
        assert_eq!(f.state, State::Stopped);
        assert!(!f.in_head());
    }
}

#[test]
fn names_that_only_start_like_tracked_ones_are_not_tracked() {
    let (found, f) = feed_all(
        b"POST / HTTP/1.1\r\nContent-Type: a\r\nContent-Lengthy: 1\r\nTransfer: chunked\r\n\
          Upgrade-Insecure-Requests: 1\r\nCONNECTION: close\r\nContent-Length: 2\r\n\r\nab\
          GET / HTTP/1.1\r\n\r\n",
    );
    assert_eq!(found, None);
    assert_eq!(f.heads, 2);
    assert_eq!(f.state, State::Idle);
}

#[test]
fn bare_line_feeds_end_lines_too() {
    let (found, f) = feed_all(b"GET / HTTP/1.1\nHost: a\nContent-Length: 1\n\nxGET / HTTP/1.1\n\n");
    assert_eq!(found, None);
    assert_eq!(f.heads, 2);
}

#[test]
fn http2_is_never_inspected() {
    let mut f = RequestFraming::stopped();
    assert_eq!(
        f.feed(b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"),
        None
    );
    assert!(!f.in_head());
}

#[test]
fn a_fragment_in_the_target_is_no_fault() {
    // hyper drops it as Envoy under Istio's bootstrap strips it: both heads go on, and the
    // framing after them is still followed.
    let (found, f) = feed_all(
        b"GET /a?q#frag HTTP/1.1\r\nHost: a\r\n\r\nPOST /b#x HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
    );
    assert_eq!(found, None);
    assert_eq!(f.heads(), 2);
    assert!(!f.in_head());
    // Smuggling after a fragment is still found.
    let (found, _) =
        feed_all(b"POST /a#x HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(
        found,
        Some(RefusedHead {
            position: 1,
            why: HeadFault::LengthAndChunked
        })
    );
}
