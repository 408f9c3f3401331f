//! The gRPC authorizer (`grpc_service.envoy_grpc`, istiod's `envoyExtAuthzGrpc`):
//! `envoy.service.auth.v3.Authorization/Check`, one unary call framed by hand on a request
//! through the upstream layer (the cluster's HTTP/2), with envoy-types' messages. The call's
//! own failure (no answer, a gRPC status other than OK) is a failed check; the answer's
//! `status` OK allows with `ok_response`'s header edits, anything else denies with
//! `denied_response`'s status (403 when it names none), headers and body.

use super::call::{call, Answer};
use super::{check_body, CheckInput, Denial, Edits, Verdict};
use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::{
    address, socket_address::PortSpecifier, Address, HeaderValueOption, SocketAddress,
};
use envoy_types::pb::envoy::service::auth::v3::{
    attribute_context::{HttpRequest, Peer, Request as AttrRequest},
    check_response::HttpResponse,
    AttributeContext, CheckRequest, CheckResponse,
};
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use http::{Request, StatusCode};
use prost::Message;
use std::collections::HashMap;
use std::net::SocketAddr;

const CHECK_PATH: &str = "/envoy.service.auth.v3.Authorization/Check";

pub(super) async fn check(input: &CheckInput<'_>, cluster: &str, authority: &str) -> Verdict {
    let message = check_request(input);
    send(input.ctx, &message, (cluster, authority), input.timeout).await
}

/// Call `Check` with `message` on `cluster` (with `authority`), answered within `timeout`.
pub(super) async fn send(
    ctx: &super::ConnContext,
    message: &CheckRequest,
    (cluster, authority): (&str, &str),
    timeout: std::time::Duration,
) -> Verdict {
    let authority = if authority.is_empty() {
        cluster
    } else {
        authority
    };
    let req = match request(message, authority) {
        Ok(req) => req,
        Err(e) => return Verdict::Error(e),
    };
    match call(ctx, cluster, req, timeout).await {
        Ok(answer) => verdict(answer),
        Err(e) => Verdict::Error(e),
    }
}

fn request(
    message: &CheckRequest,
    authority: &str,
) -> Result<Request<super::UpstreamBody>, String> {
    let message = message.encode_to_vec();
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(u32::try_from(message.len()).map_err(|_| "check too large")?);
    framed.put_slice(&message);
    let mut req = Request::new(check_body(framed.freeze()));
    *req.method_mut() = http::Method::POST;
    *req.version_mut() = http::Version::HTTP_2;
    *req.uri_mut() = http::Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(CHECK_PATH)
        .build()
        .map_err(|e| format!("check authority {authority:?}: {e}"))?;
    let h = req.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("te", HeaderValue::from_static("trailers"));
    Ok(req)
}

pub(super) fn peer(address: SocketAddr, principal: Option<&str>) -> Peer {
    Peer {
        address: Some(Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: address.ip().to_string(),
                port_specifier: Some(PortSpecifier::PortValue(u32::from(address.port()))),
                ..Default::default()
            })),
        }),
        principal: principal.unwrap_or_default().to_string(),
        ..Default::default()
    }
}

/// The request's attributes, as Envoy's `CheckRequestUtils` fills them.
pub(super) fn check_request(input: &CheckInput<'_>) -> CheckRequest {
    let (ctx, parts) = (input.ctx, input.parts);
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let host = parts
        .uri
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            parts
                .headers
                .get(HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_default();
    let scheme = if ctx.mesh_peer.is_some() {
        "https"
    } else {
        "http"
    };
    let mut headers: HashMap<String, String> = HashMap::new();
    for (name, value) in &parts.headers {
        if name == HOST {
            continue;
        }
        let value = String::from_utf8_lossy(value.as_bytes());
        headers
            .entry(name.as_str().to_string())
            .and_modify(|v| {
                v.push(',');
                v.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    headers.insert(":authority".into(), host.clone());
    headers.insert(":method".into(), parts.method.as_str().into());
    headers.insert(":path".into(), path.into());
    headers.insert(":scheme".into(), scheme.into());
    let size = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(-1);
    let (mut body, mut raw_body) = (String::new(), Vec::new());
    if let (Some(bytes), Some(settings)) = (input.body, input.settings) {
        let partial = size < 0 || usize::try_from(size).is_ok_and(|s| s > bytes.len());
        headers.insert(
            "x-envoy-auth-partial-body".into(),
            if partial { "true" } else { "false" }.into(),
        );
        if settings.pack_as_bytes {
            raw_body = bytes.to_vec();
        } else {
            body = String::from_utf8_lossy(bytes).into_owned();
        }
    }
    let id = parts
        .headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let protocol = match parts.version {
        http::Version::HTTP_2 => "HTTP/2",
        http::Version::HTTP_10 => "HTTP/1.0",
        _ => "HTTP/1.1",
    };
    let principal = ctx
        .mesh_peer
        .as_ref()
        .and_then(|(peer, _)| peer.spiffe_id.as_ref())
        .map(crate::identity::SpiffeId::as_str);
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| envoy_types::pb::google::protobuf::Timestamp {
            seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
        });
    CheckRequest {
        attributes: Some(AttributeContext {
            source: Some(peer(ctx.peer, principal)),
            // Our own identity, as Envoy names its local certificate's URI SAN.
            destination: Some(peer(
                ctx.key.destination,
                ctx.mesh_peer.as_ref().map(|(_, own)| own.as_str()),
            )),
            request: Some(AttrRequest {
                time,
                http: Some(HttpRequest {
                    id,
                    method: parts.method.as_str().into(),
                    headers,
                    path: path.into(),
                    host,
                    scheme: scheme.into(),
                    size,
                    protocol: protocol.into(),
                    body,
                    raw_body,
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }),
    }
}

pub(super) fn verdict(answer: Answer) -> Verdict {
    let Answer {
        head,
        body,
        trailers,
    } = answer;
    if head.status != StatusCode::OK {
        return Verdict::Error(format!("the authorizer answered HTTP {}", head.status));
    }
    // Trailers, or the head of a trailers-only answer.
    let status = trailers
        .as_ref()
        .and_then(super::super::headers::grpc_status)
        .or_else(|| super::super::headers::grpc_status(&head.headers));
    match status {
        Some(0) => {}
        Some(s) => return Verdict::Error(format!("the check ended with gRPC status {s}")),
        None => return Verdict::Error("the check ended without a gRPC status".into()),
    }
    let response = match decode(&body) {
        Ok(r) => r,
        Err(e) => return Verdict::Error(e),
    };
    let ok = response.status.as_ref().is_none_or(|s| s.code == 0);
    match response.http_response {
        _ if ok => {
            let mut edits = Edits::default();
            if let Some(HttpResponse::OkResponse(r)) = response.http_response {
                for option in &r.headers {
                    edits.push(option);
                }
                edits.remove.extend(
                    r.headers_to_remove
                        .iter()
                        .filter_map(|n| HeaderName::try_from(n.as_str()).ok()),
                );
                edits.query_set = r
                    .query_parameters_to_set
                    .iter()
                    .map(|q| (q.key.clone(), q.value.clone()))
                    .collect();
                edits.query_remove = r.query_parameters_to_remove.clone();
                for option in &r.response_headers_to_add {
                    edits.push_response(option);
                }
            }
            Verdict::Ok(edits)
        }
        Some(HttpResponse::DeniedResponse(d)) => Verdict::Denied(Denial {
            status: d
                .status
                .and_then(|s| u16::try_from(s.code).ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .filter(|c| c.as_u16() >= 200)
                .unwrap_or(StatusCode::FORBIDDEN),
            headers: d.headers.iter().filter_map(header).collect(),
            body: Bytes::from(d.body),
        }),
        Some(HttpResponse::ErrorResponse(_)) => {
            Verdict::Error("the authorizer answered an error response".into())
        }
        _ => Verdict::Denied(Denial {
            status: StatusCode::FORBIDDEN,
            headers: Vec::new(),
            body: Bytes::new(),
        }),
    }
}

/// The one message of a unary answer (uncompressed: the call asks for no compression).
fn decode(body: &[u8]) -> Result<CheckResponse, String> {
    let [flag, a, b, c, d, rest @ ..] = body else {
        return Err("the answer has no message".into());
    };
    if *flag != 0 {
        return Err("a compressed answer (none was asked for)".into());
    }
    let len = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
    let message = rest.get(..len).ok_or("the answer's message is cut short")?;
    CheckResponse::decode(message).map_err(|e| format!("the answer does not decode: {e}"))
}

fn header(option: &HeaderValueOption) -> Option<(HeaderName, HeaderValue)> {
    let h = option.header.as_ref()?;
    let name = HeaderName::try_from(h.key.as_str()).ok()?;
    let value = if h.raw_value.is_empty() {
        HeaderValue::try_from(h.value.as_str()).ok()?
    } else {
        HeaderValue::from_bytes(&h.raw_value).ok()?
    };
    Some((name, value))
}

impl Edits {
    /// One of `ok_response.headers` (or a denial's): added beside the request's values with
    /// `append: true`, else replacing them (Envoy reads no `append_action` here).
    #[allow(deprecated)]
    fn push(&mut self, option: &HeaderValueOption) {
        let Some(h) = header(option) else {
            return;
        };
        if option.append.as_ref().is_some_and(|b| b.value) {
            self.append.push(h);
        } else {
            self.set.push(h);
        }
    }

    /// One of `response_headers_to_add`: `append` when set, else its `append_action`
    /// (appending by default).
    #[allow(deprecated)]
    fn push_response(&mut self, option: &HeaderValueOption) {
        let Some(h) = header(option) else {
            return;
        };
        let r = &mut self.response;
        match (
            option.append.as_ref().map(|b| b.value),
            option.append_action,
        ) {
            (Some(true), _) | (None, 0) => r.append.push(h),
            (Some(false), _) | (None, 2) => r.set.push(h),
            (None, 1) => r.if_absent.push(h),
            (None, _) => r.if_present.push(h),
        }
    }
}
