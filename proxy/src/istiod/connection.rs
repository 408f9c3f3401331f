//! The connection to istiod, dialled here rather than by tonic: TCP, then TLS verified against
//! the mesh roots with the address' host as server name, offering `h2` as gRPC servers
//! require. Dialling it here lets it be counted as Envoy counts the connection of its
//! `xds-grpc` cluster (`cluster.xds-grpc;.upstream_cx_*`), which Istio's control-plane
//! dashboard reads: connections made, failed and open, and the bytes each way, counted above
//! TLS as Envoy counts a TLS cluster's.

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// What was counted of the connections to one address.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Dials started.
    started: AtomicU64,
    /// Of them, failed before TLS was up (refused, unreachable, a failed handshake)…
    failed: AtomicU64,
    /// … of which for taking longer than the connect timeout.
    timed_out: AtomicU64,
    /// Connections closed, failed dials included (Envoy counts a connection that never came
    /// up as destroyed too): by Remora (a timeout, a certificate refused, a connection
    /// dropped), and by istiod or the network (refused, reset, ended).
    closed_local: AtomicU64,
    closed_remote: AtomicU64,
    /// Bytes read and written above TLS.
    received: AtomicU64,
    sent: AtomicU64,
}

impl ConnectionStats {
    /// Envoy's names, kinds (`true`: a gauge) and values for a cluster's connections, as its
    /// `xds-grpc` cluster counts them: every connection is HTTP/2, and one that failed is
    /// counted made, failed and destroyed, as Envoy counts it.
    pub fn envoy_stats(&self) -> [(&'static str, bool, u64); 10] {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        // Read the ends before the starts: a dial counted between the reads shows as active.
        let (local, remote, failed) = (
            v(&self.closed_local),
            v(&self.closed_remote),
            v(&self.failed),
        );
        let started = v(&self.started);
        let active = started.saturating_sub(local + remote);
        [
            ("upstream_cx_active", true, active),
            ("upstream_cx_connect_fail", false, failed),
            ("upstream_cx_connect_timeout", false, v(&self.timed_out)),
            ("upstream_cx_destroy", false, local + remote),
            ("upstream_cx_destroy_local", false, local),
            ("upstream_cx_destroy_remote", false, remote),
            ("upstream_cx_http2_total", false, started),
            ("upstream_cx_rx_bytes_total", false, v(&self.received)),
            ("upstream_cx_total", false, started),
            ("upstream_cx_tx_bytes_total", false, v(&self.sent)),
        ]
    }
}

/// Dials `address` (`host:port`) for a tonic channel: a [`tonic::codegen::Service`] of URIs
/// (the URI is the channel's own, the same address) to counted TLS connections.
#[derive(Clone)]
pub struct Dialer {
    address: Arc<str>,
    server_name: ServerName<'static>,
    tls: tokio_rustls::TlsConnector,
    timeout: Duration,
    stats: Arc<ConnectionStats>,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Dialer {
    /// A dialer of `address`, verifying its certificate against `roots` for `server_name`,
    /// each dial (TCP and TLS) bounded by `timeout`.
    pub fn new(
        address: &str,
        server_name: ServerName<'static>,
        roots: rustls::RootCertStore,
        timeout: Duration,
    ) -> Result<Dialer, rustls::Error> {
        let mut config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Dialer {
            address: Arc::from(address),
            server_name,
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            timeout,
            stats: Arc::default(),
        })
    }

    /// What was counted of its connections.
    pub fn stats(&self) -> Arc<ConnectionStats> {
        Arc::clone(&self.stats)
    }

    async fn dial(self) -> io::Result<TokioIo<Counted>> {
        self.stats.started.fetch_add(1, Ordering::Relaxed);
        let connecting = async {
            let tcp = TcpStream::connect(&*self.address).await?;
            // gRPC's frames are small and each waits for its answer.
            tcp.set_nodelay(true)?;
            self.tls.connect(self.server_name.clone(), tcp).await
        };
        let failed = |e: io::Error| {
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
            // Closed by the peer (refused, reset, ended mid-handshake), else by us (a timeout,
            // a certificate refused), as Envoy tells its connection's close events apart.
            let by_peer = matches!(
                e.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::HostUnreachable
                    | io::ErrorKind::NetworkUnreachable
            );
            let closed = match by_peer {
                true => &self.stats.closed_remote,
                false => &self.stats.closed_local,
            };
            closed.fetch_add(1, Ordering::Relaxed);
            io::Error::new(e.kind(), format!("{}: {e}", self.address))
        };
        match tokio::time::timeout(self.timeout, connecting).await {
            Ok(Ok(tls)) => Ok(TokioIo::new(Counted {
                inner: tls,
                stats: Arc::clone(&self.stats),
                remote_end: false,
            })),
            Ok(Err(e)) => Err(failed(e)),
            Err(_) => {
                self.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                Err(failed(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("not connected within {:?}", self.timeout),
                )))
            }
        }
    }
}

impl tonic::codegen::Service<http::Uri> for Dialer {
    type Response = TokioIo<Counted>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<Counted>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        Box::pin(self.clone().dial())
    }
}

/// A connection to istiod whose bytes are counted as they pass, and whose end is counted as
/// it is dropped: by istiod when it had ended or failed the stream, else by Remora.
#[derive(Debug)]
pub struct Counted {
    inner: TlsStream<TcpStream>,
    stats: Arc<ConnectionStats>,
    remote_end: bool,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let closed = match self.remote_end {
            true => &self.stats.closed_remote,
            false => &self.stats.closed_local,
        };
        closed.fetch_add(1, Ordering::Relaxed);
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        match &polled {
            Poll::Ready(Ok(())) if read == 0 && buf.remaining() > 0 => self.remote_end = true,
            Poll::Ready(Ok(())) => {
                self.stats
                    .received
                    .fetch_add(read as u64, Ordering::Relaxed);
            }
            Poll::Ready(Err(_)) => self.remote_end = true,
            Poll::Pending => {}
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.stats.sent.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &polled {
            self.stats.sent.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_dial_is_made_and_failed_and_an_open_one_active() {
        let s = ConnectionStats::default();
        for _ in 0..3 {
            s.started.fetch_add(1, Ordering::Relaxed);
        }
        // One timed out (closed by us), one up and closed by istiod, one up.
        s.failed.fetch_add(1, Ordering::Relaxed);
        s.timed_out.fetch_add(1, Ordering::Relaxed);
        s.closed_local.fetch_add(1, Ordering::Relaxed);
        s.closed_remote.fetch_add(1, Ordering::Relaxed);
        s.received.fetch_add(500, Ordering::Relaxed);
        let stats = s.envoy_stats();
        let value = |name: &str| stats.iter().find(|(n, _, _)| *n == name).map(|s| s.2);
        for (name, expected) in [
            ("upstream_cx_total", 3),
            ("upstream_cx_http2_total", 3),
            ("upstream_cx_connect_fail", 1),
            ("upstream_cx_connect_timeout", 1),
            ("upstream_cx_destroy", 2),
            ("upstream_cx_destroy_remote", 1),
            ("upstream_cx_destroy_local", 1),
            ("upstream_cx_active", 1),
            ("upstream_cx_rx_bytes_total", 500),
        ] {
            assert_eq!(value(name), Some(expected), "{name}");
        }
    }
}
