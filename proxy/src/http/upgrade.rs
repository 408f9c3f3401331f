//! After `101 Switching Protocols` (WebSocket and other HTTP/1.1 upgrades) the two connections
//! become one byte tunnel, copied both ways until either side closes. The request ends with the
//! tunnel, as Envoy logs and counts an upgrade: its access-log line and Istio's request metrics
//! are written then, with the tunnel's duration and bytes.

use super::body::RequestEnd;
use crate::drain::Active;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// Join the client's and the upstream's upgraded connections once both are handed over. The
/// tunnel counts as an open connection for draining; `end` is the request's, written when the
/// tunnel closes.
pub fn tunnel(downstream: OnUpgrade, upstream: OnUpgrade, active: Active, mut end: RequestEnd) {
    // The 101 went out whole: how the tunnel ends is the application's business.
    end.complete = true;
    tokio::spawn(async move {
        let _active = active;
        let (down, up) = match tokio::try_join!(downstream, upstream) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade did not complete");
                return;
            }
        };
        let (mut down, mut up) = (TokioIo::new(down), TokioIo::new(up));
        match crate::tcp::relay(&mut down, &mut up).await {
            Ok((to_upstream, to_downstream)) => {
                end.received.add(to_upstream);
                end.sent += to_downstream;
            }
            Err(e) => tracing::debug!(error = %e, "upgraded connection ended with an error"),
        }
        // Logged and counted here.
        drop(end);
    });
}
