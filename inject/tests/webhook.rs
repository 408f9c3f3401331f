//! `remora webhook` over real HTTPS on 127.0.0.1: every conformance pod the webhook sees,
//! patched with the returned JSON Patch, equals what `remora inject` makes of the same pod;
//! malformed and hostile requests get 4xx answers and the server keeps serving.

mod support;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Namespace;
use remora_inject::documents::inject_yaml;
use remora_inject::webhook::cert::RotatingCert;
use remora_inject::webhook::{serve, server, NamespaceLookup, WebhookOptions};
use remora_inject::{Injector, InjectorConfig};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value as Json};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A webhook on 127.0.0.1 with a certificate made for the test, and a client that trusts it.
struct Webhook {
    addr: SocketAddr,
    client: tokio_rustls::TlsConnector,
    stop: Option<oneshot::Sender<()>>,
}

struct StaticNamespace(Option<Namespace>);

impl NamespaceLookup for StaticNamespace {
    fn namespace(&self, name: &str) -> Option<Namespace> {
        self.0
            .clone()
            .filter(|n| n.metadata.name.as_deref() == Some(name))
    }
}

impl Webhook {
    async fn start(
        config: InjectorConfig,
        namespace: Option<Namespace>,
        options: WebhookOptions,
    ) -> Webhook {
        let cert =
            rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert_path, cert.cert.pem()).expect("write cert");
        std::fs::write(&key_path, cert.key_pair.serialize_pem()).expect("write key");
        let cert_files = RotatingCert::load(&cert_path, &key_path, server::provider())
            .expect("certificate pair");
        let tls = server::tls_config(Arc::new(cert_files)).expect("tls config");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let lookup = Box::new(StaticNamespace(namespace));
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            serve(
                listener,
                tls,
                Injector::new(config),
                lookup,
                options,
                shutdown,
            )
            .await
            .expect("serve");
        });
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(cert.cert.der().to_vec()))
            .expect("root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Webhook {
            addr,
            client: tokio_rustls::TlsConnector::from(Arc::new(client)),
            stop: Some(stop),
        }
    }

    /// One request on a fresh connection: status and body.
    async fn call(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (u16, Bytes) {
        self.try_call(method, path, content_type, body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// As `call`, but a failure to send or receive is returned, not a panic.
    async fn try_call(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Bytes), hyper::Error> {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        let name = ServerName::try_from("localhost").expect("name");
        let tls = self.client.connect(name, tcp).await.expect("handshake");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .expect("http");
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)))
            .expect("request");
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        Ok((status, resp.into_body().collect().await?.to_bytes()))
    }

    async fn review(&self, review: &Json) -> Json {
        let (status, body) = self
            .call(
                "POST",
                "/inject",
                "application/json",
                review.to_string().into_bytes(),
            )
            .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).expect("review json")
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Whether `e` is the server closing the connection under the client's feet.
fn is_closed(e: &hyper::Error) -> bool {
    e.is_closed() || e.is_incomplete_message() || {
        let text = format!("{e:?}");
        text.contains("BrokenPipe") || text.contains("ConnectionReset")
    }
}

fn admission_review(uid: &str, namespace: &str, pod: &Json) -> Json {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": namespace,
            "object": pod,
        }
    })
}

/// The Pod a controller would create from a template: no name yet, a generated-name prefix and
/// its owner (for a Deployment, the ReplicaSet and its pod-template-hash), as Istio's own
/// webhook test builds it.
fn pod_from(t: &support::FoundTemplate) -> Json {
    let mut metadata = t.metadata.clone();
    if t.kind != "Pod" {
        let (owner_kind, api, owner) = match t.kind.as_str() {
            "Deployment" => ("ReplicaSet", "apps/v1", format!("{}-fake", t.name)),
            kind => (kind, "apps/v1", t.name.clone()),
        };
        metadata["generateName"] = json!(format!("{owner}-"));
        metadata["ownerReferences"] = json!([{"apiVersion": api, "kind": owner_kind, "name": owner, "uid": "u", "controller": true}]);
        if t.kind == "Deployment" {
            metadata["labels"]["pod-template-hash"] = json!("fake");
        }
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": t.spec})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patched_pods_equal_the_cli_output() {
    let Some(dir) = support::conformance_dir() else {
        return;
    };
    let mut checked = 0;
    for case in support::load_cases(&dir) {
        let e = &case.expect;
        if e["checked_by"]["webhook"] != true || !e["expect_error"].is_null() {
            continue;
        }
        let (config, namespace, _) = support::config_for(&e["settings"]);
        let cli = Injector::new(config.clone());
        let webhook = Webhook::start(config, namespace.clone(), WebhookOptions::default()).await;
        let ns_name = namespace
            .as_ref()
            .and_then(|n| n.metadata.name.clone())
            .unwrap_or_else(|| "default".into());
        for (i, t) in support::templates_of(&case.input).iter().enumerate() {
            let mut pod = pod_from(t);
            if namespace.is_some() {
                pod["metadata"]["namespace"] = json!(ns_name);
            }
            let uid = format!("{}-{i}", case.name);
            let answer = webhook
                .review(&admission_review(&uid, &ns_name, &pod))
                .await;
            let response = &answer["response"];
            assert_eq!(response["uid"], uid.as_str());
            let yaml = serde_yaml_ng::to_string(&pod).expect("pod yaml");
            let cli_result = inject_yaml(&yaml, &cli, namespace.as_ref());
            let Ok((cli_out, _)) = cli_result else {
                assert_eq!(
                    response["allowed"], false,
                    "{}: the CLI refuses, the webhook must too",
                    case.name
                );
                continue;
            };
            assert_eq!(response["allowed"], true, "{}: {response}", case.name);
            let mut patched = pod.clone();
            if let Some(patch) = response["patch"].as_str() {
                assert_eq!(response["patchType"], "JSONPatch");
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(patch)
                    .expect("base64");
                let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("patch json");
                json_patch::patch(&mut patched, &patch).expect("the patch applies");
            }
            let cli_pod: serde_yaml_ng::Value =
                serde_yaml_ng::from_str(&cli_out).expect("cli yaml");
            let cli_pod = serde_json::to_value(cli_pod).expect("json");
            assert_eq!(patched, cli_pod, "{}: webhook and CLI disagree", case.name);
            checked += 1;
        }
    }
    assert!(checked >= 100, "only {checked} pods checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_4xx_and_the_server_keeps_serving() {
    let options = WebhookOptions {
        max_body: 64 * 1024,
        ..WebhookOptions::default()
    };
    let webhook = Webhook::start(InjectorConfig::default(), None, options).await;
    let pod = json!({"metadata": {"generateName": "web-"}, "spec": {"containers": [{"name": "web", "image": "w"}]}});
    let valid = admission_review("ok", "shop", &pod)
        .to_string()
        .into_bytes();
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes();
    let cases: Vec<(&str, &str, &str, Vec<u8>, u16)> = vec![
        ("POST", "/inject", "text/plain", valid.clone(), 415),
        ("POST", "/inject", "application/yaml", valid.clone(), 415),
        ("GET", "/inject", "application/json", vec![], 405),
        ("POST", "/elsewhere", "application/json", valid.clone(), 404),
        ("POST", "/inject", "application/json", b"not json".to_vec(), 400),
        ("POST", "/inject", "application/json", vec![], 400),
        ("POST", "/inject", "application/json", vec![0xff, 0xfe, 0x00], 400),
        ("POST", "/inject", "application/json", b"{}".to_vec(), 400),
        ("POST", "/inject", "application/json", deep, 413),
        ("POST", "/inject", "application/json", "[".repeat(10_000).into_bytes(), 400),
        ("POST", "/inject", "application/json", vec![b' '; 200 * 1024], 413),
        (
            "POST",
            "/inject",
            "application/json",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"object":{}}}"#.to_vec(),
            400,
        ),
        (
            "POST",
            "/inject",
            "application/json",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"spec":"x"}}}"#.to_vec(),
            400,
        ),
    ];
    for (method, path, content_type, body, want) in cases {
        let (status, text) = match webhook.try_call(method, path, content_type, body).await {
            Ok(answer) => answer,
            // An over-long body is answered 413 and the connection closed while the client may
            // still be writing it; the client can then see its write fail before reading the
            // answer. Either way the server refused it, and it must keep serving (checked below).
            Err(e) if want == 413 && (e.is_body_write_aborted() || is_closed(&e)) => {
                (413, Bytes::new())
            }
            Err(e) => panic!("{method} {path}: {e}"),
        };
        assert_eq!(
            status,
            want,
            "{method} {path} {content_type}: {}",
            String::from_utf8_lossy(&text)
        );
    }
    // Plain HTTP and garbage on the TLS port cost a connection, nothing else.
    for junk in [
        &b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        &[0u8; 512][..],
    ] {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(webhook.addr)
            .await
            .expect("connect");
        let _ = tcp.write_all(junk).await;
        let mut buf = [0u8; 64];
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read(&mut buf)).await;
    }
    let (status, _) = webhook.call("GET", "/healthz", "text/plain", vec![]).await;
    assert_eq!(status, 200);
    let answer = webhook
        .review(&serde_json::from_slice(&valid).expect("json"))
        .await;
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["uid"], "ok");
    // An invalid annotation is refused in a well-formed answer, not a 4xx.
    let bad = json!({"metadata": {"annotations": {"traffic.sidecar.istio.io/includeInboundPorts": "bad"}}, "spec": {"containers": [{"name": "a"}]}});
    let answer = webhook.review(&admission_review("bad", "shop", &bad)).await;
    assert_eq!(answer["response"]["allowed"], false);
    assert!(answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("includeInboundPorts"));
}

/// The certificate presented by a fresh handshake with `addr`.
async fn presented_certificate(addr: SocketAddr, roots: &rustls::RootCertStore) -> Vec<u8> {
    let provider = server::provider();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(name, tcp)
        .await
        .expect("handshake");
    let (_, session) = tls.get_ref();
    let chain = session.peer_certificates().expect("a certificate");
    chain[0].to_vec()
}

/// A rotated certificate (the Secret's files rewritten) is presented to new connections
/// without a restart; a pair that does not match keeps the previous certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificate_is_served_and_a_broken_pair_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let make = || rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let (first, second, third) = (make(), make(), make());
    let write = |cert: &str, key: &str| {
        std::fs::write(&cert_path, cert).expect("write cert");
        std::fs::write(&key_path, key).expect("write key");
    };
    write(&first.cert.pem(), &first.key_pair.serialize_pem());
    let mut roots = rustls::RootCertStore::empty();
    for c in [&first, &second, &third] {
        roots
            .add(CertificateDer::from(c.cert.der().to_vec()))
            .expect("root");
    }

    let cert = Arc::new(
        RotatingCert::load(&cert_path, &key_path, server::provider()).expect("first pair"),
    );
    let tls = server::tls_config(Arc::clone(&cert)).expect("tls config");
    let watcher = tokio::spawn(Arc::clone(&cert).watch(std::time::Duration::from_millis(50)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        tls,
        Injector::default(),
        Box::new(StaticNamespace(None)),
        WebhookOptions::default(),
        async {
            let _ = stopped.await;
        },
    ));
    assert_eq!(
        presented_certificate(addr, &roots).await,
        first.cert.der().to_vec()
    );

    write(&second.cert.pem(), &second.key_pair.serialize_pem());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if presented_certificate(addr, &roots).await == second.cert.der().to_vec() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotated certificate is not presented 5 s after the files changed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // The third certificate with the second's key: not a pair, so the second stays.
    write(&third.cert.pem(), &second.key_pair.serialize_pem());
    // Whether the watcher or this call reads the files first, the pair is never swapped in.
    assert!(
        !matches!(cert.reload(), Ok(true)),
        "a mismatched pair is refused"
    );
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        presented_certificate(addr, &roots).await,
        second.cert.der().to_vec()
    );

    let _ = stop.send(());
    server.await.expect("join").expect("serve");
    watcher.abort();
}
