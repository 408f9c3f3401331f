//! Istio authorization end to end: two pods in mutual TLS (the client's requests cross its own
//! sidecar), `AuthorizationPolicy` files in a directory the server's sidecar reads. HTTP
//! requests are allowed or answered `403 RBAC: access denied`, path tricks do not bypass a DENY
//! rule, TCP connections are allowed or closed, other identities and plaintext clients are
//! refused, a changed directory is reloaded and a broken file refused.

use remora_e2e::certs::MeshCa;
use remora_e2e::mesh::{
    as_proxy_user, client_config, has_openssl, s_client_as_proxy_user, server_config, two_pods,
    SERVER_ID,
};
use remora_e2e::peer::{self, Server};
use remora_e2e::process::run_bounded;
use remora_e2e::{Netns, PodNet, Remora};
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Another workload of the mesh, which the policies do not name.
const INTRUDER_ID: &str = "spiffe://cluster.local/ns/other/sa/intruder";
/// Bound on one client exchange.
const CLIENT_TIME: Duration = Duration::from_secs(20);
/// Bound on a counter (or a policy reload) catching up.
const METRICS_TIME: Duration = Duration::from_secs(10);
const HTTP_PORT: u16 = 8080;
const TCP_ALLOWED: u16 = 9000;
const TCP_OTHER: u16 = 9001;
const DENIED: &str = "RBAC: access denied";

/// A policy in the server's namespace; `spec` is indented under `spec:`.
fn policy(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: {name}\n  \
         namespace: server\nspec:\n{spec}"
    )
}

const ALLOW_CLIENT_PUBLIC: &str = "  selector:\n    matchLabels:\n      app: httpbin\n  \
    action: ALLOW\n  rules:\n  - from:\n    - source:\n        principals: \
    [\"cluster.local/ns/client/sa/sleep\"]\n    to:\n    - operation:\n        paths: [\"/public*\"]\n";

const DENY_ADMIN: &str = "  action: DENY\n  rules:\n  - to:\n    - operation:\n        \
    paths: [\"/admin\"]\n";

const ALLOW_CLIENT_PORT: &str = "  rules:\n  - from:\n    - source:\n        principals: \
    [\"cluster.local/ns/client/sa/sleep\"]\n    to:\n    - operation:\n        ports: [\"9000\"]\n";

/// Write `contents` as `dir/name`, readable by the sidecar.
fn put(dir: &Path, name: &str, contents: &str) {
    let path = dir.join(name);
    let mut file = std::fs::File::create(&path).expect("create a policy file");
    file.write_all(contents.as_bytes())
        .expect("write a policy file");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
}

/// The server pod's sidecar: its certificate, PERMISSIVE, policies from `policies`, and the
/// pod's namespace and labels as Istio's injector hands them over. The policy directory is
/// polled only once a minute: each change below is seen within METRICS_TIME because it is
/// watched.
fn start_server<'a>(net: &'a PodNet, cert_dir: &Path, policies: &Path) -> Remora<'a> {
    let config = format!(
        "{}authorization:\n  policy_dir: {}\n  watch_interval: 60s\n",
        server_config(cert_dir, "permissive"),
        policies.display()
    );
    let labels = net
        .binary()
        .write_file("labels", "app=\"httpbin\"\nversion=\"v1\"\n");
    net.remora()
        .config(&config)
        .env("POD_NAMESPACE", "server")
        .arg("--pod-labels-file")
        .arg(labels)
        .start_ready()
}

/// An HTTP server in the pod that answers every request with the request target it received.
fn path_echo(ns: &Netns) -> Server {
    Server::start(ns, peer::any_addr(HTTP_PORT), |mut stream| {
        let head = peer::read_request_head(&mut stream)?;
        let head = String::from_utf8_lossy(&head);
        let target = head.split_whitespace().nth(1).unwrap_or("?");
        let body = format!("path={target}");
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(response.as_bytes())
    })
}

fn decisions(remora: &Remora, protocol: &str, action: &str, result: &str) -> f64 {
    remora.metrics().value(
        "remora_authorization_decisions_total",
        &[
            ("protocol", protocol),
            ("action", action),
            ("result", result),
        ],
    )
}

fn reloads(remora: &Remora, result: &str) -> f64 {
    remora.metrics().value(
        "remora_authorization_policy_reloads_total",
        &[("result", result)],
    )
}

#[test]
fn http_requests_are_allowed_or_denied_as_the_policies_say() {
    if !has_openssl() {
        return;
    }
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let (server_dir, client_dir) = two_pods(&net, &ca);
    let intruder = net.binary().make_dir("intruder-certs");
    ca.install(&intruder, &ca.workload(INTRUDER_ID));
    let policies = net.binary().make_dir("policies");
    put(
        &policies,
        "policy.yaml",
        &policy("public", ALLOW_CLIENT_PUBLIC),
    );
    let server = start_server(&net, &server_dir, &policies);
    let _client = net
        .peer_remora()
        .config(&client_config(&client_dir, net.pod_ip, SERVER_ID))
        .start_ready();
    let _app = path_echo(&net.pod);
    let url = |path: &str| format!("http://{}{path}", net.pod_addr(HTTP_PORT));
    // Through the client's sidecar: mutual TLS with the client's identity.
    let get = |path: &str| peer::curl_status(&net.peer, &["--path-as-is", &url(path)], CLIENT_TIME);

    // ALLOW the client's identity on /public*: the rest is denied with Envoy's answer.
    assert_eq!(
        get("/public/a"),
        (200, "path=/public/a".into()),
        "{}",
        server.stderr()
    );
    assert_eq!(get("/admin"), (403, DENIED.into()));
    assert_eq!(get("/public/../admin"), (403, DENIED.into()));

    // Another identity of the mesh, straight to the server's sidecar.
    let file = |f: &str| intruder.join(f).to_string_lossy().into_owned();
    let request = b"GET /public/a HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n";
    let out = s_client_as_proxy_user(
        &net.peer,
        net.pod_addr(HTTP_PORT),
        &[
            "-alpn",
            "istio-http/1.1,istio",
            "-cert",
            &file("cert-chain.pem"),
            "-key",
            &file("key.pem"),
        ],
        request,
    );
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        answer.contains("HTTP/1.1 403") && answer.contains(DENIED),
        "another identity was not refused: {answer}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A plaintext client (PERMISSIVE lets it in) has no identity: refused.
    let mut curl = as_proxy_user(&net.peer);
    curl.args([
        "curl",
        "-sS",
        "--max-time",
        "10",
        "-w",
        "\n%{http_code}",
        &url("/public/a"),
    ]);
    let out = run_bounded(&mut curl, CLIENT_TIME).expect("plaintext curl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text,
        format!("{DENIED}\n403"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    server.wait_for_metrics("HTTP decisions counted", METRICS_TIME, |m| {
        let d = |action, result| {
            m.value(
                "remora_authorization_decisions_total",
                &[("protocol", "http"), ("action", action), ("result", result)],
            )
        };
        d("allow", "allowed") >= 1.0 && d("allow", "denied") >= 4.0
    });
    let m = server.metrics();
    assert!(
        m.value(
            "istio_requests_total",
            &[("reporter", "destination"), ("response_code", "403")]
        ) >= 4.0,
        "{m}"
    );
    // Under Istio's tags: the prefix in the name (no `;` after it), the result a label.
    let rbac_denied = [("authz_enforce_result", "denied")];
    assert!(
        m.value("envoy_http_inbound_0_0_0_0_15006_rbac", &rbac_denied) >= 4.0,
        "{m}"
    );

    // The directory changes: DENY /admin only. Path tricks do not get around it, and the
    // application receives the normalised path.
    put(&policies, "policy.yaml", &policy("no-admin", DENY_ADMIN));
    server.wait_for_metrics("policies reloaded", METRICS_TIME, |m| {
        m.value(
            "remora_authorization_policy_reloads_total",
            &[("result", "success")],
        ) >= 2.0
    });
    for path in [
        "/admin",
        "/./admin",
        "/%2e/admin",
        "/%2E/admin",
        "/x/../admin",
        "/admin?a=b",
    ] {
        assert_eq!(get(path), (403, DENIED.into()), "{path}");
    }
    assert_eq!(
        get("/public/x/../other"),
        (200, "path=/public/other".into())
    );
    assert_eq!(get("/%61dmin2"), (200, "path=/admin2".into()));
    assert!(decisions(&server, "http", "deny", "denied") >= 6.0);

    // A broken file is refused, named with its line, and the running policies stay.
    put(
        &policies,
        "broken.yaml",
        &policy(
            "broken",
            "  action: DENY\n  rules:\n  - to:\n    - operation:\n        ports: [\"http\"]\n",
        ),
    );
    server.wait_for_metrics("broken policy refused", METRICS_TIME, |m| {
        m.value(
            "remora_authorization_policy_reloads_total",
            &[("result", "failure")],
        ) >= 1.0
    });
    assert_eq!(get("/admin").0, 403);
    assert_eq!(get("/other").0, 200);
    let logs = server.stderr();
    assert!(logs.contains("broken.yaml:11"), "{logs}");
    assert_eq!(reloads(&server, "success"), 2.0);
}

/// Send a line from `ns` as UID 1337 (past the pod's own sidecar) to `addr`, half-close, and
/// return what came back.
fn plaintext_exchange(ns: &Netns, addr: SocketAddr) -> String {
    let script = "import socket,sys\n\
        s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=5)\n\
        s.sendall(b'plaintext hello')\n\
        s.shutdown(socket.SHUT_WR)\n\
        out=b''\n\
        try:\n    \
            while True:\n        \
                b=s.recv(65536)\n        \
                if not b: break\n        \
                out+=b\n\
        except OSError: pass\n\
        sys.stdout.write(out.decode())\n";
    // The system's interpreter: one in root's home (pyenv) is out of UID 1337's reach.
    let python = match Path::new("/usr/bin/python3").exists() {
        true => "/usr/bin/python3",
        false => "python3",
    };
    let mut cmd = as_proxy_user(ns);
    cmd.args([
        python,
        "-c",
        script,
        &addr.ip().to_string(),
        &addr.port().to_string(),
    ]);
    let out = run_bounded(&mut cmd, CLIENT_TIME).expect("run python3");
    assert!(
        out.status.success(),
        "the plaintext client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn tcp_connections_are_allowed_or_closed_as_the_policies_say() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let (server_dir, client_dir) = two_pods(&net, &ca);
    let policies = net.binary().make_dir("policies");
    put(
        &policies,
        "tcp.yaml",
        &policy("port-9000", ALLOW_CLIENT_PORT),
    );
    let server = start_server(&net, &server_dir, &policies);
    let _client = net
        .peer_remora()
        .config(&client_config(&client_dir, net.pod_ip, SERVER_ID))
        .start_ready();
    let _allowed = Server::echo(&net.pod, peer::any_addr(TCP_ALLOWED));
    let _other = Server::echo(&net.pod, peer::any_addr(TCP_OTHER));

    // The client's identity on port 9000: bytes cross both sidecars and come back.
    let data = peer::pattern(64 * 1024);
    let echoed = peer::echo_exchange(&net.peer, net.pod_addr(TCP_ALLOWED), &data)
        .unwrap_or_else(|e| panic!("echo on {TCP_ALLOWED}: {e}\n{}", server.stderr()));
    peer::assert_same_bytes("TCP echo on the allowed port", &data, &echoed);

    // Another port: the connection is closed without a byte of the application's.
    let refused = peer::echo_exchange(&net.peer, net.pod_addr(TCP_OTHER), b"to another port");
    assert!(
        refused.as_ref().map_or(true, Vec::is_empty),
        "a denied TCP connection carried data: {refused:?}"
    );

    // Plaintext on the allowed port: no identity, closed.
    assert_eq!(plaintext_exchange(&net.peer, net.pod_addr(TCP_ALLOWED)), "");

    server.wait_for_metrics("TCP decisions counted", METRICS_TIME, |m| {
        let d = |action, result| {
            m.value(
                "remora_authorization_decisions_total",
                &[("protocol", "tcp"), ("action", action), ("result", result)],
            )
        };
        d("allow", "allowed") >= 1.0 && d("allow", "denied") >= 2.0
    });
    assert_eq!(
        server
            .metrics()
            .value("remora_authorization_policies", &[("action", "allow")]),
        1.0
    );
}
