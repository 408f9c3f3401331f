//! DNS over TCP (RFC 7766): each message is preceded by its length in two bytes. The listener
//! loop serves a client's queries one after another; each goes upstream on a connection of its
//! own, as a stub resolver's retry after a truncated answer does.

use super::{message, ExchangeError, Forwarder, Transport};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a client connection may hold.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Bound on waiting for a client's next query, and on writing an answer to it.
    pub idle: Duration,
    /// Client connections open at once; more are closed at accept.
    pub max_connections: usize,
}

/// Accept client connections and serve each in its own task.
pub(super) async fn serve(listener: TcpListener, forwarder: Arc<Forwarder>, limits: Limits) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        match listener.accept().await {
            Ok((stream, client)) => match Arc::clone(&open).try_acquire_owned() {
                Ok(permit) => {
                    let forwarder = Arc::clone(&forwarder);
                    tokio::spawn(connection(stream, forwarder, limits.idle, permit));
                }
                Err(_) => {
                    forwarder.metrics.dropped.inc();
                    tracing::debug!(%client, "DNS TCP connection refused: too many open");
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "DNS accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Answer a client's queries in order until it closes, goes idle, or sends something that is
/// not DNS.
async fn connection(
    mut stream: TcpStream,
    forwarder: Arc<Forwarder>,
    idle: Duration,
    _permit: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    // Each round is bounded in time; the client ends the loop by closing or going quiet.
    loop {
        let query = match tokio::time::timeout(idle, read_message(&mut stream)).await {
            Ok(Ok(Some(query))) => query,
            Ok(Ok(None)) | Err(_) => return,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "DNS TCP client");
                return;
            }
        };
        let Some(answer) = forwarder.forward(&query, Transport::Tcp).await else {
            return;
        };
        match tokio::time::timeout(idle, write_message(&mut stream, &answer)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return,
        }
    }
}

/// Send `query` to `upstream` over a new TCP connection and read the answer, within `timeout`.
pub(super) async fn exchange(
    upstream: SocketAddr,
    query: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, ExchangeError> {
    match tokio::time::timeout(timeout, ask(upstream, query)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(source)) => Err(ExchangeError::Io { upstream, source }),
        Err(_) => Err(ExchangeError::Timeout { upstream, timeout }),
    }
}

async fn ask(upstream: SocketAddr, query: &[u8]) -> io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    write_message(&mut stream, query).await?;
    let answer = read_message(&mut stream)
        .await?
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "closed without an answer"))?;
    if !message::answers(&answer, message::id(query).unwrap_or_default()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the reply is not the answer to the query",
        ));
    }
    Ok(answer)
}

/// One length-prefixed message, or `None` if the peer closed before starting one.
pub(super) async fn read_message(
    stream: &mut (impl AsyncRead + Unpin),
) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match stream.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    // At most 64 KiB, by construction of the prefix.
    let mut msg = vec![0; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut msg).await?;
    Ok(Some(msg))
}

/// Write `msg` with its length prefix, in one write.
pub(super) async fn write_message(
    stream: &mut (impl AsyncWrite + Unpin),
    msg: &[u8],
) -> io::Result<()> {
    let len = u16::try_from(msg.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "DNS message over 64 KiB"))?;
    let mut framed = Vec::with_capacity(2 + msg.len());
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(msg);
    stream.write_all(&framed).await?;
    stream.flush().await
}
