//! The upstream connection of one request on Remora's own HTTP/1.1 exchange: its reads and
//! writes, which also mark how the connection ends (a request on it, the peer's close) for
//! its cluster's `upstream_cx_destroy*`.

use crate::connect::Upstream;
use crate::http::originate::MeshConn;
use bytes::BytesMut;
use std::io;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The upstream connection of one request: a plain socket, or mesh TLS we originated.
pub(in crate::http::h1) enum Up {
    Plain(Upstream),
    Mesh(MeshConn),
}

impl Up {
    /// This side of the connection (for the access log).
    pub(super) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Up::Plain(up) => up.stream.local_addr().ok(),
            Up::Mesh(conn) => conn.0.get_ref().0.local_addr().ok(),
        }
    }

    /// Write all of `bytes` (a request); mesh TLS is flushed, so nothing waits in rustls.
    pub(super) async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let sent = match self {
            Up::Plain(up) => up.stream.write_all(bytes).await,
            Up::Mesh(conn) => match conn.0.write_all(bytes).await {
                Ok(()) => conn.0.flush().await,
                Err(e) => Err(e),
            },
        };
        // From now until its response is read, a request is on the connection; a write the
        // peer refused is its close.
        if let Some(end) = self.end() {
            end.active = true;
            end.remote |= sent.is_err();
        }
        sent
    }

    pub(super) async fn read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let read = match self {
            Up::Plain(up) => up.stream.read_buf(buf).await,
            Up::Mesh(conn) => conn.0.read_buf(buf).await,
        };
        if matches!(read, Ok(0) | Err(_)) {
            if let Some(end) = self.end() {
                end.remote = true;
            }
        }
        read
    }

    /// How the connection ends, for an xDS cluster's.
    pub(super) fn end(&mut self) -> Option<&mut crate::upstream::connection_end::ConnectionEnd> {
        match self {
            Up::Plain(up) => up.registration_mut().end_mut(),
            Up::Mesh(conn) => conn.1.end_mut(),
        }
    }
}
