//! Readiness (15021), Prometheus (15090) and admin (127.0.0.1:15000) endpoints.
//!
//! They run on their own thread with their own single-threaded runtime, so a slow scrape or a
//! flood of probes never competes with the data path's workers. The admin API follows Envoy's
//! paths and semantics (`envoy_api`), so `istioctl`, pilot-agent habits and runbooks carry over.

mod envoy_api;
mod logging;
pub mod readiness;
mod xds_dump;

pub use logging::{parse_filter, LogControl, SetFilter};
pub use readiness::Readiness;

use crate::drain::Drain;
use crate::metrics::exposition::Selection;
use crate::metrics::{Metrics, ServerState};
use crate::proxy::Route;
use crate::workload::Workload;
use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use remora_config::Config;
use std::convert::Infallible;
use std::net::SocketAddr;
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
    /// Istio's agent port, served by [`crate::agent`].
    Agent,
}

/// A data-path listener as the admin API shows it.
#[derive(Debug, Clone)]
pub struct ListenerInfo {
    /// Envoy's name for it (`virtualOutbound`, `virtualInbound`) or the explicit address.
    pub name: String,
    pub route: Route,
    pub addresses: Vec<SocketAddr>,
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
    pub config: Arc<ArcSwap<Config>>,
    pub listeners: Vec<ListenerInfo>,
    pub workload: Workload,
    pub concurrency: u16,
    /// `None` when the log filter cannot be changed (tests).
    pub logging: Option<LogControl>,
    /// The workload certificate, for `/certs`.
    pub identity: Arc<crate::identity::Store>,
    /// What readiness still waits for besides `ready` (the certificate, xDS).
    pub readiness: Arc<Readiness>,
    /// The data path's record of its open upstream connections: `/clusters` lists their
    /// destinations as hosts.
    pub upstreams: Arc<crate::loop_guard::LoopGuard>,
    /// What istiod configured (istiod mode), for `/config_dump` and `/clusters`.
    pub xds: Option<Arc<remora_xds::store::Store>>,
    /// The DNS clusters' resolved hosts, for `/clusters`.
    pub dns_hosts: Arc<crate::upstream::dns::DnsHosts>,
    /// The xDS clusters' run-time state (limits, ejections, per-host counts), for `/clusters`.
    pub balancers: Arc<crate::upstream::Upstreams>,
}

impl AdminState {
    /// A state with nothing bound and default config; what tests start from.
    pub fn new(metrics: Arc<Metrics>, drain: Arc<Drain>) -> Self {
        AdminState {
            metrics,
            drain,
            ready: AtomicBool::new(false),
            quit: Notify::new(),
            config: Arc::new(ArcSwap::from_pointee(Config::default())),
            listeners: Vec::new(),
            workload: Workload::default(),
            concurrency: 2,
            logging: None,
            identity: Arc::default(),
            readiness: Arc::default(),
            upstreams: crate::loop_guard::LoopGuard::new(Vec::new()),
            xds: None,
            dns_hosts: Arc::default(),
            balancers: Arc::default(),
        }
    }

    fn server_state(&self) -> ServerState {
        if self.drain.is_draining() {
            ServerState::Draining
        } else if self.ready.load(Ordering::Acquire) && self.readiness.pending().is_empty() {
            // Failed health checks make a live server draining, as in Envoy.
            match self.metrics.server.health_check_failed() {
                true => ServerState::Draining,
                false => ServerState::Live,
            }
        } else {
            ServerState::PreInitializing
        }
    }
}

type Body = Full<Bytes>;

/// One admin request, reduced to what routing needs.
#[derive(Debug, Clone)]
pub struct AdminRequest {
    pub method: Method,
    pub path: String,
    /// Decoded query parameters, in order.
    pub query: Vec<(String, String)>,
}

impl AdminRequest {
    /// A request for `path_and_query` (`/stats?filter=x`).
    pub fn new(method: Method, path_and_query: &str) -> Self {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        AdminRequest {
            method,
            path: path.to_string(),
            query: form_urlencoded::parse(query.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        }
    }

    /// The value of a query parameter, `Some("")` for a bare flag (`?usedonly`).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The paths each role serves, with the one method each takes.
fn routes(role: Role) -> &'static [(&'static str, Method)] {
    const READINESS: &[(&str, Method)] = &[("/healthz/ready", Method::GET)];
    const METRICS: &[(&str, Method)] = &[("/stats/prometheus", Method::GET)];
    const ADMIN: &[(&str, Method)] = &[
        ("/ready", Method::GET),
        ("/stats", Method::GET),
        ("/stats/prometheus", Method::GET),
        ("/server_info", Method::GET),
        ("/listeners", Method::GET),
        ("/clusters", Method::GET),
        ("/config_dump", Method::GET),
        ("/certs", Method::GET),
        ("/logging", Method::GET),
        ("/logging", Method::POST),
        ("/quitquitquit", Method::POST),
        ("/drain_listeners", Method::POST),
        ("/healthcheck/fail", Method::POST),
        ("/healthcheck/ok", Method::POST),
    ];
    match role {
        Role::Readiness => READINESS,
        Role::Metrics => METRICS,
        Role::Admin => ADMIN,
        // The agent port has its own (asynchronous) router; only readiness is shared.
        Role::Agent => READINESS,
    }
}

/// Answer one request. Pure apart from reading the state and acting on it as asked.
pub fn respond(role: Role, state: &AdminState, req: &AdminRequest) -> Response<Body> {
    let table = routes(role);
    let methods: Vec<&Method> = table
        .iter()
        .filter(|(p, _)| *p == req.path)
        .map(|(_, m)| m)
        .collect();
    if methods.is_empty() {
        let mut paths: Vec<&str> = table.iter().map(|(p, _)| *p).collect();
        paths.dedup();
        return text(
            StatusCode::NOT_FOUND,
            format!("not found; paths here:\n  {}\n", paths.join("\n  ")),
        );
    }
    // HEAD is answered like GET (hyper drops the body), as probes sometimes use it.
    let method = if req.method == Method::HEAD {
        Method::GET
    } else {
        req.method.clone()
    };
    if !methods.contains(&&method) {
        let allow: Vec<&str> = methods.iter().map(|m| m.as_str()).collect();
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} takes {}\n", req.path, allow.join(", ")),
        );
        if let Ok(v) = HeaderValue::from_str(&allow.join(", ")) {
            r.headers_mut().insert(ALLOW, v);
        }
        return r;
    }
    match (method, req.path.as_str()) {
        (_, "/healthz/ready") => {
            let failed = state.metrics.server.health_check_failed();
            match state.server_state() {
                ServerState::Live => text(StatusCode::OK, "ready\n".into()),
                _ if failed && !state.drain.is_draining() => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "health check failed\n".into(),
                ),
                ServerState::Draining => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n".into()),
                _ => match state.readiness.pending().as_slice() {
                    [] => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into()),
                    waiting => text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not ready: waiting for {}\n", waiting.join(", ")),
                    ),
                },
            }
        }
        (_, "/ready") => {
            let s = state.server_state();
            let status = if s == ServerState::Live {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(status, format!("{}\n", s.as_str()))
        }
        (_, "/stats/prometheus") => prometheus(state, req),
        (_, "/stats") if req.param("format") == Some("prometheus") => prometheus(state, req),
        (_, "/stats") => envoy_api::stats(state, req),
        (_, "/server_info") => envoy_api::server_info(state),
        (_, "/listeners") => envoy_api::listeners(state, req),
        (_, "/clusters") => envoy_api::clusters(state, req),
        (_, "/config_dump") => envoy_api::config_dump(state, req),
        (_, "/certs") => envoy_api::certs(state),
        (Method::GET, "/logging") => match &state.logging {
            Some(l) => text(StatusCode::OK, format!("active filter: {}\n", l.current())),
            None => text(StatusCode::OK, "active filter: (fixed)\n".into()),
        },
        (_, "/logging") => match &state.logging {
            Some(l) => match l.apply(&req.query) {
                Ok(f) => text(StatusCode::OK, format!("active filter: {f}\n")),
                Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
            },
            None => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "log filter is fixed\n".into(),
            ),
        },
        (_, "/quitquitquit") => {
            state.quit.notify_one();
            text(StatusCode::OK, "OK\n".into())
        }
        (_, "/drain_listeners") => envoy_api::drain_listeners(state, req),
        (_, "/healthcheck/fail") => {
            state.metrics.server.fail_health_check(true);
            text(StatusCode::OK, "OK\n".into())
        }
        (_, "/healthcheck/ok") => {
            state.metrics.server.fail_health_check(false);
            text(StatusCode::OK, "OK\n".into())
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn prometheus(state: &AdminState, req: &AdminRequest) -> Response<Body> {
    let sel = match selection(req) {
        Ok(sel) => sel,
        Err(e) => return invalid_filter(&e),
    };
    let mut r = text(StatusCode::OK, state.metrics.encode_selected(&sel));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROMETHEUS_TEXT));
    r
}

/// Envoy's `filter` and `usedonly` query parameters of a Prometheus scrape; an invalid
/// expression is a 400, as Envoy answers it.
pub(crate) fn selection(req: &AdminRequest) -> Result<Selection, regex::Error> {
    Selection::from_query(req.param("filter"), req.param("usedonly").is_some())
}

/// The answer to a scrape whose `filter` is no valid expression.
pub(crate) fn invalid_filter(e: &regex::Error) -> Response<Body> {
    text(StatusCode::BAD_REQUEST, format!("invalid filter: {e}\n"))
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

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let body = serde_json::to_string_pretty(value).unwrap_or_else(|_| "{}".into());
    let mut r = Response::new(Full::new(Bytes::from(body + "\n")));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Serve every listener on a thread of its own. Listeners come bound, so a port in use is a
/// start-up error in the caller rather than a log line here.
pub fn spawn(
    listeners: Vec<(Role, std::net::TcpListener)>,
    state: Arc<AdminState>,
    agent: Arc<crate::agent::Agent>,
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
                        Ok(l) if role == Role::Agent => {
                            tasks.push(tokio::spawn(crate::agent::serve(l, Arc::clone(&agent))))
                        }
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
    use crate::listener::{accept_errors::AcceptErrors, admission};
    let label = match role {
        Role::Admin => "admin",
        Role::Metrics => "metrics",
        Role::Readiness => "readiness",
        Role::Agent => "agent",
    };
    let mut errors = AcceptErrors::new(label, state.metrics.overload.clone());
    let open = Arc::new(tokio::sync::Semaphore::new(
        admission::SIDE_PORT_MAX_CONNECTIONS,
    ));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                errors.failed(&e).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            state.metrics.overload.side_port_overflow.inc();
            admission::reset(stream);
            continue;
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let path = req
                    .uri()
                    .path_and_query()
                    .map(|p| p.as_str())
                    .unwrap_or("/");
                let r = respond(role, &state, &AdminRequest::new(req.method().clone(), path));
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
mod tests;
