//! The HTTP authorizer (`http_service`, istiod's `envoyExtAuthzHttp`): the client's method,
//! `path_prefix` + its path, its `authorization` and `host` and the allowed headers, and the
//! body read ahead (else none); a 200 allows (the allowed upstream headers set on the request,
//! `x-envoy-auth-headers-to-remove` removed from it), a 5xx is a failed check, anything else
//! denies with its status, body and allowed client headers.

use super::call::{call, Answer};
use super::{check_body, CheckInput, Denial, Edits, Verdict};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, HOST};
use http::{Request, StatusCode};
use remora_xds::model::ext_authz::HttpService;
use remora_xds::model::matcher::StringMatcher;

/// The authorizer's list of request headers to take out before the request goes upstream.
static HEADERS_TO_REMOVE: HeaderName = HeaderName::from_static("x-envoy-auth-headers-to-remove");

pub(super) async fn check(input: &CheckInput<'_>, s: &HttpService) -> Verdict {
    let req = match request(input, s) {
        Ok(req) => req,
        Err(e) => return Verdict::Error(e),
    };
    match call(input.ctx, &s.cluster, req, input.timeout).await {
        Ok(answer) => verdict(answer, s),
        Err(e) => Verdict::Error(e),
    }
}

/// The check request, as Envoy's raw HTTP client writes it.
fn request(
    input: &CheckInput<'_>,
    s: &HttpService,
) -> Result<Request<super::UpstreamBody>, String> {
    let parts = input.parts;
    let body = input.body.map(Bytes::copy_from_slice).unwrap_or_default();
    let length = body.len();
    let mut req = Request::new(check_body(body));
    *req.method_mut() = parts.method.clone();
    *req.version_mut() = http::Version::HTTP_11;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    *req.uri_mut() = format!("{}{path}", s.path_prefix)
        .parse()
        .map_err(|e| format!("check path: {e}"))?;
    let headers = req.headers_mut();
    headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
    let host = parts
        .uri
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        .or_else(|| parts.headers.get(HOST).cloned());
    if let Some(host) = host {
        headers.insert(HOST, host);
    }
    for (name, value) in &parts.headers {
        if name == HOST || name == CONTENT_LENGTH {
            continue;
        }
        if name == http::header::AUTHORIZATION || any(&s.allowed_headers, name) {
            headers.append(name.clone(), value.clone());
        }
    }
    Ok(req)
}

fn any(matchers: &[StringMatcher], name: &HeaderName) -> bool {
    matchers.iter().any(|m| m.matches(name.as_str()))
}

pub(super) fn verdict(answer: Answer, s: &HttpService) -> Verdict {
    let Answer { head, body, .. } = answer;
    let status = head.status;
    if status.is_server_error() {
        return Verdict::Error(format!("the authorizer answered {status}"));
    }
    if status == StatusCode::OK {
        let mut edits = Edits::default();
        for value in head.headers.get_all(&HEADERS_TO_REMOVE) {
            let names = value.to_str().unwrap_or_default().split(',');
            edits.remove.extend(
                names
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .filter_map(|n| HeaderName::try_from(n).ok()),
            );
        }
        for (name, value) in &head.headers {
            if name != HEADERS_TO_REMOVE && any(&s.allowed_upstream_headers, name) {
                edits.set.push((name.clone(), value.clone()));
            }
        }
        return Verdict::Ok(edits);
    }
    // Without a list, every header of the answer but Host; with one, those and the ones
    // Envoy always adds.
    let to_client = |name: &HeaderName| {
        if s.allowed_client_headers.is_empty() {
            name != HOST
        } else {
            any(&s.allowed_client_headers, name)
                || matches!(
                    name.as_str(),
                    "content-length" | "www-authenticate" | "location"
                )
        }
    };
    let headers = head
        .headers
        .iter()
        .filter(|(name, _)| *name != HEADERS_TO_REMOVE && to_client(name))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    Verdict::Denied(Denial {
        status,
        headers,
        body,
    })
}
