//! One connection, top to bottom: where it was going, whether it would loop, the upstream
//! connection, the copy, and the record of it (metrics, access log).

use crate::access_log::{AccessLog, End, Entry};
use crate::connect::{self, ConnectError};
use crate::drain::Drain;
use crate::loop_guard::{Guard, LoopGuard};
use crate::metrics::Metrics;
use crate::tcp::{self, CopyError, Transfer};
use crate::{orig_dst, Direction};
use arc_swap::ArcSwap;
use remora_config::Config;
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
}

/// Where a listener's connections go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A capture listener: to the original destination.
    Capture(Direction),
    /// An explicit listener: always to this upstream. Counted as outbound.
    Fixed(SocketAddr),
}

impl Route {
    /// The direction metrics and logs file the connection under.
    pub fn direction(self) -> Direction {
        match self {
            Route::Capture(d) => d,
            Route::Fixed(_) => Direction::Outbound,
        }
    }
}

/// What happened to one connection.
struct Outcome {
    destination: Option<SocketAddr>,
    transfer: Transfer,
    end: End,
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

        let outcome = self.proxy(&config, &downstream, peer, route).await;

        m.connection_closed(
            outcome.end.response_flag(),
            outcome.transfer.sent,
            outcome.transfer.received,
        );
        if config.access_log.enabled {
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
        &self,
        config: &Config,
        downstream: &TcpStream,
        peer: SocketAddr,
        route: Route,
    ) -> Outcome {
        let dir = route.direction();
        let destination = match route {
            Route::Fixed(upstream) => upstream,
            Route::Capture(_) => match orig_dst::original_dst(downstream) {
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
            reset(downstream);
            return refused(Some(destination), End::LoopRefused(guard));
        }

        let (source, timeout) = upstream_settings(config, dir, destination);
        let upstream = match connect::connect(destination, source, timeout, &self.loop_guard).await
        {
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
        let _ = downstream.set_nodelay(true);

        let (transfer, end) = match tcp::copy_bidirectional(downstream, &upstream.stream).await {
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
        }
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
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        let fut = proxy.serve(stream, peer, Route::Capture(Direction::Outbound));
        let size = std::mem::size_of_val(&fut);
        eprintln!("connection future: {size} bytes");
        assert!(size <= 1536, "connection future is {size} bytes");
    }
}
