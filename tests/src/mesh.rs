//! Two pods in mutual TLS, as the mTLS and authorization tests set them up: the pod namespace
//! serves (`httpbin` in namespace `server`), the peer namespace is the client's pod (`sleep` in
//! namespace `client`), each with capture rules, its own Remora and its own certificate from
//! one test CA, in Istio's file layout. Plus `openssl s_client`, for clients no sidecar wraps.

use crate::certs::MeshCa;
use crate::{has_command, skip, Netns, PodNet, Remora};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The server pod's identity.
pub const SERVER_ID: &str = "spiffe://cluster.local/ns/server/sa/httpbin";
/// The client pod's identity.
pub const CLIENT_ID: &str = "spiffe://cluster.local/ns/client/sa/sleep";
/// The server's service name, in the client's SNI.
pub const SERVER_HOST: &str = "httpbin.server.svc.cluster.local";
/// Bound on one `openssl s_client` exchange.
pub const S_CLIENT_TIME: Duration = Duration::from_secs(20);

/// The two pods, for a test that reads what crosses the veth with tcpdump.
pub fn pods_to_sniff() -> Option<PodNet> {
    let net = PodNet::create_or_skip()?;
    if !has_command("tcpdump") {
        return skip("tcpdump is missing (scripts/install-test-deps installs it)");
    }
    Some(net)
}

/// `remora`'s count of mesh TLS handshakes in `direction` that ended in `result`.
pub fn handshakes(remora: &Remora, direction: &str, result: &str) -> f64 {
    remora.metrics().value(
        "remora_tls_handshakes_total",
        &[("direction", direction), ("result", result)],
    )
}

/// The server pod's sidecar config: its certificate directory and inbound mode.
pub fn server_config(cert_dir: &Path, mode: &str) -> String {
    format!(
        "tls:\n  cert_dir: {}\nmesh:\n  mtls_mode: {mode}\n",
        cert_dir.display()
    )
}

/// The client pod's sidecar config: the server pod is a mesh destination.
pub fn client_config(cert_dir: &Path, server: Ipv4Addr, identity: &str) -> String {
    format!(
        "tls:\n  cert_dir: {}\nmesh:\n  destinations:\n    - cidrs: [\"{server}\"]\n      \
         hostname: {SERVER_HOST}\n      identities: [\"{identity}\"]\n",
        cert_dir.display()
    )
}

/// Two pods with their own certificates from `ca`, and capture rules in both. Returns the
/// certificate directories (server, client).
pub fn two_pods(net: &PodNet, ca: &MeshCa) -> (PathBuf, PathBuf) {
    let server_dir = net.binary().make_dir("server-certs");
    let client_dir = net.binary().make_dir("client-certs");
    ca.install(&server_dir, &ca.workload(SERVER_ID));
    ca.install(&client_dir, &ca.workload(CLIENT_ID));
    net.capture_default();
    net.capture_peer_default();
    (server_dir, client_dir)
}

/// [`two_pods`] with a fresh CA, and the server pod's sidecar started in PERMISSIVE mode.
/// Returns that sidecar and the client's certificate directory.
pub fn permissive_server(net: &PodNet) -> (Remora<'_>, PathBuf) {
    let ca = MeshCa::new("cluster.local");
    let (server_dir, client_dir) = two_pods(net, &ca);
    let server = net
        .remora()
        .config(&server_config(&server_dir, "permissive"))
        .start_ready();
    (server, client_dir)
}

/// `openssl s_client` from `ns` to `addr` with `args`, sending `input`; its output once it
/// exits or after [`S_CLIENT_TIME`].
pub fn s_client(ns: &Netns, addr: SocketAddr, args: &[&str], input: &[u8]) -> Output {
    s_client_with(ns.command("openssl"), addr, args, input)
}

/// [`s_client`] as UID/GID 1337, which the default capture rules let through: a client in a
/// pod with a sidecar that does not go through it.
pub fn s_client_as_proxy_user(ns: &Netns, addr: SocketAddr, args: &[&str], input: &[u8]) -> Output {
    let mut cmd = as_proxy_user(ns);
    cmd.arg("openssl");
    s_client_with(cmd, addr, args, input)
}

/// A command run in `ns` as UID/GID 1337 (the program is the next argument).
pub fn as_proxy_user(ns: &Netns) -> Command {
    let id = crate::PROXY_UID.to_string();
    let mut cmd = ns.command("setpriv");
    cmd.args(["--reuid", &id, "--regid", &id, "--clear-groups"]);
    cmd
}

/// `openssl s_client` as `cmd` runs it (`openssl`, or a wrapper ending in it).
fn s_client_with(mut cmd: Command, addr: SocketAddr, args: &[&str], input: &[u8]) -> Output {
    cmd.args(["s_client", "-connect", &addr.to_string(), "-quiet"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn openssl s_client");
    if let Some(mut stdin) = child.stdin.take() {
        // The server may close first; a failed write is then what the test looks at.
        let _ = stdin.write_all(input);
    }
    let deadline = Instant::now() + S_CLIENT_TIME;
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let status = child.wait().expect("wait for openssl");
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_end(&mut stdout);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_end(&mut stderr);
    }
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Whether `openssl` is there; otherwise the test is skipped (a failure under `CI=true`).
pub fn has_openssl() -> bool {
    has_command("openssl")
        || skip::<()>("openssl is missing (scripts/install-test-deps installs it)").is_some()
}
