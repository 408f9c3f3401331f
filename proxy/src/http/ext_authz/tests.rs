use super::*;
use remora_xds::model::ext_authz::HttpService;
use remora_xds::model::matcher::StringMatcher;

fn service(upstream: &[&str], client: &[&str]) -> HttpService {
    HttpService {
        cluster: "outbound|8000||ext-authz".into(),
        uri: "http://ext-authz".into(),
        path_prefix: "/check".into(),
        allowed_headers: vec![StringMatcher::exact("x-ext-authz")],
        allowed_upstream_headers: upstream.iter().map(|h| StringMatcher::exact(h)).collect(),
        allowed_client_headers: client.iter().map(|h| StringMatcher::exact(h)).collect(),
    }
}

fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> call::Answer {
    let mut response = http::Response::builder().status(status);
    for (k, v) in headers {
        response = response.header(*k, *v);
    }
    let (head, ()) = response.body(()).expect("response").into_parts();
    call::Answer {
        head,
        body: Bytes::from(body.to_string()),
        trailers: None,
    }
}

fn named(v: &[(HeaderName, HeaderValue)]) -> Vec<(&str, &str)> {
    v.iter()
        .map(|(n, v)| (n.as_str(), v.to_str().unwrap_or("?")))
        .collect()
}

#[test]
fn an_http_200_allows_with_the_allowed_upstream_headers_and_removals() {
    let s = service(&["x-ext-authz-check-result"], &[]);
    let a = answer(
        200,
        &[
            ("x-ext-authz-check-result", "allowed"),
            ("x-other", "not for the upstream"),
            ("x-envoy-auth-headers-to-remove", "cookie, x-secret"),
        ],
        "",
    );
    let Verdict::Ok(edits) = http_service::verdict(a, &s) else {
        panic!("allowed")
    };
    assert_eq!(named(&edits.set), [("x-ext-authz-check-result", "allowed")]);
    assert_eq!(edits.remove, ["cookie", "x-secret"]);
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "x-ext-authz-check-result",
        HeaderValue::from_static("forged"),
    );
    headers.insert("cookie", HeaderValue::from_static("c"));
    headers.insert("x-kept", HeaderValue::from_static("k"));
    edits.apply(&mut headers);
    assert_eq!(headers["x-ext-authz-check-result"], "allowed");
    assert_eq!(
        headers.get_all("x-ext-authz-check-result").iter().count(),
        1
    );
    assert!(!headers.contains_key("cookie"));
    assert_eq!(headers["x-kept"], "k");
}

#[test]
fn an_http_denial_passes_its_status_body_and_client_headers() {
    let all = service(&[], &[]);
    let a = answer(
        401,
        &[
            ("www-authenticate", "Basic"),
            ("x-why", "no"),
            ("host", "authz"),
        ],
        "go away",
    );
    let Verdict::Denied(d) = http_service::verdict(a, &all) else {
        panic!("denied")
    };
    assert_eq!((d.status.as_u16(), &d.body[..]), (401, &b"go away"[..]));
    // No list: every header but Host.
    assert_eq!(
        named(&d.headers),
        [("www-authenticate", "Basic"), ("x-why", "no")]
    );
    let listed = service(&[], &["x-ext-authz-check-result"]);
    let a = answer(
        403,
        &[
            ("x-ext-authz-check-result", "denied"),
            ("x-why", "no"),
            ("location", "/login"),
        ],
        "",
    );
    let Verdict::Denied(d) = http_service::verdict(a, &listed) else {
        panic!("denied")
    };
    // A list: those, and the ones Envoy always passes.
    assert_eq!(
        named(&d.headers),
        [
            ("x-ext-authz-check-result", "denied"),
            ("location", "/login")
        ]
    );
    // A 5xx is the authorizer failing, not a denial.
    assert!(matches!(
        http_service::verdict(answer(503, &[], "busy"), &listed),
        Verdict::Error(_)
    ));
}

fn grpc_answer(
    message: &envoy_types::pb::envoy::service::auth::v3::CheckResponse,
    status: &str,
) -> call::Answer {
    use prost::Message;
    let bytes = message.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    framed.extend_from_slice(&bytes);
    let mut trailers = http::HeaderMap::new();
    trailers.insert(
        "grpc-status",
        HeaderValue::from_str(status).expect("status"),
    );
    call::Answer {
        trailers: Some(trailers),
        body: Bytes::from(framed),
        ..answer(200, &[("content-type", "application/grpc")], "")
    }
}

#[test]
fn a_grpc_check_allows_denies_or_fails() {
    use envoy_types::pb::envoy::config::core::v3::{HeaderValue as Hv, HeaderValueOption};
    use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
    use envoy_types::pb::envoy::service::auth::v3::{
        CheckResponse, DeniedHttpResponse, OkHttpResponse,
    };
    use envoy_types::pb::google::rpc::Status;
    let option = |k: &str, v: &str, append: Option<bool>| HeaderValueOption {
        header: Some(Hv {
            key: k.into(),
            value: v.into(),
            ..Default::default()
        }),
        #[allow(deprecated)]
        append: append.map(|value| envoy_types::pb::google::protobuf::BoolValue { value }),
        ..Default::default()
    };
    let ok = CheckResponse {
        status: Some(Status::default()),
        http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
            headers: vec![option("x-a", "1", None), option("x-b", "2", Some(true))],
            headers_to_remove: vec!["x-gone".into()],
            response_headers_to_add: vec![
                option("x-r", "1", None),
                option("x-s", "2", Some(false)),
            ],
            query_parameters_to_set: vec![
                envoy_types::pb::envoy::config::core::v3::QueryParameter {
                    key: "k".into(),
                    value: "v w".into(),
                },
            ],
            query_parameters_to_remove: vec!["gone".into()],
            ..Default::default()
        })),
        ..Default::default()
    };
    let Verdict::Ok(edits) = grpc::verdict(grpc_answer(&ok, "0")) else {
        panic!("allowed")
    };
    assert_eq!(named(&edits.set), [("x-a", "1")]);
    assert_eq!(named(&edits.append), [("x-b", "2")]);
    assert_eq!(edits.remove, ["x-gone"]);
    // The response's: appended by default, replaced with `append: false`.
    assert_eq!(named(&edits.response.append), [("x-r", "1")]);
    assert_eq!(named(&edits.response.set), [("x-s", "2")]);
    // The query: rewritten in key order, as Envoy's parameter map writes it.
    let (mut parts, ()) = http::Request::get("/p?z=1&gone=x&a=2")
        .body(())
        .expect("request")
        .into_parts();
    let response = edits.apply_to(&mut parts);
    assert_eq!(parts.uri, "/p?a=2&k=v+w&z=1");
    assert_eq!(parts.headers["x-a"], "1");
    let mut answer = http::HeaderMap::new();
    answer.insert("x-r", HeaderValue::from_static("0"));
    answer.insert("x-s", HeaderValue::from_static("0"));
    response.apply(&mut answer);
    assert_eq!(answer.get_all("x-r").iter().count(), 2);
    assert_eq!(answer["x-s"], "2");
    let denied = CheckResponse {
        status: Some(Status {
            code: 7,
            ..Default::default()
        }),
        http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
            status: None,
            headers: vec![option("x-why", "policy", None)],
            body: "no".into(),
        })),
        ..Default::default()
    };
    let Verdict::Denied(d) = grpc::verdict(grpc_answer(&denied, "0")) else {
        panic!("denied")
    };
    // No status in the denial: Envoy's 403.
    assert_eq!((d.status.as_u16(), &d.body[..]), (403, &b"no"[..]));
    assert_eq!(named(&d.headers), [("x-why", "policy")]);
    // The call itself failing (UNAVAILABLE) is a failed check, whatever the message says.
    assert!(matches!(
        grpc::verdict(grpc_answer(&ok, "14")),
        Verdict::Error(_)
    ));
    let cut = call::Answer {
        body: Bytes::from_static(&[0, 0, 0, 0, 9, 1]),
        ..grpc_answer(&ok, "0")
    };
    assert!(matches!(grpc::verdict(cut), Verdict::Error(_)));
}

#[test]
fn a_denial_reaches_a_grpc_client_as_its_grpc_status() {
    assert_eq!(grpc_status(StatusCode::FORBIDDEN), 7);
    assert_eq!(grpc_status(StatusCode::UNAUTHORIZED), 16);
    assert_eq!(grpc_status(StatusCode::SERVICE_UNAVAILABLE), 14);
    assert_eq!(grpc_status(StatusCode::IM_A_TEAPOT), 2);
    assert_eq!(
        grpc_message(b"denied by ext_authz\n"),
        "denied by ext_authz%0A"
    );
    assert_eq!(grpc_message("100% é".as_bytes()), "100%25 %C3%A9");
}
