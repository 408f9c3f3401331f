//! The HTTP/1.1 fast path's response head parser (`parse_response_from`): any bytes an
//! upstream sends. A head it accepts is written to the client without its hop-by-hop lines;
//! that head must parse again with the same status and framing (and, with a `server` of ours,
//! carry exactly that one).
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora::http::h1::head::{parse_response_from, Framing, MAX_RESPONSE_HEADERS};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, buf)) = data.split_first() else {
        return;
    };
    let head_request = flags & 1 != 0;
    let mesh_server = flags & 2 != 0;
    let Ok(Some(head)) = parse_response_from(buf, head_request, mesh_server) else {
        return;
    };
    assert!(head.len <= buf.len());
    if let Some((from, to)) = head.peer_metadata {
        assert!(from <= to && to as usize <= head.len);
    }
    let _ = head.interim();
    // As the fast path calls it: a body that ends with the connection closes the client's.
    let close = flags & 4 != 0 || head.framing == Framing::Close;
    // An xDS connection manager's own `server` in place of the upstream's.
    let server = (flags & 8 != 0).then_some(b"istio-envoy".as_slice());
    // Routed by xDS: the router's service time in place of the upstream's.
    let service_time = (flags & 16 != 0).then_some(7);
    let mut out = Vec::new();
    head.write_downstream(
        buf,
        &[b"x-extra: 1\r\n"],
        server,
        service_time,
        close,
        &mut out,
    );
    if service_time.is_some() {
        let ours = out
            .split(|&b| b == b'\n')
            .filter(|line| {
                line.len() > 30
                    && line[..30].eq_ignore_ascii_case(b"x-envoy-upstream-service-time:")
            })
            .count();
        assert_eq!(ours, 1, "not exactly our one service time: {out:?}");
    }
    if server.is_some() {
        let ours = out
            .split(|&b| b == b'\n')
            .filter(|line| line.len() > 7 && line[..7].eq_ignore_ascii_case(b"server:"))
            .count();
        assert_eq!(ours, 1, "not exactly our one server line: {out:?}");
    }
    // Our lines may take a head at the header limit over it; the parser then refuses it, as
    // a client with the same limit would (not a parsing error).
    if out.iter().filter(|&&b| b == b'\n').count() > MAX_RESPONSE_HEADERS + 1 {
        return;
    }
    let again = match parse_response_from(&out, head_request, false) {
        Ok(Some(again)) => again,
        other => panic!("the head written downstream does not parse ({other:?}): {out:?}"),
    };
    assert_eq!(
        again.len,
        out.len(),
        "the client's head has bytes after its end"
    );
    assert_eq!(again.status, head.status);
    assert_eq!(again.framing, head.framing);
    // The upstream's own `Connection: close` is hop-by-hop: only ours reaches the client.
    if close {
        assert!(again.close, "a closing response lost its close");
    }
});
