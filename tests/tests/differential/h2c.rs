//! HTTP/2 in the clear from the application, through both proxies: the same answers.

use super::differential::{HTTP_VIP, WEB};
use super::{worlds, World};
use remora_e2e::envoy_xds::nets_or_skip;
use remora_e2e::peer;
use serde_json::Value;
use std::time::Duration;

/// HTTP/2 in the clear (prior knowledge) from the application, to clusters that say nothing of
/// the upstream protocol (Envoy's default: HTTP/1.1 upstream).
#[test]
fn h2c_has_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = worlds(&nets, &binary);
    let h2c = |w: &World, host: &str, path: &str, headers: &[&str]| {
        let url = format!("http://{HTTP_VIP}{path}");
        let host = format!("Host: {host}");
        let mut args = vec!["--http2-prior-knowledge", "-H", &host];
        for h in headers {
            args.extend(["-H", h]);
        }
        // The gRPC status of a trailers-only answer, when there is one.
        args.extend([
            "-w",
            "\n%{http_code} %{redirect_url} %header{grpc-status}",
            &url,
        ]);
        let out = peer::curl(&w.net.pod, &args, Duration::from_secs(10));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
        let echoed: Option<Value> = serde_json::from_str(body).ok();
        let answered = echoed
            .map(|e| format!("{} {}", e["backend"], e["path"]))
            .unwrap_or_else(|| body.to_string());
        format!("{status} {answered}")
    };
    let mut differences = Vec::new();
    let grpc_abort: &[&str] = &["x-case: abort", "content-type: application/grpc"];
    for (host, path, headers) in [
        (WEB, "/", &[][..]),
        (WEB, "/exact", &[]),
        (WEB, "/teapot", &[]),
        (WEB, "/old?keep=1", &[]),
        ("nowhere.test", "/", &[]),
        (WEB, "/no-endpoint", &[]),
        // A fault's abort, to an HTTP/2 client and to a gRPC one (trailers-only).
        (WEB, "/flaky/ok/h2", &["x-case: abort"]),
        (WEB, "/flaky/ok/h2-grpc", grpc_abort),
        (
            WEB,
            "/flaky/ok/h2-grpc-status",
            &["x-case: abort-grpc", "content-type: application/grpc"],
        ),
    ] {
        let (e, r) = (
            h2c(&envoy, host, path, headers),
            h2c(&remora, host, path, headers),
        );
        // What the fault's answers must be, so that agreeing on a failure cannot pass.
        let want = match path {
            "/flaky/ok/h2" => Some(("503 ", "fault filter abort")),
            "/flaky/ok/h2-grpc" | "/flaky/ok/h2-grpc-status" => Some(("200 ", " 14")),
            _ => None,
        };
        if let Some((status, part)) = want {
            if !(r.starts_with(status) && r.contains(part)) {
                differences.push(format!("h2c {path}: remora answered {r:?}"));
            }
        }
        if e != r {
            differences.push(format!(
                "h2c Host {host} {path} {headers:?}\n  envoy:  {e}\n  remora: {r}"
            ));
        }
    }
    assert!(
        differences.is_empty(),
        "{}\n{}",
        differences.join("\n"),
        remora.proxy.diagnostics()
    );
}
