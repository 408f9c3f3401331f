//! One connection, top to bottom: where it was going, whether it would loop, what it speaks
//! (detection, while the upstream connection is already being opened), then the copy of opaque
//! bytes or the HTTP proxy, and the record of it (metrics, access log).

use crate::access_log::{AccessLog, End, Entry};
use crate::connect::{self, ConnectError, Upstream};
use crate::detect::{self, Verdict};
use crate::drain::Drain;
use crate::http::{self, pool::Pool};
use crate::loop_guard::{Guard, LoopGuard};
use crate::metrics::Metrics;
use crate::tcp::{self, CopyError, Transfer};
use crate::{orig_dst, Direction};
use arc_swap::ArcSwap;
use remora_config::{Config, ListenerProtocol};
use socket2::SockRef;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::net::TcpStream;

/// Everything a connection needs, shared by all of them.
#[derive(Debug)]
pub struct Proxy {
    /// The current config; a reload swaps in a new snapshot, which new connections pick up.
    pub config: Arc<ArcSwap<Config>>,
    pub loop_guard: Arc<LoopGuard>,
    pub metrics: Arc<Metrics>,
    pub drain: Arc<Drain>,
    pub access_log: AccessLog,
    /// Idle upstream HTTP connections, shared by every downstream connection.
    pub pool: Arc<Pool>,
}

/// Where a listener's connections go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A capture listener: to the original destination.
    Capture(Direction),
    /// An explicit listener: always to this upstream, as this protocol. Counted as outbound.
    Fixed(SocketAddr, ListenerProtocol),
}

impl Route {
    /// The direction metrics and logs file the connection under.
    pub fn direction(self) -> Direction {
        match self {
            Route::Capture(d) => d,
            Route::Fixed(..) => Direction::Outbound,
        }
    }
}

/// How a connection is handled before anything is read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Opaque bytes, no detection: declared `tcp`-like, or one of Istio's always-TCP ports.
    Tcp,
    /// Declared HTTP: only HTTP/1 versus HTTP/2 is read from the client; the server is not
    /// expected to speak first.
    Http,
    /// Detect, with server-first protocols decided by the server's first byte.
    Auto,
}

/// What happened to one connection.
struct Outcome {
    destination: Option<SocketAddr>,
    transfer: Transfer,
    end: End,
    /// Served as HTTP (each request has its own access-log line).
    http: bool,
}

impl Proxy {
    /// Serve one accepted connection until it is finished.
    pub async fn serve(self: Arc<Self>, downstream: TcpStream, peer: SocketAddr, route: Route) {
        let dir = route.direction();
        let _active = self.drain.track();
        let config = self.config.load_full();
        let started = (SystemTime::now(), Instant::now());
        let m = self.metrics.direction(dir);
        m.connection_opened();
        let peer = orig_dst::canonical(peer);

        let outcome = self.proxy(&config, downstream, peer, route).await;

        m.connection_closed(
            outcome.end.response_flag(),
            outcome.transfer.sent,
            outcome.transfer.received,
        );
        // HTTP connections log each request instead.
        if config.access_log.enabled && !outcome.http {
            let entry = Entry {
                start: started.0,
                direction: dir,
                source: peer,
                destination: outcome.destination,
                sent: outcome.transfer.sent,
                received: outcome.transfer.received,
                duration: started.1.elapsed(),
                end: outcome.end,
            };
            self.access_log.log(&entry, config.access_log.format);
        }
    }

    async fn proxy(
        self: &Arc<Self>,
        config: &Arc<Config>,
        downstream: TcpStream,
        peer: SocketAddr,
        route: Route,
    ) -> Outcome {
        let dir = route.direction();
        let destination = match route {
            Route::Fixed(upstream, _) => upstream,
            Route::Capture(_) => match orig_dst::original_dst(&downstream) {
                Ok((dst, _)) => dst,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "no destination for connection");
                    return refused(None, End::NoDestination);
                }
            },
        };
        if let Some(guard) = self.loop_guard.check(peer, destination) {
            let counter = match guard {
                Guard::OwnListener => &self.metrics.loop_refused_own_listener,
                Guard::OwnUpstream => &self.metrics.loop_refused_own_upstream,
            };
            counter.inc();
            tracing::warn!(
                %peer, %destination, guard = guard.as_str(), direction = dir.as_str(),
                "refused a connection that would loop into Remora"
            );
            reset(&downstream);
            return refused(Some(destination), End::LoopRefused(guard));
        }
        let _ = downstream.set_nodelay(true);

        let (source, timeout) = upstream_settings(config, dir, destination);
        let mut mode = mode(config, route, destination);
        if mode == Mode::Auto && self.pool.speaks_http(destination, source) {
            // A pooled HTTP connection to it exists: no need to dial early or to watch for a
            // server that speaks first, and no new upstream connection per client connection.
            mode = Mode::Http;
        }
        if mode == Mode::Tcp {
            let upstream = connect::connect(destination, source, timeout, &self.loop_guard).await;
            return self
                .tcp(dir, &downstream, peer, destination, &[], upstream)
                .await;
        }

        // Detection reads the client while the upstream connection is being opened; in auto
        // mode a server that speaks first ends it at once.
        let (wait, watch_server) = match mode {
            Mode::Auto => (config.detection.timeout, true),
            _ => (config.http.header_read_timeout, false),
        };
        // On the heap, and freed when detection ends: a long-lived connection does not keep
        // paying for the detection and connect futures.
        let (verdict, prefix, upstream) = Box::pin(async {
            let connecting = async {
                if watch_server {
                    connect::connect(destination, source, timeout, &self.loop_guard).await
                } else {
                    // Declared or known HTTP: the pool serves the requests; nothing to dial.
                    std::future::pending().await
                }
            };
            tokio::pin!(connecting);
            let detected =
                detect::detect(&downstream, connecting.as_mut(), wait, watch_server).await;
            let upstream = match detected.upstream {
                Some(done) => Some(done),
                None if watch_server => Some(connecting.await),
                None => None,
            };
            (detected.verdict, detected.prefix, upstream)
        })
        .await;
        tracing::debug!(%peer, %destination, ?verdict, ?mode, "detected");
        match verdict {
            Verdict::Http(version) => {
                // The HTTP path lives on the heap: it is larger than the TCP path and every
                // idle TCP connection would otherwise pay for it.
                let (end, transfer) = Box::pin(http::serve(
                    Arc::clone(self),
                    Arc::clone(config),
                    http::Connection {
                        downstream,
                        peer,
                        direction: dir,
                        destination,
                        source,
                        connect_timeout: timeout,
                        version,
                        prefix,
                        early: upstream.and_then(Result::ok),
                    },
                ))
                .await;
                Outcome {
                    destination: Some(destination),
                    transfer,
                    end,
                    http: true,
                }
            }
            Verdict::ClientFailed => refused(Some(destination), End::DownstreamReset),
            Verdict::Tls
            | Verdict::Opaque
            | Verdict::ServerFirst
            | Verdict::Timeout
            | Verdict::ClientClosed => {
                let upstream = match upstream {
                    Some(up) => up,
                    None => connect::connect(destination, source, timeout, &self.loop_guard).await,
                };
                self.tcp(dir, &downstream, peer, destination, &prefix, upstream)
                    .await
            }
        }
    }

    /// Copy opaque bytes, after the `prefix` detection read.
    async fn tcp(
        &self,
        dir: Direction,
        downstream: &TcpStream,
        peer: SocketAddr,
        destination: SocketAddr,
        prefix: &[u8],
        upstream: Result<Upstream, ConnectError>,
    ) -> Outcome {
        let upstream = match upstream {
            Ok(up) => up,
            Err(e) => {
                self.metrics.direction(dir).connect_failures.inc();
                tracing::debug!(%peer, error = %e, direction = dir.as_str(), "upstream connect failed");
                // Close the client at once, with a reset: the destination refused or never
                // answered, and a clean FIN would look like an empty but successful exchange.
                reset(downstream);
                let end = match e {
                    ConnectError::Timeout { .. } => End::ConnectTimeout,
                    ConnectError::Io { .. } => End::ConnectFailed,
                };
                return refused(Some(destination), end);
            }
        };
        let copied = tcp::copy_bidirectional_after(prefix, downstream, &upstream.stream).await;
        let (transfer, end) = match copied {
            Ok(t) => (t, End::Closed),
            Err(e) => {
                tracing::debug!(%peer, %destination, error = %e, "connection ended with an error");
                let end = match e {
                    CopyError::Downstream { .. } => End::DownstreamReset,
                    CopyError::Upstream { .. } => End::UpstreamReset,
                };
                (e.transfer(), end)
            }
        };
        Outcome {
            destination: Some(destination),
            transfer,
            end,
            http: false,
        }
    }
}

/// Whether to detect, and how, from the listener and the destination port's declaration.
fn mode(config: &Config, route: Route, destination: SocketAddr) -> Mode {
    match route {
        Route::Fixed(_, ListenerProtocol::Tcp) => Mode::Tcp,
        Route::Fixed(_, ListenerProtocol::Http) => Mode::Http,
        Route::Fixed(_, ListenerProtocol::Auto) => Mode::Auto,
        Route::Capture(_) => match config.declared_protocol(destination.port()) {
            Some(p) if p.is_http() => Mode::Http,
            Some(_) => Mode::Tcp,
            None => Mode::Auto,
        },
    }
}

/// The source address and connect timeout for the upstream hop.
fn upstream_settings(
    config: &Config,
    dir: Direction,
    destination: SocketAddr,
) -> (Option<IpAddr>, Duration) {
    match dir {
        Direction::Outbound => (None, config.outbound.connect_timeout),
        // Inbound traffic is delivered from the passthrough source, which the capture rules let
        // through; from any other address the hop would be captured into 15006 again.
        Direction::Inbound => {
            let source = match destination {
                SocketAddr::V4(_) => IpAddr::V4(config.inbound.passthrough_source_v4),
                SocketAddr::V6(_) => IpAddr::V6(config.inbound.passthrough_source_v6),
            };
            (Some(source), config.inbound.connect_timeout)
        }
    }
}

fn refused(destination: Option<SocketAddr>, end: End) -> Outcome {
    Outcome {
        destination,
        transfer: Transfer::default(),
        end,
        http: false,
    }
}

/// Make the close of `stream` a reset. Failure means the peer is already gone.
fn reset(stream: &TcpStream) {
    let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    /// Every open connection holds one of these futures; its size is memory per connection
    /// before any buffer is allocated. Raise the bound only knowingly.
    #[tokio::test]
    async fn connection_future_stays_small() {
        let metrics = Arc::new(Metrics::default());
        let proxy = Arc::new(Proxy {
            config: Arc::new(ArcSwap::from_pointee(Config::default())),
            loop_guard: LoopGuard::new(vec![]),
            metrics: Arc::clone(&metrics),
            drain: Drain::new(),
            access_log: AccessLog::start(metrics).unwrap(),
            pool: Arc::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        {
            let guard = LoopGuard::new(vec![]);
            let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
            let c = connect::connect(addr, None, Duration::from_secs(1), &guard);
            eprintln!("connect: {}", std::mem::size_of_val(&c));
            let up = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let t = tcp::copy_bidirectional_after(&[], &up, &up);
            eprintln!("copy_after: {}", std::mem::size_of_val(&t));
            let t2 = tcp::copy_bidirectional(&up, &up);
            eprintln!("copy: {}", std::mem::size_of_val(&t2));
            tokio::pin!(c);
            let d = detect::detect(&up, c.as_mut(), Duration::from_secs(1), true);
            eprintln!("detect: {}", std::mem::size_of_val(&d));
        }
        let fut = proxy.serve(stream, peer, Route::Capture(Direction::Outbound));
        let size = std::mem::size_of_val(&fut);
        eprintln!("connection future: {size} bytes");
        assert!(size <= 1536, "connection future is {size} bytes");
    }
}
