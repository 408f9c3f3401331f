//! What the proxy does to headers: refuse malformed framing, drop hop-by-hop headers
//! (RFC 9110 §7.6.1) in both directions, and add the ones a mesh adds (`x-request-id`,
//! `x-forwarded-proto`). Everything else, Host and tracing headers included, passes unchanged.

use super::errors::ErrorKind;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;

/// Envoy's retry attempt header, sent upstream with the attempt's number.
pub static ATTEMPT_COUNT: HeaderName = HeaderName::from_static("x-envoy-attempt-count");
static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
/// An h2c upgrade's settings (RFC 7540 3.2): hop-by-hop, and never forwarded (below).
static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
/// The gRPC status trailer (or header, in a trailers-only response).
pub static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The gRPC message trailer.
pub static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// Why a request is refused before it is forwarded. hyper itself refuses most other
/// request-smuggling shapes (differing Content-Lengths, obs-fold, invalid header names); a
/// Content-Length beside Transfer-Encoding, which hyper drops, is found in the raw head
/// ([`super::framing`]).
pub fn check_request(headers: &HeaderMap) -> Result<(), &'static str> {
    let mut te = headers.get_all(header::TRANSFER_ENCODING).iter();
    if let Some(value) = te.next() {
        // Only `chunked` alone is a framing we forward; `gzip, chunked` and friends are
        // refused, as Envoy refuses them.
        if te.next().is_some() || !value.as_bytes().eq_ignore_ascii_case(b"chunked") {
            return Err("transfer-encoding other than chunked");
        }
    }
    Ok(())
}

/// An HTTP/1.0 request that names its host goes upstream as HTTP/1.1, as Envoy's upstream codec
/// always speaks HTTP/1.1: the upstream connection then stays open for the next request (an
/// HTTP/1.0 request would have the server close it, and each such client cost a new upstream
/// connection, inside mesh TLS a handshake). Its body, if any, is sized, as HTTP/1.0 bodies
/// are. One without a Host stays HTTP/1.0, which does not require one. The client is still
/// answered in HTTP/1.0 terms: hyper closes after the response and never chunks it.
pub fn upstream_version(parts: &mut http::request::Parts) {
    if parts.version == http::Version::HTTP_10 && parts.headers.contains_key(header::HOST) {
        parts.version = http::Version::HTTP_11;
    }
}

/// The request's target and Host as RFC 9112 wants them of HTTP/1.1 (HTTP/2 carries them in
/// pseudo-headers): exactly one Host (an absolute-form target has been given its own by
/// then; CONNECT names its authority in the target), and an origin-form target (`*` for
/// OPTIONS, an authority for CONNECT). Envoy answers the others 400 (`missing_host_header`
/// for no Host).
pub fn check_target<B>(req: &http::Request<B>) -> Result<(), ErrorKind> {
    if req.version() != http::Version::HTTP_11 {
        return Ok(());
    }
    match req.headers().get_all(header::HOST).iter().count() {
        0 if req.uri().authority().is_none() => return Err(ErrorKind::MissingHost),
        0 | 1 => {}
        _ => return Err(ErrorKind::MalformedRequest("repeated host")),
    }
    let method = req.method();
    let path = req.uri().path();
    let origin_form = req.uri().authority().is_none() && path.starts_with('/');
    let asterisk = method == http::Method::OPTIONS && req.uri() == "*";
    if origin_form || asterisk || method == http::Method::CONNECT {
        Ok(())
    } else {
        Err(ErrorKind::MalformedRequest("invalid request target"))
    }
}

/// Whether the request is gRPC (`content-type: application/grpc…`).
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Whether an HTTP/1.1 request asks to switch protocols (`Connection: upgrade` + `Upgrade`).
pub fn wants_upgrade(headers: &HeaderMap) -> bool {
    // `Upgrade: h2c` is not passed on, as Envoy's codec drops it: an origin that accepted it
    // would take the rest of the connection as HTTP/2 straight from the client, past the
    // proxy's per-request checks (h2c smuggling). The request is served as plain HTTP/1.1,
    // its upgrade headers removed with the other hop-by-hop ones.
    let h2c = headers
        .get_all(header::UPGRADE)
        .iter()
        .any(|v| has_token(v, b"h2c"));
    !h2c && headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .any(|v| has_token(v, b"upgrade"))
}

/// Rewrite a request's headers for the upstream hop: [`remove_hop_by_hop`], then
/// [`finish_request`] (which the data path calls apart, with its own headers between them).
#[cfg(test)]
pub fn prepare_request(headers: &mut HeaderMap, upgrade: bool) {
    remove_hop_by_hop(headers, upgrade);
    finish_request(headers);
}

/// The rest of [`prepare_request`], after [`remove_hop_by_hop`], for a request that gets
/// headers of ours in between (inbound mesh TLS: `x-forwarded-proto`,
/// `x-forwarded-client-cert`): the client's hop-by-hop headers go first, so a `Connection`
/// naming one of ours cannot take it away, as Envoy's codec drops them before its connection
/// manager sets its own.
pub fn finish_request(headers: &mut HeaderMap) {
    // Envoy answers `Expect: 100-continue` itself (hyper sends the 100 when the body is first
    // read, which is when the upstream starts taking it) and does not forward it.
    headers.remove(header::EXPECT);
    if !headers.contains_key(&REQUEST_ID) {
        headers.insert(REQUEST_ID.clone(), request_id());
    }
    if !headers.contains_key(&FORWARDED_PROTO) {
        // Plain text on this hop; mesh TLS will set `https`.
        headers.insert(FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
    }
}

/// Envoy's router's `x-envoy-upstream-service-time`: the milliseconds from the request to
/// the upstream's response head. Envoy counts from the request's end, Remora from its head:
/// the same for a request without a body (docs/xds.md).
pub const SERVICE_TIME: http::HeaderName =
    http::HeaderName::from_static("x-envoy-upstream-service-time");

/// The value of [`SERVICE_TIME`] for a request that started at `started`.
pub fn service_time_ms(started: std::time::Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Rewrite a response's headers for the downstream hop.
pub fn prepare_response(headers: &mut HeaderMap, upgraded: bool) {
    remove_hop_by_hop(headers, upgraded);
}

/// Remove the hop-by-hop headers and those the `Connection` header names. With `upgrade`, the
/// `Upgrade` and `Connection: upgrade` headers stay: they are the point of the request.
pub fn remove_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    // Most messages carry none: one pass over the names is cheaper than a lookup per name.
    if !headers.keys().any(is_hop_by_hop) {
        if upgrade {
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        }
        return;
    }
    // Nominated headers first, while `Connection` is still there to read. Most requests carry
    // no Connection header, or one naming only close/keep-alive/upgrade: no allocation then.
    let nominated: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|t| t.trim_ascii())
        .filter(|t| {
            !t.is_empty()
                && !t.eq_ignore_ascii_case(b"close")
                && !t.eq_ignore_ascii_case(b"keep-alive")
                && !t.eq_ignore_ascii_case(b"upgrade")
        })
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .collect();
    for name in nominated {
        // Never let a client strip what the mesh relies on for framing or identity.
        if name != header::HOST && name != header::CONTENT_LENGTH {
            headers.remove(name);
        }
    }
    if !upgrade {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    } else {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    headers.remove(&KEEP_ALIVE);
    headers.remove(&PROXY_CONNECTION);
    headers.remove(header::TRANSFER_ENCODING);
    headers.remove(header::PROXY_AUTHENTICATE);
    // `TE: trailers` is the one TE value an HTTP/2 peer accepts, and gRPC servers require it.
    let te_trailers = headers
        .get_all(header::TE)
        .iter()
        .any(|v| has_token(v, b"trailers"));
    headers.remove(header::TE);
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// Whether `remove_hop_by_hop` has anything to do for a header of this name.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::UPGRADE
        || name == header::TRANSFER_ENCODING
        || name == header::TE
        || name == header::PROXY_AUTHENTICATE
        || name == KEEP_ALIVE
        || name == PROXY_CONNECTION
        || name == HTTP2_SETTINGS
}

fn has_token(value: &HeaderValue, token: &[u8]) -> bool {
    value
        .as_bytes()
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// A random (version 4) UUID, the shape Envoy gives `x-request-id`.
fn request_id() -> HeaderValue {
    // Hex digits and dashes are always a valid header value.
    HeaderValue::from_bytes(&request_id_bytes()).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

/// A random (version 4) UUID as text.
pub fn request_id_bytes() -> [u8; 36] {
    let (hi, lo) = (fastrand::u64(..), fastrand::u64(..));
    let hi = (hi & 0xffff_ffff_ffff_0fff) | 0x0000_0000_0000_4000;
    let lo = (lo & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    let mut out = [0u8; 36];
    let hex = b"0123456789abcdef";
    let mut i = 0;
    for (n, byte) in hi
        .to_be_bytes()
        .iter()
        .chain(lo.to_be_bytes().iter())
        .enumerate()
    {
        if matches!(n, 4 | 6 | 8 | 10) {
            out[i] = b'-';
            i += 1;
        }
        out[i] = hex[usize::from(byte >> 4)];
        out[i + 1] = hex[usize::from(byte & 0xf)];
        i += 2;
    }
    out
}

/// The deadline a gRPC client set (`grpc-timeout: 100m`), per the gRPC-over-HTTP/2 spec.
pub fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(&GRPC_TIMEOUT)?.as_bytes();
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    // At most 8 digits, says the spec.
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b"H" => Duration::from_secs(n * 3600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The `grpc-status` of a trailers-only response, if that is what `headers` are.
pub fn grpc_status(headers: &HeaderMap) -> Option<u32> {
    std::str::from_utf8(headers.get(&GRPC_STATUS)?.as_bytes())
        .ok()?
        .parse()
        .ok()
}

/// Whether an HTTP/1.1 upstream response's framing is one Envoy's codec refuses (502 `UPE`),
/// as the fast path's head parser refuses it (`h1::head::parse_response_from`): a length twice
/// or beside a transfer coding, a coding other than chunked (but on a 304), a 204 announcing a
/// body. What Envoy takes off a bodiless answer (a 204's zero length, a 304's coding) is taken
/// off `headers`.
pub fn refused_response_framing(status: http::StatusCode, headers: &mut HeaderMap) -> bool {
    let lengths = headers.get_all(header::CONTENT_LENGTH).iter().count();
    let last_coding = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .next_back()
        .map(|v| {
            v.as_bytes()
                .rsplit(|b| *b == b',')
                .next()
                .unwrap_or_default()
                .trim_ascii()
                .eq_ignore_ascii_case(b"chunked")
        });
    let coded = last_coding.is_some();
    let other_coding = last_coding == Some(false);
    let status = status.as_u16();
    let nonzero_length = headers
        .get(header::CONTENT_LENGTH)
        .is_some_and(|v| v.as_bytes() != b"0");
    let refused = lengths > 1
        || (coded && lengths > 0)
        || (other_coding && status != 304)
        || (status == 204 && (coded || nonzero_length));
    if !refused {
        if status == 204 {
            headers.remove(header::CONTENT_LENGTH);
        }
        if status == 304 {
            headers.remove(header::TRANSFER_ENCODING);
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn an_h2c_upgrade_is_not_an_upgrade_and_its_headers_go() {
        let mut h = map(&[
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
            ("http2-settings", "AAMAAABkAAQAAP__"),
            ("x-kept", "1"),
        ]);
        assert!(!wants_upgrade(&h));
        prepare_request(&mut h, false);
        for gone in ["connection", "upgrade", "http2-settings"] {
            assert!(!h.contains_key(gone), "{gone}: {h:?}");
        }
        assert!(h.contains_key("x-kept"));
        assert!(wants_upgrade(&map(&[
            ("connection", "upgrade"),
            ("upgrade", "websocket")
        ])));
    }

    #[test]
    fn http_1_0_with_a_host_goes_upstream_as_http_1_1() {
        let parts = |version, host: Option<&str>| {
            let mut b = http::Request::builder().version(version).uri("/a");
            if let Some(h) = host {
                b = b.header(header::HOST, h);
            }
            let (mut parts, ()) = b.body(()).unwrap().into_parts();
            upstream_version(&mut parts);
            parts.version
        };
        use http::Version as V;
        assert_eq!(parts(V::HTTP_10, Some("a")), V::HTTP_11);
        assert_eq!(
            parts(V::HTTP_10, None),
            V::HTTP_10,
            "no Host: stays HTTP/1.0"
        );
        assert_eq!(parts(V::HTTP_11, Some("a")), V::HTTP_11);
        assert_eq!(parts(V::HTTP_2, None), V::HTTP_2);
    }

    #[test]
    fn http_1_1_targets_and_hosts_as_rfc_9112_wants_them() {
        let req = |method: &str, target: &str, hosts: &[&str]| {
            let mut b = http::Request::builder().method(method).uri(target);
            for h in hosts {
                b = b.header(header::HOST, *h);
            }
            b.body(()).unwrap()
        };
        assert_eq!(check_target(&req("GET", "/a?b", &["x"])), Ok(()));
        assert_eq!(check_target(&req("OPTIONS", "*", &["x"])), Ok(()));
        assert_eq!(check_target(&req("CONNECT", "x:443", &["x:443"])), Ok(()));
        // CONNECT names the authority in its target: Host may be left out.
        assert_eq!(check_target(&req("CONNECT", "x:443", &[])), Ok(()));
        for (method, target, hosts) in [
            ("GET", "/a", &["x", "y"][..]),
            ("GET", "/a", &[][..]),
            ("OPTIONS", "*", &[][..]),
            ("GET", "admin", &["x"][..]),
            ("GET", "*", &["x"][..]),
        ] {
            assert!(
                check_target(&req(method, target, hosts)).is_err(),
                "{method} {target} {hosts:?}"
            );
        }
        // HTTP/2 carries both in pseudo-headers: nothing to check here.
        let mut h2 = req("GET", "/a", &[]);
        *h2.version_mut() = http::Version::HTTP_2;
        assert_eq!(check_target(&h2), Ok(()));
    }

    #[test]
    fn hop_by_hop_and_nominated_headers_go_end_to_end_ones_stay() {
        let mut h = map(&[
            ("host", "svc:80"),
            ("connection", "keep-alive, x-secret"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("te", "trailers, deflate"),
            ("traceparent", "00-abc-def-01"),
            ("b3", "80f198ee56343ba8-e457b5a2e4d86bd1-1"),
            ("expect", "100-continue"),
            ("upgrade", "websocket"),
        ]);
        prepare_request(&mut h, false);
        for gone in ["connection", "keep-alive", "x-secret", "expect", "upgrade"] {
            assert!(!h.contains_key(gone), "{gone} should be removed");
        }
        assert_eq!(h["te"], "trailers");
        assert_eq!(h["host"], "svc:80");
        assert_eq!(h["traceparent"], "00-abc-def-01");
        assert_eq!(h["b3"], "80f198ee56343ba8-e457b5a2e4d86bd1-1");
        assert_eq!(h["x-forwarded-proto"], "http");
        let id = h["x-request-id"].to_str().unwrap();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4", "{id}");
    }

    #[test]
    fn an_existing_request_id_is_kept() {
        let mut h = map(&[("x-request-id", "abc"), ("x-forwarded-proto", "https")]);
        prepare_request(&mut h, false);
        assert_eq!(h["x-request-id"], "abc");
        assert_eq!(h["x-forwarded-proto"], "https");
    }

    #[test]
    fn an_upgrade_keeps_its_headers() {
        let mut h = map(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert!(wants_upgrade(&h));
        prepare_request(&mut h, true);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
    }

    #[test]
    fn transfer_encodings_other_than_chunked_are_refused() {
        assert!(check_request(&map(&[("transfer-encoding", "chunked")])).is_ok());
        assert!(check_request(&map(&[("transfer-encoding", "gzip, chunked")])).is_err());
        assert!(check_request(&map(&[
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "chunked")
        ]))
        .is_err());
    }

    #[test]
    fn grpc_timeouts_parse_per_the_spec() {
        let t = |v: &str| grpc_timeout(&map(&[("grpc-timeout", v)]));
        assert_eq!(t("100m"), Some(Duration::from_millis(100)));
        assert_eq!(t("2S"), Some(Duration::from_secs(2)));
        assert_eq!(t("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(t("123456789S"), None);
        assert_eq!(t("m"), None);
        assert_eq!(t("10x"), None);
    }

    #[test]
    fn response_framings_envoys_codec_refuses_are_refused() {
        let framing = |status: u16, lines: &[(&str, &str)]| {
            let mut headers = HeaderMap::new();
            for (k, v) in lines {
                headers.append(
                    http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    HeaderValue::from_str(v).expect("value"),
                );
            }
            let status = http::StatusCode::from_u16(status).expect("status");
            let refused = refused_response_framing(status, &mut headers);
            (refused, headers.len())
        };
        let cl = ("content-length", "2");
        let te = ("transfer-encoding", "chunked");
        assert_eq!(framing(200, &[cl]), (false, 1));
        assert_eq!(framing(200, &[te]), (false, 1));
        assert!(framing(200, &[cl, cl]).0);
        assert!(framing(200, &[cl, te]).0);
        assert!(framing(200, &[("transfer-encoding", "gzip")]).0);
        assert_eq!(
            framing(200, &[("transfer-encoding", "gzip, chunked")]),
            (false, 1)
        );
        assert!(framing(204, &[cl]).0 && framing(204, &[te]).0);
        // What Envoy takes off a bodiless answer.
        assert_eq!(framing(204, &[("content-length", "0")]), (false, 0));
        assert_eq!(framing(304, &[te]), (false, 0));
    }
}
