//! Copying bytes both ways between the downstream and upstream sockets of a TCP connection.
//!
//! Each direction reads from one socket and writes to the other until end of stream, then shuts
//! down the write side of the other socket (half-close), so a client that finishes sending still
//! receives the whole response. The connection is done when both directions are. A reset or
//! other error on either side ends both, and the surviving side is reset too (`SO_LINGER` 0),
//! because a peer that sees a clean FIN after its partner crashed would take a truncated stream
//! for a complete one. A connection over which nothing has moved for the idle timeout is closed
//! both ways (Envoy's `tcp_proxy` `idle_timeout`), so a stalled peer does not hold its
//! descriptors and memory for ever.

mod idle;
mod local;
mod streams;

pub use streams::{copy_streams, copy_streams_until, relay};

use bytes::BytesMut;
use socket2::SockRef;
use std::future::Future;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::TcpStream;

// Reads start small because most connections are short or idle: the memory a connection holds
// is what the sidecar costs per connection, multiplied by every connection in the pod. A buffer
// exists only while bytes are moving: it is allocated when the socket becomes readable and given
// back when it has nothing more to read. A read that fills its buffer doubles the next one; a
// read that fills `BULK_AFTER` marks bulk traffic, which from then on is read up to
// `BULK_BUFFER` at a time, with the kernel buffers of its sockets to this host bounded (`local`).
// Measured on loopback (docs/benchmarks.md, "TCP bulk"): the fewer, larger reads and writes
// carry a stream at the speed of no proxy, where 64 KiB reads reached 0.6× and splice(2)
// through a pipe 0.8×, at less CPU per byte than either.
const INITIAL_BUFFER: usize = 4 * 1024;
const BULK_AFTER: usize = 16 * 1024;
const BULK_BUFFER: usize = 1024 * 1024;

/// Bytes moved in each direction, and how the connection ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes read from downstream and written upstream.
    pub sent: u64,
    /// Bytes read from upstream and written downstream.
    pub received: u64,
    /// Both directions ended, the upstream's end of stream after ours was passed on to it:
    /// the upstream closed the connection (Envoy's `upstream_cx_destroy_remote`), else we did.
    pub upstream_ended_last: bool,
}

/// Why a copy ended early.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The downstream peer reset or failed.
    #[error("downstream: {source}")]
    Downstream {
        #[source]
        source: io::Error,
        transfer: Transfer,
    },
    /// The upstream peer reset or failed.
    #[error("upstream: {source}")]
    Upstream {
        #[source]
        source: io::Error,
        transfer: Transfer,
    },
    /// No byte moved either way for the idle timeout. Both sides are closed, not reset, as
    /// Envoy closes an idle `tcp_proxy` session.
    #[error("idle for {idle:?}")]
    Idle { idle: Duration, transfer: Transfer },
    /// The caller's stop signal fired (the drain time of a filter chain an xDS update changed
    /// or removed ran out). Both sides are closed, not reset, as Envoy closes the connections
    /// of a removed chain (`filter_chain_is_being_removed`).
    #[error("stopped: the filter chain was removed")]
    Stopped { transfer: Transfer },
}

impl CopyError {
    /// Bytes moved before the error.
    pub fn transfer(&self) -> Transfer {
        match self {
            CopyError::Downstream { transfer, .. }
            | CopyError::Upstream { transfer, .. }
            | CopyError::Idle { transfer, .. }
            | CopyError::Stopped { transfer } => *transfer,
        }
    }
}

/// Which socket an I/O error happened on.
#[derive(Debug, Clone, Copy)]
enum Side {
    Downstream,
    Upstream,
}

/// Copy between `downstream` and `upstream` until both directions end.
pub async fn copy_bidirectional(
    downstream: &TcpStream,
    upstream: &TcpStream,
) -> Result<Transfer, CopyError> {
    copy_bidirectional_after(&[], downstream, upstream, None).await
}

/// Send `prefix` (bytes already read from `downstream` while detecting) to `upstream`, then
/// copy between them until both directions end, or until nothing has moved for `idle`.
/// (Not an `async fn`: a wrapper future would keep a second copy of the arguments in every
/// connection's future.)
pub fn copy_bidirectional_after<'a>(
    prefix: &'a [u8],
    downstream: &'a TcpStream,
    upstream: &'a TcpStream,
    idle: Option<Duration>,
) -> impl Future<Output = Result<Transfer, CopyError>> + 'a {
    copy_bidirectional_until(prefix, downstream, upstream, idle, std::future::pending())
}

/// As [`copy_bidirectional_after`], ended early (both sides closed, [`CopyError::Stopped`])
/// when `stop` resolves.
pub async fn copy_bidirectional_until(
    prefix: &[u8],
    downstream: &TcpStream,
    upstream: &TcpStream,
    idle: Option<Duration>,
    stop: impl Future<Output = ()>,
) -> Result<Transfer, CopyError> {
    let mut transfer = Transfer::default();
    // Each direction's bytes so far, readable when the other direction fails first and this
    // one is dropped mid-way: its bytes were delivered and count.
    let (sent, received) = (AtomicU64::new(0), AtomicU64::new(0));
    let up = copy_one_way(
        prefix,
        (downstream, Side::Downstream),
        (upstream, Side::Upstream),
        &sent,
    );
    let down = copy_one_way(
        &[],
        (upstream, Side::Upstream),
        (downstream, Side::Downstream),
        &received,
    );
    let mut idle = idle::IdleTimer::new(idle);
    tokio::pin!(up, down, stop);
    let (mut up_done, mut down_done) = (false, false);
    let failed = loop {
        tokio::select! {
            () = &mut stop => {
                let transfer = Transfer {
                    sent: sent.load(Ordering::Relaxed),
                    received: received.load(Ordering::Relaxed),
                    ..Transfer::default()
                };
                return Err(CopyError::Stopped { transfer });
            }
            idle = std::future::poll_fn(|cx| {
                let moved = sent.load(Ordering::Relaxed) + received.load(Ordering::Relaxed);
                idle.poll_idle(cx, moved)
            }) => {
                let transfer = Transfer {
                    sent: sent.load(Ordering::Relaxed),
                    received: received.load(Ordering::Relaxed),
                    ..Transfer::default()
                };
                return Err(CopyError::Idle { idle, transfer });
            }
            r = &mut up, if !up_done => match r {
                Ok(n) => { transfer.sent = n; up_done = true; transfer.upstream_ended_last = false; }
                Err((side, e, n)) => {
                    transfer = Transfer { sent: n, received: received.load(Ordering::Relaxed), ..Transfer::default() };
                    break (side, e);
                }
            },
            r = &mut down, if !down_done => match r {
                Ok(n) => { transfer.received = n; down_done = true; transfer.upstream_ended_last = true; }
                Err((side, e, n)) => {
                    transfer = Transfer { sent: sent.load(Ordering::Relaxed), received: n, ..Transfer::default() };
                    break (side, e);
                }
            },
        }
        if up_done && down_done {
            return Ok(transfer);
        }
    };
    // Pass the failure on as a reset to the other side; errors here only mean it is gone too.
    for s in [downstream, upstream] {
        let _ = SockRef::from(s).set_linger(Some(Duration::ZERO));
    }
    let (side, source) = failed;
    Err(match side {
        Side::Downstream => CopyError::Downstream { source, transfer },
        Side::Upstream => CopyError::Upstream { source, transfer },
    })
}

/// Copy `from` → `to` until end of stream, then half-close `to`. Returns the byte count, or the
/// side that failed with the error and the count so far; `progress` holds the count meanwhile.
async fn copy_one_way(
    prefix: &[u8],
    (from, from_side): (&TcpStream, Side),
    (to, to_side): (&TcpStream, Side),
    progress: &AtomicU64,
) -> Result<u64, (Side, io::Error, u64)> {
    let mut buf = BytesMut::new();
    // How much the next read takes.
    let mut size = INITIAL_BUFFER;
    let mut total: u64 = 0;
    // Bytes read before the copy began go first, through the same write as the rest: one
    // await point less in a future every connection holds.
    let mut pending = prefix;
    // The last read emptied the socket.
    let mut drained = false;
    loop {
        let chunk: &[u8] = if pending.is_empty() {
            if let Err(e) = from.readable().await {
                return Err((from_side, e, total));
            }
            if buf.capacity() < size {
                // Not zeroed: the read writes into spare capacity.
                buf = BytesMut::with_capacity(size);
            }
            buf.clear();
            match read_some(from, &mut buf) {
                Ok(0) => return finish(to, to_side, total),
                Ok(n) => {
                    drained = n < buf.capacity();
                    if n >= size && size < BULK_BUFFER {
                        if size < BULK_AFTER {
                            size *= 2;
                        } else {
                            local::bound_bulk_buffers(from, to);
                            size = BULK_BUFFER;
                        }
                    }
                    &buf[..n]
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Nothing more for now: an idle connection holds no buffer.
                    buf = BytesMut::new();
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err((from_side, e, total)),
            }
        } else {
            std::mem::take(&mut pending)
        };
        if let Err(e) = write_all(to, chunk).await {
            return Err((to_side, e, total));
        }
        total += chunk.len() as u64;
        progress.store(total, Ordering::Relaxed);
        if std::mem::take(&mut drained) {
            // The next wait is for new bytes: an idle connection holds no buffer.
            buf = BytesMut::new();
        }
    }
}

/// Read what `from` has into `buf`'s spare capacity.
///
/// A read that returns less than it asked for has emptied the socket's receive queue, so the
/// socket's readiness is cleared there and then, as tokio's own `AsyncRead` does: the next wait
/// sleeps until new bytes arrive, instead of waking at once to a read that can only say
/// `EAGAIN`. That read was one system call in three of a message's way through (read, write,
/// read again). Readiness is cleared with the tick observed
/// before the read, so bytes that arrive during it raise a new event and are not missed.
fn read_some(from: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    let asked = buf.capacity() - buf.len();
    let mut short = None;
    let read = from.try_io(Interest::READABLE, || {
        let n = from.try_read_buf(buf)?;
        if 0 < n && n < asked {
            // Not a failure: the way to tell tokio that the queue is empty.
            short = Some(n);
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (read, short) {
        (_, Some(n)) => Ok(n),
        (read, None) => read,
    }
}

/// The peer finished sending: pass the FIN on. Failing to do so is the other side's problem
/// (it is gone), reported as such.
fn finish(to: &TcpStream, to_side: Side, total: u64) -> Result<u64, (Side, io::Error, u64)> {
    if let Err(e) = SockRef::from(to).shutdown(Shutdown::Write) {
        if e.kind() != io::ErrorKind::NotConnected {
            return Err((to_side, e, total));
        }
    }
    Ok(total)
}

async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        to.writable().await?;
        match to.try_write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
