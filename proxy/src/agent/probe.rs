//! Application probes, answered on behalf of kubelet.
//!
//! Istio's injector rewrites a container's HTTP, TCP and gRPC probes to point at the agent port
//! (`/app-health/<container>/livez|readyz|startupz`) and passes the originals in
//! `ISTIO_KUBE_APP_PROBERS`, a JSON map from the rewritten path to the original probe. The
//! sidecar runs the original probe against the application and answers as kubelet would judge
//! it, so kubelet's plaintext probes keep working when the mesh requires mutual TLS.

use serde::Deserialize;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;
use tokio::net::TcpStream;

/// The originals, keyed by rewritten path.
pub type Probers = HashMap<String, Prober>;

/// One original probe, as Kubernetes writes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Prober {
    pub http_get: Option<HttpGet>,
    pub tcp_socket: Option<TcpSocket>,
    pub grpc: Option<GrpcProbe>,
    /// kubelet's default is 1 s.
    #[serde(default = "one")]
    pub timeout_seconds: u64,
}

fn one() -> u64 {
    1
}

/// A port given as a number or, left unresolved by the injector, a name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Port {
    Number(u16),
    Text(String),
}

impl Port {
    fn number(&self) -> Result<u16, String> {
        match self {
            Port::Number(n) => Ok(*n),
            Port::Text(t) => t
                .parse()
                .map_err(|_| format!("port `{t}` is a name the injector should have resolved")),
        }
    }
}

/// `httpGet`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpGet {
    #[serde(default)]
    pub path: String,
    pub port: Port,
    pub host: Option<String>,
    pub scheme: Option<String>,
    #[serde(default)]
    pub http_headers: Vec<HttpHeader>,
}

/// One `httpHeaders` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct HttpHeader {
    pub name: String,
    pub value: String,
}

/// `tcpSocket`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TcpSocket {
    pub port: Port,
    pub host: Option<String>,
}

/// `grpc`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct GrpcProbe {
    pub port: u16,
    pub service: Option<String>,
}

/// Parse `ISTIO_KUBE_APP_PROBERS`.
pub fn parse_probers(json: &str) -> Result<Probers, String> {
    if json.trim().is_empty() {
        return Ok(Probers::new());
    }
    serde_json::from_str(json).map_err(|e| format!("ISTIO_KUBE_APP_PROBERS: {e}"))
}

/// The outcome of one probe: healthy, or why not.
pub type ProbeResult = Result<(), String>;

/// Where probes go and where they come from.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// The application's address: the pod IP, as kubelet probes it.
    pub app_ip: IpAddr,
    /// The passthrough source (`127.0.0.6` / `::6`). From any other source our own connection to
    /// the pod IP would be captured into the inbound listener, whose handshake succeeds whether
    /// or not the application listens: a TCP probe would never fail.
    pub source_v4: IpAddr,
    pub source_v6: IpAddr,
}

impl Target {
    /// Connect to `addr` from the passthrough source of its family.
    pub async fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        let (socket, source) = match addr {
            SocketAddr::V4(_) => (tokio::net::TcpSocket::new_v4()?, self.source_v4),
            SocketAddr::V6(_) => (tokio::net::TcpSocket::new_v6()?, self.source_v6),
        };
        socket.bind(SocketAddr::new(source, 0))?;
        socket.connect(addr).await
    }
}

/// Run `prober` against the application.
pub async fn run(prober: &Prober, target: &Target) -> ProbeResult {
    let app_ip = target.app_ip;
    let timeout = Duration::from_secs(prober.timeout_seconds.max(1));
    let work = async {
        if let Some(h) = &prober.http_get {
            http_get(h, target).await
        } else if let Some(t) = &prober.tcp_socket {
            let addr = SocketAddr::new(host_ip(t.host.as_deref(), app_ip)?, t.port.number()?);
            target
                .connect(addr)
                .await
                .map(|_| ())
                .map_err(|e| format!("tcp connect {addr}: {e}"))
        } else if let Some(g) = &prober.grpc {
            let addr = SocketAddr::new(app_ip, g.port);
            super::probe_clients::grpc_health(target, addr, g.service.as_deref().unwrap_or(""))
                .await
        } else {
            Err("probe has no httpGet, tcpSocket or grpc".to_string())
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out after {}s", timeout.as_secs())),
    }
}

fn host_ip(host: Option<&str>, default: IpAddr) -> Result<IpAddr, String> {
    match host {
        None | Some("") => Ok(default),
        Some("localhost") => Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        Some(h) => h
            .parse()
            .map_err(|_| format!("probe host `{h}` is not an IP address")),
    }
}

async fn http_get(h: &HttpGet, target: &Target) -> ProbeResult {
    let app_ip = target.app_ip;
    let addr = SocketAddr::new(host_ip(h.host.as_deref(), app_ip)?, h.port.number()?);
    let path = if h.path.is_empty() { "/" } else { &h.path };
    let https = h
        .scheme
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("https"));
    let status = if https {
        let host = h.host.clone().unwrap_or_else(|| app_ip.to_string());
        super::probe_clients::https_get(target, addr, &host, path, &h.http_headers).await?
    } else {
        super::http_client::get(target, addr, path, &h.http_headers)
            .await
            .map(|(status, _)| status)?
    };
    // kubelet: any status from 200 to 399 is success.
    if (200..400).contains(&status) {
        Ok(())
    } else {
        Err(format!("HTTP probe {addr}{path} returned {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_istios_prober_map() {
        let json = r#"{"/app-health/app/livez":{"httpGet":{"path":"/healthz","port":8080,"scheme":"HTTP","httpHeaders":[{"name":"X-A","value":"b"}]},"timeoutSeconds":3},
                        "/app-health/app/readyz":{"tcpSocket":{"port":"9090"}}}"#;
        let p = parse_probers(json).unwrap();
        let live = &p["/app-health/app/livez"];
        assert_eq!(live.timeout_seconds, 3);
        let h = live.http_get.as_ref().unwrap();
        assert_eq!(h.port, Port::Number(8080));
        assert_eq!(h.http_headers[0].name, "X-A");
        let ready = &p["/app-health/app/readyz"];
        assert_eq!(ready.timeout_seconds, 1);
        assert_eq!(ready.tcp_socket.as_ref().unwrap().port.number(), Ok(9090));
        assert!(parse_probers("").unwrap().is_empty());
        assert!(parse_probers("{").is_err());
    }

    #[tokio::test]
    async fn tcp_probe_succeeds_on_a_listener_and_fails_without() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let prober = Prober {
            http_get: None,
            tcp_socket: Some(TcpSocket {
                port: Port::Number(port),
                host: None,
            }),
            grpc: None,
            timeout_seconds: 1,
        };
        let target = Target {
            app_ip: "127.0.0.1".parse().unwrap(),
            source_v4: "127.0.0.6".parse().unwrap(),
            source_v6: "::1".parse().unwrap(),
        };
        assert_eq!(run(&prober, &target).await, Ok(()));
        drop(l);
        assert!(run(&prober, &target).await.is_err());
    }
}
