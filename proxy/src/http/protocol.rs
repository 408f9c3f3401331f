//! The HTTP version a request routed by xDS takes upstream, as the cluster's
//! `HttpProtocolOptions` say (HTTP/1.1 without them, HTTP/2 when explicit, or the downstream
//! request's own with `use_downstream_protocol_config`), and the request rewritten for it:
//! HTTP/2 carries the target's authority in `:authority` where HTTP/1.1 carries a `Host`
//! header and an origin-form target.

use crate::detect::HttpVersion;
use crate::tls;
use http::header::{HeaderValue, HOST};
use http::{Request, Uri, Version};
use remora_xds::model::cluster::UpstreamHttpProtocol;

/// The upstream version for a request that came as `downstream`. An HTTP/1.1 upgrade
/// (WebSocket) stays HTTP/1.1: over HTTP/2 it would need extended CONNECT.
pub fn upstream_version(
    cluster: UpstreamHttpProtocol,
    downstream: HttpVersion,
    upgrade: bool,
) -> HttpVersion {
    match cluster {
        _ if upgrade => HttpVersion::Http1,
        UpstreamHttpProtocol::Http1 => HttpVersion::Http1,
        UpstreamHttpProtocol::Http2 => HttpVersion::Http2,
        UpstreamHttpProtocol::Downstream => downstream,
    }
}

/// Rewrite `req` for an upstream connection speaking `to`.
pub fn translate<B>(req: &mut Request<B>, to: HttpVersion) {
    match (to, req.version()) {
        (HttpVersion::Http2, Version::HTTP_2) => {}
        (HttpVersion::Http2, _) => to_http2(req),
        (HttpVersion::Http1, Version::HTTP_2) => to_http1(req),
        (HttpVersion::Http1, _) => {}
    }
}

/// HTTP/1.x to HTTP/2: an absolute target whose authority is the Host, which HTTP/2 sends as
/// `:authority` instead of a header (RFC 9113 §8.3.1).
fn to_http2<B>(req: &mut Request<B>) {
    *req.version_mut() = Version::HTTP_2;
    if req.method() == http::Method::CONNECT || req.uri().authority().is_some() {
        req.headers_mut().remove(HOST);
        return;
    }
    let Some(host) = req.headers().get(HOST).and_then(|h| h.to_str().ok()) else {
        return;
    };
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let absolute = Uri::builder()
        .scheme("http")
        .authority(host)
        .path_and_query(path)
        .build();
    if let Ok(uri) = absolute {
        *req.uri_mut() = uri;
        req.headers_mut().remove(HOST);
    }
}

/// HTTP/2 to HTTP/1.1: `:authority` becomes the Host header and the target origin-form
/// (RFC 9112 §3.2), as Envoy sends it.
fn to_http1<B>(req: &mut Request<B>) {
    *req.version_mut() = Version::HTTP_11;
    if req.method() == http::Method::CONNECT {
        return;
    }
    if let Some(authority) = req.uri().authority() {
        if !req.headers().contains_key(HOST) {
            if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
                req.headers_mut().insert(HOST, host);
            }
        }
    }
    let origin = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse::<Uri>();
    if let Ok(origin) = origin {
        *req.uri_mut() = origin;
    }
    join_cookies(req.headers_mut());
}

/// HTTP/2 clients send each cookie as a field of its own for HPACK's sake; HTTP/1.1 allows one
/// `Cookie` line, so the crumbs are joined with "; " (RFC 9113 §8.2.3, as Envoy's codec does).
/// Origins that keep the last of several cookie lines would otherwise lose the others. The
/// header limits were applied to the crumbs already (each one counted, with its bytes).
fn join_cookies(headers: &mut http::HeaderMap) {
    let mut crumbs = headers.get_all(http::header::COOKIE).iter();
    if crumbs.nth(1).is_none() {
        return;
    }
    let mut joined = Vec::new();
    for crumb in headers.get_all(http::header::COOKIE) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(crumb.as_bytes());
    }
    // Each crumb was a valid value, and "; " is too: the join cannot fail.
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(http::header::COOKIE, value);
    }
}

/// The ALPN offered inside Istio mTLS for a request going upstream as `version`: istiod's
/// `istio.alpn` filter's list for that protocol, which the converter accepts only as istiod
/// writes it.
pub fn mesh_alpn(version: Version) -> [&'static [u8]; 3] {
    match version {
        Version::HTTP_2 => [tls::ALPN_H2, tls::ALPN_ISTIO, b"h2"],
        Version::HTTP_10 => [tls::ALPN_HTTP10, tls::ALPN_ISTIO, b"http/1.0"],
        _ => [tls::ALPN_HTTP11, tls::ALPN_ISTIO, b"http/1.1"],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clusters_protocol_decides_the_version() {
        use HttpVersion::{Http1, Http2};
        use UpstreamHttpProtocol as P;
        assert_eq!(upstream_version(P::Http1, Http2, false), Http1);
        assert_eq!(upstream_version(P::Http2, Http1, false), Http2);
        assert_eq!(upstream_version(P::Downstream, Http2, false), Http2);
        assert_eq!(upstream_version(P::Downstream, Http1, false), Http1);
        assert_eq!(upstream_version(P::Http2, Http1, true), Http1);
    }

    #[test]
    fn http1_to_http2_moves_host_into_the_authority() {
        let mut req = Request::builder()
            .uri("/svc.Greeter/Hello?x=1")
            .header("host", "greeter:50051")
            .header("te", "trailers")
            .body(())
            .expect("request");
        translate(&mut req, HttpVersion::Http2);
        assert_eq!(req.version(), Version::HTTP_2);
        assert_eq!(req.uri(), "http://greeter:50051/svc.Greeter/Hello?x=1");
        assert!(req.headers().get(HOST).is_none());
        assert_eq!(req.headers()["te"], "trailers");
    }

    #[test]
    fn http2_to_http1_joins_cookie_crumbs_into_one_line() {
        let mut req = Request::builder()
            .version(Version::HTTP_2)
            .uri("http://reviews:9080/")
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .header("cookie", "c=3")
            .body(())
            .expect("request");
        translate(&mut req, HttpVersion::Http1);
        let cookies: Vec<_> = req.headers().get_all("cookie").iter().collect();
        assert_eq!(cookies, ["a=1; b=2; c=3"]);
    }

    #[test]
    fn http2_to_http1_gives_host_and_origin_form() {
        let mut req = Request::builder()
            .version(Version::HTTP_2)
            .uri("http://reviews:9080/r/1?a=b")
            .body(())
            .expect("request");
        translate(&mut req, HttpVersion::Http1);
        assert_eq!(req.version(), Version::HTTP_11);
        assert_eq!(req.uri(), "/r/1?a=b");
        assert_eq!(req.headers()[HOST], "reviews:9080");
        // Same version: untouched.
        let mut same = Request::builder()
            .uri("/x")
            .header("host", "h")
            .body(())
            .expect("request");
        translate(&mut same, HttpVersion::Http1);
        assert_eq!(same.uri(), "/x");
        assert_eq!(same.headers()[HOST], "h");
    }
}
