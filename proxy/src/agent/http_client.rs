//! A minimal HTTP/1.1 GET for probes and metrics scraping: one request per connection, bounded
//! by the caller's timeout, the body capped so a misbehaving application cannot balloon us.

use super::probe::{HttpHeader, Target};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;

/// The most of an application's response body we read (its metrics page, say).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// GET `path` from `addr`; returns the status and the body.
pub async fn get(
    target: &Target,
    addr: SocketAddr,
    path: &str,
    headers: &[HttpHeader],
) -> Result<(u16, Bytes), String> {
    let stream = target
        .connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::get(path).header(hyper::header::HOST, addr.to_string());
    for h in headers {
        req = req.header(h.name.as_str(), h.value.as_str());
    }
    let req = req
        .header(hyper::header::USER_AGENT, "remora-probe")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("bad probe request: {e}"))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("{addr}{path}: {e}"))?;
    let status = resp.status().as_u16();
    let body = Limited::new(resp.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("{addr}{path}: reading body: {e}"))?
        .to_bytes();
    driver.abort();
    Ok((status, body))
}
