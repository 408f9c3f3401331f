//! Istio authorization policy files (`remora::authz::load::build`, what a user or istiod's
//! config puts in the policy directory): any text becomes a policy set or an error naming the
//! field, never a panic; a set that builds decides an HTTP request and a TCP connection.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora::authz::compile::Context;
use remora::authz::load::{build, Workload};
use remora::authz::{Attributes, Request};
use std::net::SocketAddr;
use std::path::PathBuf;

fuzz_target!(|data: &[u8]| {
    let files = vec![(PathBuf::from("policy.yaml"), data.to_vec())];
    let ctx = Context {
        trust_domains: vec!["cluster.local".into(), "td.example".into()],
    };
    let workload = Workload {
        namespace: Some("server".into()),
        labels: [("app".to_string(), "httpbin".to_string())].into(),
    };
    let Ok(built) = build(&files, &ctx, &workload, "istio-system") else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    headers.insert("x-token", http::HeaderValue::from_static("admin"));
    headers.insert(
        "x-forwarded-for",
        http::HeaderValue::from_static("10.9.9.9"),
    );
    let source: SocketAddr = ([10, 1, 0, 5], 40000).into();
    let destination: SocketAddr = ([10, 1, 0, 9], 8080).into();
    let request = Attributes {
        source,
        destination,
        principal: Some("spiffe://cluster.local/ns/client/sa/sleep"),
        peer: None,
        sni: Some("httpbin.server.svc.cluster.local"),
        request: Some(Request {
            method: "GET",
            path: "/admin/users",
            query: Some("a=1"),
            host: Some("httpbin.server:8080"),
            headers: &headers,
        }),
    };
    let _ = built.set.evaluate(&request).allowed();
    let connection = Attributes {
        source,
        destination,
        principal: None,
        peer: None,
        sni: None,
        request: None,
    };
    let _ = built.set.evaluate(&connection).allowed();
});
