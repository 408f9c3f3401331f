//! Istio's agent port, 15020: what pods, probes and docs already point at. Merged Prometheus
//! metrics (ours plus the application's), readiness, application probes rewritten by the
//! injector, and `POST /quitquitquit` / `POST /drain` for local callers only.

mod http_client;
pub mod probe;
mod probe_clients;

use crate::admin::{self, AdminRequest, AdminState, Role};
use crate::metrics::exposition::Selection;
use crate::metrics::ServerState;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

type Body = Full<Bytes>;

/// Where the application serves its own metrics, from the pod's `prometheus.io/*` annotations
/// that the injector hands over in `ISTIO_PROMETHEUS_ANNOTATIONS`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AppMetrics {
    #[serde(default)]
    pub scrape: String,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub port: String,
}

impl AppMetrics {
    /// Parse `ISTIO_PROMETHEUS_ANNOTATIONS`; `None` when scraping is not asked for.
    pub fn parse(json: &str) -> Result<Option<(u16, String)>, String> {
        if json.trim().is_empty() {
            return Ok(None);
        }
        let a: AppMetrics =
            serde_json::from_str(json).map_err(|e| format!("ISTIO_PROMETHEUS_ANNOTATIONS: {e}"))?;
        if a.scrape != "true" || a.port.is_empty() {
            return Ok(None);
        }
        let port = a
            .port
            .parse()
            .map_err(|_| format!("ISTIO_PROMETHEUS_ANNOTATIONS: port `{}`", a.port))?;
        let path = if a.path.is_empty() {
            "/metrics".to_string()
        } else {
            a.path
        };
        Ok(Some((port, path)))
    }
}

/// Everything the agent port needs.
#[derive(Debug)]
pub struct Agent {
    pub state: Arc<AdminState>,
    pub probers: probe::Probers,
    /// The application's address for probes and scrapes, and the source they come from.
    pub target: probe::Target,
    /// The application's metrics port and path, when it asks to be scraped.
    pub app_metrics: Option<(u16, String)>,
    pub scrape_timeout: Duration,
}

/// Accept and serve agent-port connections until the process ends.
pub async fn serve(listener: TcpListener, agent: Arc<Agent>) {
    use crate::listener::{accept_errors::AcceptErrors, admission};
    let overload = agent.state.metrics.overload.clone();
    let mut errors = AcceptErrors::new("agent", overload.clone());
    let open = Arc::new(tokio::sync::Semaphore::new(
        admission::SIDE_PORT_MAX_CONNECTIONS,
    ));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                errors.failed(&e).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            overload.side_port_overflow.inc();
            admission::reset(stream);
            continue;
        };
        let agent = Arc::clone(&agent);
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let agent = Arc::clone(&agent);
                let path = req
                    .uri()
                    .path_and_query()
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_else(|| "/".into());
                let method = req.method().clone();
                async move { Ok::<_, Infallible>(respond(&agent, method, &path, peer).await) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "agent connection ended with an error");
            }
        });
    }
}

const PATHS: &str = "/healthz/ready /stats/prometheus /app-health/<container>/{livez,readyz,startupz} /quitquitquit /drain";

/// Answer one agent-port request from `peer`.
pub async fn respond(
    agent: &Agent,
    method: Method,
    path: &str,
    peer: SocketAddr,
) -> Response<Body> {
    let req = AdminRequest::new(method.clone(), path);
    let get = method == Method::GET || method == Method::HEAD;
    match req.path.as_str() {
        "/healthz/ready" if get => admin::respond(Role::Readiness, &agent.state, &req),
        "/stats/prometheus" if get => match admin::selection(&req) {
            Ok(sel) => merged_metrics(agent, &sel).await,
            Err(e) => admin::invalid_filter(&e),
        },
        "/quitquitquit" | "/drain" if method != Method::POST => text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} takes POST\n", req.path),
        ),
        // Only the pod itself may stop or drain its sidecar.
        "/quitquitquit" | "/drain" if !peer.ip().to_canonical().is_loopback() => {
            text(StatusCode::FORBIDDEN, "only from localhost\n".into())
        }
        "/quitquitquit" => {
            agent.state.quit.notify_one();
            text(StatusCode::OK, "OK\n".into())
        }
        "/drain" => {
            agent.state.drain.start_ahead();
            agent.state.metrics.server.set_state(ServerState::Draining);
            text(StatusCode::OK, "OK\n".into())
        }
        p if p.starts_with("/app-health/") && get => match agent.probers.get(p) {
            Some(prober) => match probe::run(prober, &agent.target).await {
                Ok(()) => text(StatusCode::OK, "OK\n".into()),
                Err(why) => {
                    tracing::debug!(path = p, %why, "application probe failed");
                    text(StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n"))
                }
            },
            None => text(
                StatusCode::NOT_FOUND,
                format!("no probe registered for {p}\n"),
            ),
        },
        "/healthz/ready" | "/stats/prometheus" => text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} takes GET\n", req.path),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            format!("not found; paths here: {PATHS}\n"),
        ),
    }
}

/// Our metrics followed by the application's, as Istio's agent merges them. The scrape's
/// `filter` and `usedonly` select among ours only, as Istio's agent passes them to Envoy.
async fn merged_metrics(agent: &Agent, sel: &Selection) -> Response<Body> {
    let mut body = agent.state.metrics.encode_selected(sel);
    if let Some((port, path)) = &agent.app_metrics {
        let addr = SocketAddr::new(agent.target.app_ip, *port);
        let scrape = http_client::get(&agent.target, addr, path, &[]);
        match tokio::time::timeout(agent.scrape_timeout, scrape).await {
            Ok(Ok((200, app))) => {
                if !body.ends_with('\n') {
                    body.push('\n');
                }
                body.push_str(&String::from_utf8_lossy(&app));
                if !body.ends_with('\n') {
                    body.push('\n');
                }
            }
            Ok(Ok((status, _))) => {
                tracing::debug!(%addr, status, "application metrics scrape refused")
            }
            Ok(Err(e)) => tracing::debug!(%addr, error = %e, "application metrics scrape failed"),
            Err(_) => tracing::debug!(%addr, "application metrics scrape timed out"),
        }
    }
    let mut r = text(StatusCode::OK, body);
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
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

#[cfg(test)]
mod tests;
