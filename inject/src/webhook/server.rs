//! The webhook's HTTPS server: rustls (ring provider), HTTP/1.1, `POST /inject` and
//! `GET /healthz`. Every wait is bounded and the number of connections is capped, so a slow
//! or hostile client costs a connection slot for a bounded time and nothing more.

use super::admission::{review, NamespaceLookup};
use super::cert::{CertError, RotatingCert};
use crate::injector::Injector;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::crypto::CryptoProvider;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// Bounds of the server, with defaults a reader can find here.
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    /// A TLS handshake that takes longer is dropped.
    pub handshake_timeout: Duration,
    /// Request headers must arrive within this.
    pub header_timeout: Duration,
    /// The body of a review; the API server caps objects at about 1.5 MiB, and a review holds
    /// at most two of them.
    pub max_body: usize,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// How often the certificate files are checked for a rotated pair where their directories
    /// cannot be watched (a watch sees a rotation at once).
    pub cert_poll_interval: Duration,
}

impl Default for WebhookOptions {
    fn default() -> Self {
        WebhookOptions {
            // Short, and a generous cap: idle connections that never start TLS must not keep
            // kubelet's probe (1 s timeout) or the API server's review (10 s) waiting.
            handshake_timeout: Duration::from_secs(3),
            header_timeout: Duration::from_secs(10),
            max_body: 8 * 1024 * 1024,
            max_connections: 1024,
            cert_poll_interval: Duration::from_secs(5),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("the serving certificate")]
    Cert(#[from] CertError),
    #[error("TLS configuration")]
    Tls(#[from] rustls::Error),
    #[error("accepting connections")]
    Accept(#[source] std::io::Error),
}

/// The crypto provider of the webhook's TLS.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The TLS configuration presenting `cert`'s current certificate at each handshake.
pub fn tls_config(cert: Arc<RotatingCert>) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

struct State {
    injector: Injector,
    namespaces: Box<dyn NamespaceLookup>,
    options: WebhookOptions,
}

/// Serves until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    injector: Injector,
    namespaces: Box<dyn NamespaceLookup>,
    options: WebhookOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(options.max_connections));
    let state = Arc::new(State {
        injector,
        namespaces,
        options,
    });
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => return Ok(()),
            p = Arc::clone(&slots).acquire_owned() => p.map_err(|e| ServerError::Accept(std::io::Error::other(e)))?,
        };
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // A failed accept (out of descriptors, a reset) concerns one client only.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let _permit = permit;
            let tls =
                match tokio::time::timeout(state.options.handshake_timeout, acceptor.accept(tcp))
                    .await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            let service = service_fn(|req| {
                let state = Arc::clone(&state);
                async move { Ok::<_, std::convert::Infallible>(handle(req, &state).await) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(state.options.header_timeout)
                .serve_connection(TokioIo::new(tls), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

async fn handle(req: Request<Incoming>, state: &State) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if path == "/healthz" || path == "/ready" {
        return text(StatusCode::OK, "ok");
    }
    if path != "/inject" && !path.starts_with("/inject/") {
        return text(
            StatusCode::NOT_FOUND,
            "not found: POST /inject, GET /healthz",
        );
    }
    if req.method() != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "POST an AdmissionReview");
    }
    let json = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
        );
    }
    let body = match Limited::new(req.into_body(), state.options.max_body)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return text(StatusCode::PAYLOAD_TOO_LARGE, "the review is too large");
        }
        Err(e) => return text(StatusCode::BAD_REQUEST, &format!("reading the body: {e}")),
    };
    match review(&body, &state.injector, state.namespaces.as_ref()) {
        Ok(answer) => match serde_json::to_vec(&answer) {
            Ok(bytes) => Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(bytes)))
                .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response")),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        },
        Err(e) => text(
            StatusCode::BAD_REQUEST,
            &format!("malformed AdmissionReview: {e}"),
        ),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{body}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
