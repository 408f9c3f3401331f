use super::*;
use crate::drain::Drain;
use crate::metrics::Metrics;
use std::io::{Read, Write};
use std::sync::atomic::Ordering;

fn agent(probers: &str, app_metrics: Option<(u16, String)>) -> Agent {
    let state = AdminState::new(Arc::new(Metrics::default()), Drain::new());
    state.ready.store(true, Ordering::Release);
    Agent {
        state: Arc::new(state),
        probers: probe::parse_probers(probers).unwrap(),
        target: probe::Target {
            app_ip: "127.0.0.1".parse().unwrap(),
            source_v4: "127.0.0.6".parse().unwrap(),
            source_v6: "::1".parse().unwrap(),
        },
        app_metrics,
        scrape_timeout: Duration::from_secs(2),
    }
}

async fn body(r: Response<Body>) -> String {
    use http_body_util::BodyExt;
    let b = r.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(b.to_vec()).unwrap()
}

/// A one-shot HTTP server on loopback answering every request with `status` and `body`.
fn app_server(status: u16, body: &'static str) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().take(4) {
            let Ok(mut s) = s else { return };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

const LOCAL: &str = "127.0.0.1:5555";
const REMOTE: &str = "10.9.8.7:5555";

#[tokio::test]
async fn http_probe_answers_as_kubelet_would() {
    let healthy = app_server(204, "");
    let sick = app_server(503, "no");
    let probers = format!(
        r#"{{"/app-health/app/livez":{{"httpGet":{{"path":"/healthz","port":{healthy}}}}},
            "/app-health/app/readyz":{{"httpGet":{{"path":"/ready","port":{sick}}}}}}}"#
    );
    let a = agent(&probers, None);
    let live = respond(
        &a,
        Method::GET,
        "/app-health/app/livez",
        LOCAL.parse().unwrap(),
    )
    .await;
    assert_eq!(live.status(), StatusCode::OK);
    let ready = respond(
        &a,
        Method::GET,
        "/app-health/app/readyz",
        LOCAL.parse().unwrap(),
    )
    .await;
    assert_eq!(ready.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body(ready).await.contains("503"));
    let none = respond(
        &a,
        Method::GET,
        "/app-health/other/livez",
        LOCAL.parse().unwrap(),
    )
    .await;
    assert_eq!(none.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn metrics_are_merged_with_the_applications() {
    let port = app_server(
        200,
        "# TYPE app_requests_total counter\napp_requests_total 7\n",
    );
    let a = agent("", Some((port, "/metrics".into())));
    let r = respond(&a, Method::GET, "/stats/prometheus", LOCAL.parse().unwrap()).await;
    let text = body(r).await;
    assert!(text.contains("istio_build{"), "{text}");
    assert!(text.contains("app_requests_total 7\n"), "{text}");
    // The scrape's filter selects among the sidecar's metrics; the application's are its own.
    let r = respond(
        &a,
        Method::GET,
        "/stats/prometheus?filter=istio_build",
        LOCAL.parse().unwrap(),
    )
    .await;
    let text = body(r).await;
    assert!(text.contains("istio_build{"), "{text}");
    assert!(!text.contains("envoy_server_state"), "{text}");
    assert!(text.contains("app_requests_total 7\n"), "{text}");
}

#[tokio::test]
async fn quit_and_drain_only_from_localhost() {
    let a = agent("", None);
    let r = respond(&a, Method::POST, "/drain", REMOTE.parse().unwrap()).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(!a.state.drain.is_draining());
    let r = respond(&a, Method::GET, "/drain", LOCAL.parse().unwrap()).await;
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    let r = respond(&a, Method::POST, "/drain", LOCAL.parse().unwrap()).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(a.state.drain.is_draining());
    // As pilot-agent's `/drain` (Envoy's `skip_exit`): the listeners stay open, and SIGTERM
    // will exit at once.
    assert!(a.state.drain.drained_ahead());
    assert!(!a.state.drain.inbound_listeners_are_closed());
    let r = respond(&a, Method::GET, "/healthz/ready", REMOTE.parse().unwrap()).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let r = respond(
        &a,
        Method::POST,
        "/quitquitquit",
        "[::1]:9".parse().unwrap(),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    tokio::time::timeout(Duration::from_secs(1), a.state.quit.notified())
        .await
        .unwrap();
}

#[test]
fn prometheus_annotations_select_the_scrape_target() {
    assert_eq!(
        AppMetrics::parse(r#"{"scrape":"true","path":"/m","port":"9100"}"#),
        Ok(Some((9100, "/m".into())))
    );
    assert_eq!(
        AppMetrics::parse(r#"{"scrape":"false","port":"9100"}"#),
        Ok(None)
    );
    assert_eq!(AppMetrics::parse(""), Ok(None));
    assert!(AppMetrics::parse(r#"{"scrape":"true","port":"x"}"#).is_err());
}
