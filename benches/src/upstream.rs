//! The upstream every contender forwards to, the same for all: a hyper server on one thread
//! answering every request with a fixed 1 KiB body (Istio's benchmark payload). It speaks
//! HTTP/1.1 with keep-alive and h2c with prior knowledge (told apart by the client preface), and
//! answers gRPC requests (`content-type: application/grpc`) the gRPC way: a length-prefixed
//! 1 KiB message and `grpc-status: 0` in the trailers. `Connection: close` is honoured, which the
//! connection-rate test uses.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// The response body size.
pub const BODY_SIZE: usize = 1024;
/// How long a new connection may take to show its first bytes before it is treated as HTTP/1.1.
const PREFACE_WAIT: Duration = Duration::from_secs(10);
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

type Body = BoxBody<Bytes, Infallible>;

/// Serves on `addr` until the process is killed, on a single-threaded runtime.
pub fn serve_forever(addr: SocketAddr) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(addr).await?;
        eprintln!("upstream: serving 1 KiB responses on {addr}");
        serve(listener).await
    })
}

/// Accepts connections on `listener` and serves each in its own task.
pub async fn serve(listener: TcpListener) -> anyhow::Result<()> {
    let body = Bytes::from(vec![b'x'; BODY_SIZE]);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of file descriptors under the idle-connection test: back off, keep serving.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(stream, body.clone()));
    }
}

async fn serve_connection(stream: TcpStream, body: Bytes) {
    let is_h2 = tokio::time::timeout(PREFACE_WAIT, starts_with_h2_preface(&stream))
        .await
        .unwrap_or(false);
    let service = hyper::service::service_fn(move |req| respond(req, body.clone()));
    let io = TokioIo::new(stream);
    let _ = if is_h2 {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .max_concurrent_streams(1024)
            .serve_connection(io, service)
            .await
    } else {
        hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .await
    };
}

/// Peeks (without consuming) until the first bytes either match or rule out the h2 preface.
async fn starts_with_h2_preface(stream: &TcpStream) -> bool {
    let mut buf = [0u8; H2_PREFACE.len()];
    loop {
        let n = match stream.peek(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        if buf[..n] != H2_PREFACE[..n] {
            return false;
        }
        if n == H2_PREFACE.len() {
            return true;
        }
        // A partial match: wait for more bytes to arrive.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn respond(req: Request<Incoming>, body: Bytes) -> Result<Response<Body>, Infallible> {
    let grpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    // Read the request body to its end, as a real server would.
    let _ = req.into_body().collect().await;
    let response = if grpc {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        Response::builder()
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .body(
                Full::new(grpc_frame(&body))
                    .with_trailers(std::future::ready(Some(Ok(trailers))))
                    .boxed(),
            )
    } else {
        Response::builder()
            .header(http::header::CONTENT_TYPE, "text/plain")
            .body(Full::new(body).boxed())
    };
    Ok(response.unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed())))
}

/// One gRPC message on the wire: an uncompressed flag, the length (big-endian), the bytes.
pub fn grpc_frame(message: &[u8]) -> Bytes {
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0);
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    Bytes::from(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn grpc_frames_are_length_prefixed() {
        let frame = grpc_frame(b"abc");
        assert_eq!(&frame[..], &[0, 0, 0, 0, 3, b'a', b'b', b'c']);
    }

    #[tokio::test]
    async fn answers_http1_with_a_1kib_body_and_honours_close() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut reply = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut reply))
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&reply);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains("content-length: 1024"));
        assert!(text.ends_with(&"x".repeat(BODY_SIZE)));
    }
}
