//! The two probe kinds that need more than a plain connection: HTTPS (TLS without verification,
//! as kubelet probes) and gRPC health checks (`grpc.health.v1.Health/Check` over h2c).

use super::probe::Target;
use crate::tls::verify::{CertificateCheck, Verifier};
use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use std::sync::Arc;

/// The most of a health answer we read.
const MAX_BODY: usize = 64 * 1024;

/// kubelet does not verify an HTTPS probe's certificate: the application's certificate is
/// usually for its service name, not the pod IP. Neither do we, for probes only (the
/// handshake's signatures are still checked).
#[derive(Debug)]
struct AnyCertificate;

impl CertificateCheck for AnyCertificate {
    fn check(&self, _: &crate::tls::verify::Presented<'_>) -> Result<(), rustls::Error> {
        Ok(())
    }
}

/// GET `path` over TLS from `addr`; returns the status.
pub async fn https_get(
    target: &Target,
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[super::probe::HttpHeader],
) -> Result<u16, String> {
    let provider = crate::tls::provider();
    let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS config: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Verifier::with_check(AnyCertificate, provider)))
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_string())
        .unwrap_or_else(|_| ServerName::IpAddress(addr.ip().into()));
    let tcp = target
        .connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake with {addr}: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::get(path).header(hyper::header::HOST, host);
    for h in headers {
        req = req.header(h.name.as_str(), h.value.as_str());
    }
    let req = req
        .header(hyper::header::USER_AGENT, "remora-probe")
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("bad probe request: {e}"))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("{addr}{path}: {e}"))?;
    let status = resp.status().as_u16();
    driver.abort();
    Ok(status)
}

/// Ask `grpc.health.v1.Health/Check` for `service` at `addr`; `Ok` when it answers SERVING.
pub async fn grpc_health(target: &Target, addr: SocketAddr, service: &str) -> Result<(), String> {
    let tcp = target
        .connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .header(hyper::header::CONTENT_TYPE, "application/grpc")
        .header(hyper::header::TE, "trailers")
        .body(Full::new(health_check_request(service)))
        .map_err(|e| format!("bad probe request: {e}"))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("gRPC health check {addr}: {e}"))?;
    let status_in_headers = grpc_status(resp.headers());
    let collected = Limited::new(resp.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("gRPC health check {addr}: {e}"))?;
    driver.abort();
    let status = collected
        .trailers()
        .and_then(grpc_status)
        .or(status_in_headers);
    match status {
        Some(0) => {}
        Some(s) => return Err(format!("gRPC health check {addr}: grpc-status {s}")),
        None => return Err(format!("gRPC health check {addr}: no grpc-status")),
    }
    match serving_status(collected.to_bytes()) {
        Some(1) => Ok(()),
        Some(s) => Err(format!("gRPC health check {addr}: status {s}, not SERVING")),
        None => Err(format!("gRPC health check {addr}: unreadable answer")),
    }
}

fn grpc_status(h: &hyper::HeaderMap) -> Option<u32> {
    h.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// A framed `HealthCheckRequest { string service = 1; }`.
fn health_check_request(service: &str) -> Bytes {
    let mut msg = Vec::with_capacity(service.len() + 2);
    if !service.is_empty() {
        msg.push(0x0a); // field 1, length-delimited
        push_varint(&mut msg, service.len() as u64);
        msg.extend_from_slice(service.as_bytes());
    }
    let mut framed = Vec::with_capacity(msg.len() + 5);
    framed.push(0); // not compressed
    framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    framed.extend_from_slice(&msg);
    Bytes::from(framed)
}

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The `status` (field 1, an enum) of a framed `HealthCheckResponse`; 0 (UNKNOWN) when absent.
fn serving_status(mut body: Bytes) -> Option<u64> {
    if body.len() < 5 || body[0] != 0 {
        return None;
    }
    body.advance(1);
    let len = body.get_u32() as usize;
    let mut msg = body.get(..len)?;
    let mut status = 0;
    while !msg.is_empty() {
        let key = read_varint(&mut msg)?;
        match key & 7 {
            0 => {
                let v = read_varint(&mut msg)?;
                if key >> 3 == 1 {
                    status = v;
                }
            }
            2 => {
                let n = usize::try_from(read_varint(&mut msg)?).ok()?;
                msg = msg.get(n..)?;
            }
            _ => return None,
        }
    }
    Some(status)
}

fn read_varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_messages_encode_and_decode() {
        assert_eq!(&health_check_request("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(
            &health_check_request("app")[..],
            &[0, 0, 0, 0, 5, 0x0a, 3, b'a', b'p', b'p']
        );
        let serving = Bytes::from_static(&[0, 0, 0, 0, 2, 0x08, 1]);
        assert_eq!(serving_status(serving), Some(1));
        let not_serving = Bytes::from_static(&[0, 0, 0, 0, 2, 0x08, 2]);
        assert_eq!(serving_status(not_serving), Some(2));
        assert_eq!(
            serving_status(Bytes::from_static(&[0, 0, 0, 0, 0])),
            Some(0)
        );
        assert_eq!(serving_status(Bytes::from_static(&[0, 0, 0])), None);
    }

    #[tokio::test]
    async fn grpc_health_check_against_a_real_h2_server() {
        use hyper::service::service_fn;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        // "sick" is NOT_SERVING, anything else SERVING.
                        let status = if body.ends_with(b"sick") { 2 } else { 1 };
                        let mut trailers = hyper::HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        let body = Full::new(Bytes::from(vec![0, 0, 0, 0, 2, 0x08, status]))
                            .with_trailers(async move { Some(Ok(trailers)) });
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(body)
                                .unwrap(),
                        )
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        let target = Target {
            app_ip: "127.0.0.1".parse().unwrap(),
            source_v4: "127.0.0.6".parse().unwrap(),
            source_v6: "::1".parse().unwrap(),
        };
        assert_eq!(grpc_health(&target, addr, "").await, Ok(()));
        assert!(grpc_health(&target, addr, "sick").await.is_err());
    }
}
