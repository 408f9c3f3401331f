//! The pod's workload in the CUSTOM authorization tests and the peer's requests to it: what a
//! proxy made of each, as both tests compare them.

use super::*;
use crate::ext_authz::GrpcAuthorizer;
use crate::peer::{self, any_addr};
use crate::service::{peer_program, Service};
use crate::PodNet;
use serde_json::Value;
use std::time::Duration;

const CLIENT_TIME: Duration = Duration::from_secs(10);

/// The workload on each port (HTTP servers, TCP echo servers) and the HTTP authorizer, in
/// `net`'s pod; the gRPC authorizer on 10.1.0.2 in its peer namespace.
pub fn workload(net: &PodNet) -> (Vec<Service>, Vec<peer::Server>, GrpcAuthorizer) {
    crate::sidecars::prepare(net);
    let grpc = GrpcAuthorizer::start(&net.peer, GRPC_AUTHZ.parse().expect("address"));
    let app = peer_program("http_server.py")
        .to_string_lossy()
        .into_owned();
    let authz = peer_program("ext_authz_http.py")
        .to_string_lossy()
        .into_owned();
    let mut services: Vec<Service> = HTTP_PORTS
        .iter()
        .map(|p| Service::start(&net.pod, "python3", &[&app, &p.to_string()], any_addr(*p)))
        .collect();
    services.push(Service::start(
        &net.pod,
        "python3",
        &[&authz, &AUTHZ_PORT.to_string()],
        any_addr(AUTHZ_PORT),
    ));
    let echoes = TCP_PORTS
        .iter()
        .map(|p| peer::Server::echo(&net.pod, any_addr(*p)))
        .collect();
    (services, echoes, grpc)
}

/// What a proxy made of one request: status, the authorizer's header in the answer, the
/// header the workload received from it (from `/headers`), and the body otherwise.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub status: u16,
    pub answer_header: Option<String>,
    pub upstream_header: Option<String>,
    /// The body bytes the gRPC authorizer said it was sent.
    pub checked_bytes: Option<String>,
    /// A gRPC client's status and message (a trailers-only answer's head).
    pub grpc: Option<(String, String)>,
    /// The gRPC authorizer's header for the client, and the path the HTTP authorizer was
    /// asked about (after the gRPC one's query edits), as the workload was told.
    pub response_header: Option<String>,
    pub seen_path: Option<String>,
    pub body: String,
}

/// A request to `path` on `port`, selected by the CUSTOM policy when `select`.
pub fn request(net: &PodNet, port: u16, path: &str, select: bool) -> Outcome {
    post(net, port, path, select, 0)
}

/// The same with a body of `body` bytes (a POST), when not zero.
pub fn post(net: &PodNet, port: u16, path: &str, select: bool, body: usize) -> Outcome {
    post_with(net, port, path, select, body, None)
}

/// The same with a header of the client's own (`name: value`).
pub fn post_with(
    net: &PodNet,
    port: u16,
    path: &str,
    select: bool,
    body: usize,
    header: Option<&str>,
) -> Outcome {
    let url = format!("http://{}:{port}{path}", net.pod_ip);
    let select = if select {
        "x-select: ext"
    } else {
        "x-select: no"
    };
    let data = "a".repeat(body);
    let mut args = vec!["-i", "-H", "x-ext-authz: please", "-H", select, &url];
    if let Some(header) = header {
        args.extend(["-H", header]);
    }
    // HTTP/2 (h2c) to the gRPC authorizer's port, HTTP/1.1 elsewhere; a gRPC client's
    // request on a path under `/grpc`.
    if port == GRPC {
        args.push("--http2-prior-knowledge");
    }
    if path.starts_with("/grpc") {
        args.extend(["-H", "content-type: application/grpc", "-H", "te: trailers"]);
    }
    if body > 0 {
        args.extend(["--data-binary", &data]);
    }
    let out = peer::curl(&net.peer, &args, CLIENT_TIME);
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let answer_header = header("x-ext-authz-check-result");
    let grpc = header("grpc-status").map(|s| (s, header("grpc-message").unwrap_or_default()));
    let json: Option<Value> = serde_json::from_str(body).ok();
    let upstream_header = json
        .as_ref()
        .and_then(|j| j["x-ext-authz-check-result"].as_str().map(str::to_string));
    let response_header = header("x-ext-authz-response");
    let seen_path = json
        .as_ref()
        .and_then(|j| j["x-ext-authz-seen-path"].as_str().map(str::to_string));
    let checked_bytes = json
        .as_ref()
        .and_then(|j| j["x-ext-authz-body-bytes"].as_str().map(str::to_string));
    Outcome {
        status,
        answer_header,
        upstream_header,
        checked_bytes,
        grpc,
        response_header,
        seen_path,
        body: if json.is_some() {
            String::new()
        } else {
            body.to_string()
        },
    }
}
