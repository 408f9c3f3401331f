//! The upstream's response as the fast path reads it: its head (interim answers skipped),
//! and how much of its body is left to relay.

use super::chunked::{self, ChunkedEnd};
use super::head::{self, Framing, ResponseHead};
use super::up::Up;
use super::READ_SIZE;
use crate::http::errors::ErrorKind;
use bytes::{Buf, BytesMut};
use std::io;

/// How much of a response body is left.
pub(super) struct Body {
    pub(super) framing: Framing,
    remaining: u64,
    chunks: ChunkedEnd,
}

impl Body {
    pub(super) fn new(framing: Framing) -> Self {
        Body {
            framing,
            remaining: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            chunks: ChunkedEnd::default(),
        }
    }

    /// Of `bytes` just read, how many belong to the body, and whether it is over with them.
    pub(super) fn take(&mut self, bytes: &[u8]) -> Result<(usize, bool), chunked::BadChunk> {
        Ok(match self.framing {
            Framing::None => (0, true),
            Framing::Length(_) => {
                let n = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.remaining -= n as u64;
                (n, self.remaining == 0)
            }
            Framing::Chunked => match self.chunks.feed(bytes)? {
                Some(n) => (n, true),
                None => (bytes.len(), false),
            },
            Framing::Close => (bytes.len(), false),
        })
    }
}

/// Why no response head came back.
#[derive(Debug, thiserror::Error)]
pub(super) enum ResponseError {
    #[error("upstream connection: {0}")]
    Io(io::Error),
    #[error("upstream closed the connection before the response")]
    Closed,
    #[error(transparent)]
    Bad(#[from] head::BadResponse),
}

impl ResponseError {
    pub(super) fn kind(&self) -> ErrorKind {
        match self {
            ResponseError::Bad(_) => ErrorKind::UpstreamProtocol,
            ResponseError::Io(_) | ResponseError::Closed => ErrorKind::ConnectionTerminated,
        }
    }
}

/// Read the response head into `rbuf`, skipping interim (1xx) responses; from a
/// `mesh_server`, its sidecar's metadata headers are read, not passed on.
pub(super) async fn response_head(
    up: &mut Up,
    rbuf: &mut BytesMut,
    head_request: bool,
    mesh_server: bool,
) -> Result<ResponseHead, ResponseError> {
    loop {
        if !rbuf.is_empty() {
            if let Some(head) = head::parse_response_from(&rbuf[..], head_request, mesh_server)? {
                if !head.interim() {
                    if head.status == 101 {
                        // No upgrade was asked for.
                        return Err(ResponseError::Bad(head::BadResponse));
                    }
                    return Ok(head);
                }
                rbuf.advance(head.len);
                continue;
            }
        }
        rbuf.reserve(READ_SIZE);
        match up.read_buf(rbuf).await {
            Ok(0) if rbuf.is_empty() => return Err(ResponseError::Closed),
            Ok(0) => return Err(ResponseError::Bad(head::BadResponse)),
            Ok(_) => {}
            Err(e) => return Err(ResponseError::Io(e)),
        }
    }
}
