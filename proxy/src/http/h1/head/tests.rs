use super::*;

const LIMITS: Limits = Limits {
    max_header_bytes: 60 * 1024,
    max_headers: 100,
    drop_client_cert: false,
    mesh_tls: false,
    drop_attempt_count: false,
};

fn upstream(req: &[u8], limits: &Limits, extra: &[&[u8]]) -> Option<String> {
    let head = parse_request(req, limits)?;
    let mut out = Vec::new();
    head.write_upstream(req, extra, &mut out);
    Some(String::from_utf8(out).unwrap())
}

#[test]
fn a_plain_request_is_forwarded_as_received_plus_additions() {
    let req =
        b"GET /a?b=c HTTP/1.1\r\nHost: svc:80\r\nUser-Agent: curl\r\nX-Request-Id: abc\r\n\r\n";
    let head = parse_request(req, &LIMITS).unwrap();
    assert_eq!(head.len, req.len());
    assert_eq!(head.target, "/a?b=c");
    assert_eq!(head.host, Some(&b"svc:80"[..]));
    assert_eq!(head.request_id, Some(&b"abc"[..]));
    assert!(!head.close && !head.forwarded_proto && head.idempotent());
    let out = upstream(req, &LIMITS, &[b"x-forwarded-proto: http\r\n"]).unwrap();
    assert_eq!(
        out,
        "GET /a?b=c HTTP/1.1\r\nHost: svc:80\r\nUser-Agent: curl\r\nX-Request-Id: abc\r\nx-forwarded-proto: http\r\n\r\n"
    );
}

#[test]
fn connection_and_the_headers_the_mesh_replaces_are_dropped() {
    let req = b"POST / HTTP/1.1\r\nconnection: keep-alive, close\r\nx-envoy-attempt-count: 9\r\nX-Forwarded-Client-Cert: By=forged\r\ncontent-length: 3\r\n\r\nabc";
    let limits = Limits {
        drop_client_cert: true,
        drop_attempt_count: true,
        ..LIMITS
    };
    let head = parse_request(req, &limits).unwrap();
    assert!(head.close);
    assert_eq!(head.content_length, 3);
    assert!(!head.idempotent());
    let out = upstream(req, &limits, &[]).unwrap();
    assert_eq!(out, "POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\n");
    // Outbound without retries, both stay.
    let out = upstream(req, &LIMITS, &[]).unwrap();
    assert!(out.contains("x-envoy-attempt-count: 9\r\n"), "{out}");
    assert!(
        out.contains("X-Forwarded-Client-Cert: By=forged\r\n"),
        "{out}"
    );
    // Over mesh TLS the client's sidecar may have set one: hyper's path appends ours to it.
    let mesh = Limits {
        mesh_tls: true,
        ..LIMITS
    };
    assert!(parse_request(req, &mesh).is_none());
    assert!(parse_request(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n", &mesh).is_some());
}

#[test]
fn headers_named_by_connection_are_dropped_wherever_they_are() {
    let req = b"GET / HTTP/1.1\r\nx-hop: 1\r\nHost: a\r\nConnection: X-Hop, host, Content-Length\r\nx-request-id: id\r\nx-other: 2\r\nX-HOP: 3\r\n\r\n";
    let limits = Limits {
        drop_attempt_count: true,
        ..LIMITS
    };
    let out = upstream(req, &limits, &[]).unwrap();
    assert_eq!(
        out,
        "GET / HTTP/1.1\r\nHost: a\r\nx-request-id: id\r\nx-other: 2\r\n\r\n"
    );
    // A named x-request-id is not the client's to keep: the mesh sets one.
    let req = b"GET / HTTP/1.1\r\nx-request-id: id\r\nconnection: x-request-id\r\n\r\n";
    let head = parse_request(req, &LIMITS).unwrap();
    assert_eq!(head.request_id, None);
}

#[test]
fn shapes_the_general_path_handles_are_left_to_it() {
    let handed_off: [&[u8]; 16] = [
        b"GET / HTTP/1.1\r\nHost: a\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
        b"GET http://a/ HTTP/1.1\r\n\r\n",
        b"CONNECT a:443 HTTP/1.1\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\n\r\n",
        b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\na",
        b"POST / HTTP/1.1\r\ncontent-length: +1\r\n\r\na",
        b"GET / HTTP/1.1\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
        b"GET / HTTP/1.1\r\nconnection: a, b, c, d, e\r\n\r\n",
        b"POST / HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 1\r\n\r\n",
        b"GET / HTTP/1.1\r\nte: trailers\r\n\r\n",
        b"POST / HTTP/1.1\r\ncontent-type: application/grpc\r\n\r\n",
        b"GET / HTTP/1.1\nhost: a\n\n",
        b"GET / HTTP/1.1\r\nbad header\r\n\r\n",
        b"GET / HTTP/1.1\r\nKeep-Alive: timeout=5\r\n\r\n",
    ];
    for req in handed_off {
        assert!(
            parse_request(req, &LIMITS).is_none(),
            "{}",
            String::from_utf8_lossy(req)
        );
    }
}

#[test]
fn heads_over_the_limits_are_left_to_the_general_path() {
    let req = b"GET / HTTP/1.1\r\na: 1\r\nb: 2\r\n\r\n";
    let few = Limits {
        max_headers: 1,
        ..LIMITS
    };
    assert!(parse_request(req, &few).is_none());
    let small = Limits {
        max_header_bytes: req.len() - 1,
        ..LIMITS
    };
    assert!(parse_request(req, &small).is_none());
    assert!(parse_request(req, &LIMITS).is_some());
}

fn downstream(res: &[u8], head_request: bool, close: bool) -> (ResponseHead, String) {
    let head = parse_response(res, head_request).unwrap().unwrap();
    let mut out = Vec::new();
    head.write_downstream(res, &[], None, None, close, &mut out);
    (head, String::from_utf8(out).unwrap())
}

#[test]
fn response_framing_follows_rfc_9112() {
    let (h, _) = downstream(
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
        false,
        false,
    );
    assert_eq!(
        (h.status, h.framing, h.close),
        (200, Framing::Length(5), false)
    );
    let (h, _) = downstream(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", true, false);
    assert_eq!(h.framing, Framing::None);
    let (h, _) = downstream(b"HTTP/1.1 204 No Content\r\n\r\n", false, false);
    assert_eq!(h.framing, Framing::None);
    let (h, _) = downstream(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
        false,
        false,
    );
    assert_eq!(h.framing, Framing::Chunked);
    // A coding other than chunked last is refused, as Envoy's codec refuses it (but for a
    // 304, whose coding is taken off).
    assert!(parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", false).is_err());
    let (h, out) = downstream(
        b"HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\netag: x\r\n\r\n",
        false,
        false,
    );
    assert_eq!(
        (h.framing, out.as_str()),
        (
            Framing::None,
            "HTTP/1.1 304 Not Modified\r\netag: x\r\n\r\n"
        )
    );
    // A 204 announcing a body is refused; its zero length is taken off.
    for bad in [
        &b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello"[..],
        b"HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n",
    ] {
        assert!(parse_response(bad, false).is_err());
    }
    let (_, out) = downstream(
        b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n",
        false,
        false,
    );
    assert_eq!(out, "HTTP/1.1 204 No Content\r\n\r\n");
    let (h, _) = downstream(b"HTTP/1.1 200 OK\r\n\r\n", false, false);
    assert_eq!(h.framing, Framing::Close);
    let (h, _) = downstream(b"HTTP/1.1 100 Continue\r\n\r\n", false, false);
    assert!(h.interim());
    let (h, out) = downstream(
        b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n",
        false,
        false,
    );
    assert!(h.close, "HTTP/1.0 closes unless it says keep-alive");
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    let (h, _) = downstream(
        b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n",
        false,
        false,
    );
    assert!(!h.close);
}

#[test]
fn hop_by_hop_response_headers_are_dropped_and_close_added() {
    let res = b"HTTP/1.1 200 OK\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nx-end: 2\r\ncontent-length: 0\r\n\r\n";
    let (h, out) = downstream(res, false, true);
    assert!(h.close);
    assert_eq!(
        out,
        "HTTP/1.1 200 OK\r\nx-end: 2\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    // A length beside chunked is refused, as Envoy's codec refuses it.
    let res = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\ntransfer-encoding: chunked\r\n\r\n";
    assert!(parse_response(res, false).is_err());
}

#[test]
fn malformed_responses_are_errors_and_partial_ones_wait() {
    assert_eq!(
        parse_response(b"HTTP/1.1 200 OK\r\ncont", false)
            .unwrap()
            .map(|h| h.len),
        None
    );
    assert!(parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n", false).is_err());
    // A length twice, even the same one, is refused, as Envoy's codec refuses it.
    for twice in [
        &b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n",
    ] {
        assert!(parse_response(twice, false).is_err());
    }
    assert!(parse_response(b"SPDY/3 200 OK\r\n\r\n", false).is_err());
    let huge = vec![b'a'; MAX_RESPONSE_HEAD + 1];
    assert!(parse_response(&huge, false).is_err());
}

#[test]
fn a_client_sidecars_metadata_headers_are_read_inbound_and_pass_outbound() {
    let req = b"GET / HTTP/1.1\r\nhost: a\r\nx-envoy-peer-metadata: Cg0K\r\nX-Envoy-Peer-Metadata-Id: sidecar~a\r\nconnection: x-b\r\nx-b: 1\r\n\r\n";
    for inbound in [
        Limits {
            drop_client_cert: true,
            ..LIMITS
        },
        Limits {
            mesh_tls: true,
            ..LIMITS
        },
    ] {
        let head = parse_request(req, &inbound).unwrap();
        assert_eq!(head.peer_metadata, Some(&b"Cg0K"[..]));
        assert!(head.peer_metadata_id);
        // Neither line goes on, nor Connection and what it names (the second pass).
        let out = upstream(req, &inbound, &[]).unwrap();
        assert_eq!(out, "GET / HTTP/1.1\r\nhost: a\r\n\r\n");
    }
    let head = parse_request(req, &LIMITS).unwrap();
    assert_eq!(head.peer_metadata, None);
    let out = upstream(req, &LIMITS, &[]).unwrap();
    assert!(out.contains("x-envoy-peer-metadata: Cg0K\r\n"), "{out}");
    assert!(
        out.contains("X-Envoy-Peer-Metadata-Id: sidecar~a\r\n"),
        "{out}"
    );
    // Two metadata headers are not for the fast path to choose between.
    let twice = b"GET / HTTP/1.1\r\nx-envoy-peer-metadata: a\r\nx-envoy-peer-metadata: b\r\n\r\n";
    let mesh = Limits {
        mesh_tls: true,
        ..LIMITS
    };
    assert!(parse_request(twice, &mesh).is_none());
}

#[test]
fn a_mesh_servers_metadata_headers_are_read_and_not_passed_on() {
    let res = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-envoy-peer-metadata-id: sidecar~b\r\nX-Envoy-Peer-Metadata: Cg0K\r\nx-app: 1\r\n\r\nok";
    let head = parse_response_from(res, false, true).unwrap().unwrap();
    let (from, to) = head.peer_metadata.unwrap();
    assert_eq!(&res[from as usize..to as usize], b"Cg0K");
    let mut out = Vec::new();
    head.write_downstream(res, &[], None, None, false, &mut out);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-app: 1\r\n\r\n"
    );
    // From any other upstream they are the application's, and pass.
    let (head, out) = downstream(res, false, false);
    assert_eq!(head.peer_metadata, None);
    assert!(out.contains("X-Envoy-Peer-Metadata: Cg0K\r\n"), "{out}");
}

/// The route decision's header matchers read a header's first value from the raw head, by a
/// name in any case, its spaces trimmed; absent headers and the request line are not found.
#[test]
fn a_headers_value_is_found_in_the_raw_head_for_route_matching() {
    let buf = b"GET /p HTTP/1.1\r\nHost: svc\r\nEnd-User:  jason \r\nend-user: other\r\n\r\nbody";
    let len = buf.len() - 4;
    assert_eq!(header_value(buf, len, "end-user"), Some("jason"));
    assert_eq!(header_value(buf, len, "host"), Some("svc"));
    assert_eq!(header_value(buf, len, "x-missing"), None);
    assert_eq!(header_value(buf, len, "get /p http/1.1"), None);
    // The body is not part of the head.
    assert_eq!(
        header_value(b"GET / HTTP/1.1\r\n\r\nx: 1\r\n", 18, "x"),
        None
    );
    // A client's own attempt count is noted whether or not it is dropped.
    let req = b"GET / HTTP/1.1\r\nhost: a\r\nx-envoy-attempt-count: 3\r\n\r\n";
    assert!(parse_request(req, &LIMITS).is_some_and(|h| h.attempt_count));
}

/// Found by the h1_response_head fuzz target: empty lines before an HTTP/1.0 status line
/// (which httparse skips) made the head for the client start `HTTP/1.1/1.0 200`, because the
/// version was replaced at offset 0 rather than where the status line starts. They are not
/// passed on at all now.
#[test]
fn empty_lines_before_the_status_line_are_not_passed_on() {
    let (h, out) = downstream(
        b"\r\n\nHTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
        false,
        false,
    );
    assert_eq!(out, "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n");
    assert_eq!(h.framing, Framing::Length(2));
    let (_, out) = downstream(b"\r\nHTTP/1.1 204 No Content\r\n\r\n", false, false);
    assert_eq!(out, "HTTP/1.1 204 No Content\r\n\r\n");
}

/// The head written to the client of response `res`, with our `server` when given.
fn with_server(res: &[u8], server: Option<&[u8]>) -> String {
    written(res, server, None)
}

/// The head written to the client of response `res`, with our `server` and the router's
/// service time when given.
fn written(res: &[u8], server: Option<&[u8]>, service_time: Option<u64>) -> String {
    let head = parse_response(res, false)
        .expect("valid")
        .expect("complete");
    let mut out = Vec::new();
    head.write_downstream(res, &[], server, service_time, false, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn a_connection_managers_server_replaces_the_upstreams_among_dropped_lines() {
    let res = b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nServer: nginx\r\nx-a: 1\r\nConnection: keep-alive\r\ncontent-length: 0\r\n\r\n";
    assert_eq!(
        with_server(res, Some(b"istio-envoy")),
        "HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 0\r\nserver: istio-envoy\r\n\r\n"
    );
    // Without one of its own, the upstream's passes.
    assert!(with_server(res, None).contains("Server: nginx\r\n"));
    // Lines ended by a bare LF are found too.
    assert_eq!(
        with_server(
            b"HTTP/1.1 200 OK\nServer: a\nx-a: 1\nserver: b\r\n\r\n",
            Some(b"ours")
        ),
        "HTTP/1.1 200 OK\nx-a: 1\nserver: ours\r\n\r\n"
    );
    // One, after a dropped line and a line ended by a bare LF.
    assert_eq!(
        with_server(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nx-a: 1\nServer: a\r\n\r\n",
            Some(b"ours")
        ),
        "HTTP/1.1 200 OK\r\nx-a: 1\nserver: ours\r\n\r\n"
    );
    // None from the upstream: ours is added.
    assert_eq!(
        with_server(b"HTTP/1.1 204 No Content\r\n\r\n", Some(b"envoy")),
        "HTTP/1.1 204 No Content\r\nserver: envoy\r\n\r\n"
    );
}

#[test]
fn a_target_with_a_fragment_is_left_to_hyper() {
    for target in ["/a#b", "/a?q=1#", "/#"] {
        let req = format!("GET {target} HTTP/1.1\r\nHost: svc\r\n\r\n");
        assert!(parse_request(req.as_bytes(), &LIMITS).is_none(), "{target}");
    }
    // Escaped, it is part of the path.
    let req = b"GET /a%23b HTTP/1.1\r\nHost: svc\r\n\r\n";
    assert_eq!(parse_request(req, &LIMITS).unwrap().target, "/a%23b");
}

#[test]
fn the_routers_service_time_replaces_the_upstreams() {
    let write = |res: &[u8], ms: Option<u64>| written(res, None, ms);
    let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    assert_eq!(
        write(plain, Some(12)),
        "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nx-envoy-upstream-service-time: 12\r\n\r\n"
    );
    // A sidecar in front of the upstream said its own: ours only.
    let sidecar =
        b"HTTP/1.1 200 OK\r\nX-Envoy-Upstream-Service-Time: 3\r\ncontent-length: 0\r\n\r\n";
    assert_eq!(
        write(sidecar, Some(5)),
        "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nx-envoy-upstream-service-time: 5\r\n\r\n"
    );
    // Not routed by xDS: the upstream's passes as it came.
    assert!(write(sidecar, None).contains("X-Envoy-Upstream-Service-Time: 3\r\n"));
}
