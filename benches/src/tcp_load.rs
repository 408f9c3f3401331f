//! Connection-level load: new connections as fast as a few workers can open them, and many
//! connections opened and then left idle. Both speak just enough HTTP/1.1 to the upstream to
//! prove the whole path works (one request and its 1 KiB answer), so they run through TCP and
//! HTTP proxies alike.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Bound on one connection's whole exchange.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
const CLOSE_REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
const KEEP_ALIVE_REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n";

/// What a connection-rate run measured.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionRate {
    /// Connections that completed their exchange.
    pub connections: u64,
    pub errors: u64,
    pub duration: Duration,
}

impl ConnectionRate {
    /// Completed connections per second.
    pub fn per_second(&self) -> f64 {
        self.connections as f64 / self.duration.as_secs_f64()
    }
}

/// `workers` loops, each opening a connection, sending one request with `Connection: close`,
/// reading the answer to the end and starting over, for `duration`.
pub async fn connection_rate(
    addr: SocketAddr,
    workers: usize,
    duration: Duration,
) -> ConnectionRate {
    let start = Instant::now();
    let deadline = start + duration;
    let mut set = JoinSet::new();
    for _ in 0..workers {
        set.spawn(async move {
            let (mut ok, mut errors) = (0u64, 0u64);
            while Instant::now() < deadline {
                match tokio::time::timeout(EXCHANGE_TIMEOUT, close_exchange(addr)).await {
                    Ok(Ok(())) => ok += 1,
                    _ => errors += 1,
                }
            }
            (ok, errors)
        });
    }
    let mut rate = ConnectionRate {
        connections: 0,
        errors: 0,
        duration: Duration::ZERO,
    };
    while let Some(Ok((ok, errors))) = set.join_next().await {
        rate.connections += ok;
        rate.errors += errors;
    }
    rate.duration = start.elapsed();
    rate
}

/// One connection: a request with `Connection: close`, its 200 answer read to the end.
pub async fn close_exchange(addr: SocketAddr) -> std::io::Result<()> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    stream.write_all(CLOSE_REQUEST).await?;
    let mut reply = Vec::with_capacity(2048);
    stream.read_to_end(&mut reply).await?;
    if reply.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(std::io::Error::other("no 200 answer"))
    }
}

/// Connections opened by [`open_idle`]; closed when dropped.
#[derive(Debug)]
pub struct IdleConnections {
    pub streams: Vec<TcpStream>,
    /// Connections that could not be opened or got no answer.
    pub failed: usize,
    /// Why the first of them failed.
    pub first_error: Option<String>,
}

/// Opens `n` connections, at most `parallel` at a time, each carrying one keep-alive request and
/// its answer (so that every hop is established), and keeps them open and idle.
pub async fn open_idle(addr: SocketAddr, n: usize, parallel: usize) -> IdleConnections {
    let permits = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let mut set = JoinSet::new();
    for _ in 0..n {
        let permits = permits.clone();
        set.spawn(async move {
            let _permit = permits.acquire_owned().await.map_err(|e| e.to_string())?;
            match tokio::time::timeout(EXCHANGE_TIMEOUT, keep_alive_exchange(addr)).await {
                Ok(Ok(stream)) => Ok(stream),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {EXCHANGE_TIMEOUT:?}")),
            }
        });
    }
    let mut idle = IdleConnections {
        streams: Vec::with_capacity(n),
        failed: 0,
        first_error: None,
    };
    while let Some(result) = set.join_next().await {
        match result.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(stream) => idle.streams.push(stream),
            Err(e) => {
                idle.failed += 1;
                idle.first_error.get_or_insert(e);
            }
        }
    }
    idle
}

async fn keep_alive_exchange(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    stream.write_all(KEEP_ALIVE_REQUEST).await?;
    let mut reply = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::other(
                "closed before the answer was complete",
            ));
        }
        reply.extend_from_slice(&chunk[..n]);
        match response_complete(&reply) {
            Some(true) => return Ok(stream),
            Some(false) => return Err(std::io::Error::other("no 200 answer")),
            None => {}
        }
    }
}

/// Whether `buf` holds a whole HTTP/1.1 response with a `content-length` body: `None` while
/// more bytes are needed, `Some(ok)` once complete, `ok` being a 200.
pub fn response_complete(buf: &[u8]) -> Option<bool> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return None,
        Err(_) => return Some(false),
    };
    let length = response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        });
    let Some(length) = length else {
        return Some(false);
    };
    (buf.len() >= head_len + length).then_some(response.code == Some(200))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_complete_once_its_body_is_in() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n";
        assert_eq!(response_complete(&head[..10]), None);
        assert_eq!(response_complete(head), None);
        assert_eq!(
            response_complete(&[&head[..], b"abcd"].concat()),
            Some(true)
        );
        assert_eq!(
            response_complete(b"HTTP/1.1 503 No\r\ncontent-length: 0\r\n\r\n"),
            Some(false)
        );
        assert_eq!(response_complete(b"garbage\r\n\r\n"), Some(false));
    }

    #[tokio::test]
    async fn connections_open_idle_and_count() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(crate::upstream::serve(listener));
        let idle = open_idle(addr, 20, 4).await;
        assert_eq!((idle.streams.len(), idle.failed), (20, 0));
        let rate = connection_rate(addr, 2, Duration::from_millis(200)).await;
        assert!(rate.connections > 10 && rate.errors == 0, "{rate:?}");
    }
}
