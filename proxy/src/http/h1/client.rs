//! The client connections the fast path serves: a plain socket, or mesh TLS terminated on
//! one. What the idle wait needs of each: the socket whose readiness it waits on, whether
//! bytes are already held above it, and whether a read took any off it.

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// A client connection the fast path serves: a socket, or mesh TLS terminated on one.
pub trait Client: AsyncRead + AsyncWrite + Unpin + Send {
    /// The socket under it: an idle connection waits for it to become readable without
    /// holding a buffer.
    fn socket(&self) -> &TcpStream;

    /// Whether a read can go on without the socket: bytes already taken off it and held
    /// above it, which its readiness no longer shows.
    fn holds_data(&self) -> bool;

    /// Reads that took bytes off the socket so far (wrapping). A TLS read can take part of a
    /// record and still wait (rustls decrypts whole records, and a client can stop inside
    /// one); a plain read that waits took nothing, so a plain socket keeps this at 0.
    fn socket_reads(&self) -> u32;
}

impl Client for TcpStream {
    fn socket(&self) -> &TcpStream {
        self
    }

    fn holds_data(&self) -> bool {
        false
    }

    fn socket_reads(&self) -> u32 {
        0
    }
}

impl Client for crate::tls::stream::ServerStream {
    fn socket(&self) -> &TcpStream {
        self.get_ref().0.inner()
    }

    /// rustls decrypts whole records; a read that wanted fewer bytes than a record held leaves
    /// the rest inside. It stops asking for more from the socket while it holds any (or
    /// after the peer's close_notify, which a read then reports as the end).
    fn holds_data(&self) -> bool {
        let (rewind, tls) = self.get_ref();
        rewind.holds_data() || !tls.wants_read()
    }

    fn socket_reads(&self) -> u32 {
        self.get_ref().0.reads()
    }
}
