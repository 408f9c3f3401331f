//! A hyper server connection driven to its end: shut down gracefully when idle, when draining
//! starts (inbound), or when xDS retires the chain it started on (and closed when that chain's
//! drain time has run out); dropped at once when the client trips the Rapid Reset guard.

use super::ConnContext;
use crate::detect::HttpVersion;
use crate::metrics::http_conn_manager::ClosedFor;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;

/// Run a server connection until it ends, shutting it down gracefully (GOAWAY, or
/// `Connection: close` after the request in flight) when it has been idle — no request in
/// flight and no traffic — for `http.idle_timeout`. While draining, as Envoy's connection
/// manager drains (`--drain-strategy immediate`), an inbound HTTP/1.1 connection stays open with
/// its next response carrying `Connection: close` (a client cut while idle could lose the
/// request it is writing), and an inbound HTTP/2 one gets its GOAWAY once it has had a request:
/// at once if it had one, else when its first starts — so a connection opened while draining,
/// the listener accepting on, is served its first streams and then told to go (a GOAWAY before
/// its preface would end it unserved). Outbound keeps serving while draining: the application
/// may still need its peers.
pub(super) async fn drive<C>(
    conn: C,
    ctx: &ConnContext,
    shutdown: impl Fn(Pin<&mut C>),
) -> Result<(), hyper::Error>
where
    C: Future<Output = Result<(), hyper::Error>>,
{
    tokio::pin!(conn);
    let draining = ctx.drain_started();
    tokio::pin!(draining);
    let watch = ctx.chain_watch.as_ref();
    let retired = async {
        match watch {
            Some(w) => w.retired().await,
            None => std::future::pending().await,
        }
    };
    let cut = crate::chain_drain::deadline(watch, ctx.config.drain.drain_time);
    tokio::pin!(retired, cut);
    let every = ctx.config.http.idle_timeout;
    let mut idle_check = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let mut last_activity = u64::MAX;
    let mut shutting_down = false;
    // HTTP/2 while draining: the GOAWAY waits for the connection's first request.
    let mut drain_seen = false;
    let mut goaway_due = false;
    let first_request = ctx.first_request_started();
    tokio::pin!(first_request);
    loop {
        tokio::select! {
            result = &mut conn => return result,
            // Rapid Reset: the connection is dropped at once, streams and all.
            () = ctx.resets.tripped() => {
                tracing::warn!(peer = %ctx.peer, "closing an HTTP/2 connection: too many streams reset early by the client");
                ctx.proxy.metrics.direction(ctx.direction).premature_reset_closes.inc();
                ctx.closed_for(ClosedFor::PrematureResets);
                return Ok(());
            }
            () = &mut draining, if !drain_seen => {
                drain_seen = true;
                ctx.closing.store(true, Ordering::Relaxed);
                goaway_due = ctx.key.version == HttpVersion::Http2;
            }
            () = &mut first_request, if goaway_due && !shutting_down => {
                shutdown(conn.as_mut());
                shutting_down = true;
            }
            // istiod changed or removed the connection's chain: drained as Envoy drains a
            // chain's connections (HTTP/2: GOAWAY, the streams in flight finish; HTTP/1.1:
            // `Connection: close` on the next response), so the client's next connection
            // takes the chain in force.
            () = &mut retired, if !ctx.closing() => {
                tracing::debug!(peer = %ctx.peer, "draining a connection whose chain an update changed");
                ctx.closing.store(true, Ordering::Relaxed);
                if ctx.key.version == HttpVersion::Http2 && !shutting_down {
                    shutdown(conn.as_mut());
                    shutting_down = true;
                }
            }
            // The chain's drain time ran out: closed, streams and all, as Envoy closes the
            // connections of a removed chain (`filter_chain_is_being_removed`).
            () = &mut cut => {
                tracing::info!(peer = %ctx.peer, "closing an HTTP connection whose filter chain an xDS update changed or removed: its drain time ran out");
                ctx.proxy.metrics.direction(ctx.direction).chain_drain_closes.inc();
                return Ok(());
            }
            _ = idle_check.tick(), if !shutting_down => {
                let activity = ctx.activity();
                if ctx.in_flight.load(Ordering::Relaxed) == 0 && activity == last_activity {
                    tracing::debug!(peer = %ctx.peer, "closing idle HTTP connection");
                    ctx.proxy.metrics.direction(ctx.direction).http_idle_timeouts.inc();
                    ctx.closed_for(ClosedFor::IdleTimeout);
                    shutdown(conn.as_mut());
                    shutting_down = true;
                }
                last_activity = activity;
            }
        }
    }
}
