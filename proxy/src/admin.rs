//! Readiness (15021), Prometheus (15090) and admin (127.0.0.1:15000) endpoints.
//!
//! They run on their own thread with their own single-threaded runtime, so a slow scrape or a
//! flood of probes never competes with the data path's workers.

use crate::drain::Drain;
use crate::metrics::Metrics;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// A slow client gets this long to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Which endpoint set a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `GET /healthz/ready`, what Kubernetes probes.
    Readiness,
    /// `GET /stats/prometheus`, what Prometheus scrapes.
    Metrics,
    /// Envoy-style admin, loopback only.
    Admin,
}

/// What the endpoints report on and act upon.
#[derive(Debug)]
pub struct AdminState {
    pub metrics: Arc<Metrics>,
    pub drain: Arc<Drain>,
    /// Set once every listener is bound and the config is loaded.
    pub ready: AtomicBool,
    /// Notified by `POST /quitquitquit`.
    pub quit: Notify,
}

impl AdminState {
    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.drain.is_draining()
    }
}

type Body = Full<Bytes>;

/// Answer one request. Pure apart from reading the state (and notifying `quit`).
pub fn respond(role: Role, state: &AdminState, method: &Method, path: &str) -> Response<Body> {
    let routes: &[(&str, Method)] = match role {
        Role::Readiness => &[("/healthz/ready", Method::GET)],
        Role::Metrics => &[("/stats/prometheus", Method::GET)],
        Role::Admin => &[
            ("/ready", Method::GET),
            ("/stats/prometheus", Method::GET),
            ("/quitquitquit", Method::POST),
        ],
    };
    let Some((_, allowed)) = routes.iter().find(|(p, _)| *p == path) else {
        let list: Vec<&str> = routes.iter().map(|(p, _)| *p).collect();
        return text(
            StatusCode::NOT_FOUND,
            format!("not found; paths here: {}\n", list.join(" ")),
        );
    };
    // HEAD is answered like GET (hyper drops the body), as probes sometimes use it.
    if method != allowed && !(method == Method::HEAD && allowed == Method::GET) {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{path} takes {allowed}\n"),
        );
        if let Ok(v) = HeaderValue::from_str(allowed.as_str()) {
            r.headers_mut().insert(ALLOW, v);
        }
        return r;
    }
    match path {
        "/healthz/ready" => {
            if state.is_ready() {
                text(StatusCode::OK, "ready\n".into())
            } else if state.drain.is_draining() {
                text(StatusCode::SERVICE_UNAVAILABLE, "draining\n".into())
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into())
            }
        }
        // Envoy's admin words: LIVE, PRE_INITIALIZING, DRAINING.
        "/ready" => {
            if state.is_ready() {
                text(StatusCode::OK, "LIVE\n".into())
            } else if state.drain.is_draining() {
                text(StatusCode::SERVICE_UNAVAILABLE, "DRAINING\n".into())
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "PRE_INITIALIZING\n".into())
            }
        }
        "/stats/prometheus" => {
            let mut r = text(StatusCode::OK, state.metrics.encode());
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(PROMETHEUS_TEXT));
            r
        }
        "/quitquitquit" => {
            state.quit.notify_one();
            text(StatusCode::OK, "OK\n".into())
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Serve every listener on a thread of its own. Listeners come bound, so a port in use is a
/// start-up error in the caller rather than a log line here.
pub fn spawn(
    listeners: Vec<(Role, std::net::TcpListener)>,
    state: Arc<AdminState>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("admin".into())
        .spawn(move || {
            runtime.block_on(async move {
                let mut tasks = Vec::new();
                for (role, std_listener) in listeners {
                    match TcpListener::from_std(std_listener) {
                        Ok(l) => tasks.push(tokio::spawn(serve(l, role, Arc::clone(&state)))),
                        Err(e) => tracing::error!(error = %e, ?role, "admin listener unusable"),
                    }
                }
                for t in tasks {
                    let _ = t.await;
                }
            })
        })
}

async fn serve(listener: TcpListener, role: Role, state: Arc<AdminState>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, ?role, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = respond(role, &state, req.method(), req.uri().path());
                async move { Ok::<_, Infallible>(r) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, ?role, "admin connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> AdminState {
        AdminState {
            metrics: Arc::new(Metrics::default()),
            drain: Drain::new(),
            ready: AtomicBool::new(false),
            quit: Notify::new(),
        }
    }

    #[test]
    fn readiness_follows_start_and_drain() {
        let s = state();
        let get = |s: &AdminState| respond(Role::Readiness, s, &Method::GET, "/healthz/ready");
        assert_eq!(get(&s).status(), StatusCode::SERVICE_UNAVAILABLE);
        s.ready.store(true, Ordering::Release);
        assert_eq!(get(&s).status(), StatusCode::OK);
        s.drain.start();
        assert_eq!(get(&s).status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn wrong_method_is_405_and_unknown_path_is_404() {
        let s = state();
        let r = respond(Role::Admin, &s, &Method::GET, "/quitquitquit");
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.headers()[ALLOW], "POST");
        let r = respond(Role::Admin, &s, &Method::GET, "/nope");
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        // Each listener serves only its own paths.
        let r = respond(Role::Readiness, &s, &Method::GET, "/stats/prometheus");
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn quitquitquit_notifies() {
        let s = state();
        let r = respond(Role::Admin, &s, &Method::POST, "/quitquitquit");
        assert_eq!(r.status(), StatusCode::OK);
        tokio::time::timeout(Duration::from_secs(1), s.quit.notified())
            .await
            .expect("quit should have been notified");
    }

    #[test]
    fn prometheus_has_its_content_type() {
        let s = state();
        let r = respond(Role::Metrics, &s, &Method::GET, "/stats/prometheus");
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[CONTENT_TYPE], PROMETHEUS_TEXT);
    }
}
