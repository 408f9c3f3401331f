//! After `101 Switching Protocols` (WebSocket and other HTTP/1.1 upgrades) the request is over
//! and the two connections become one byte tunnel, copied both ways until either side closes.

use crate::drain::Active;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// Join the client's and the upstream's upgraded connections once both are handed over. The
/// tunnel counts as an open connection for draining.
pub fn tunnel(downstream: OnUpgrade, upstream: OnUpgrade, active: Active) {
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
        if let Err(e) = tokio::io::copy_bidirectional(&mut down, &mut up).await {
            tracing::debug!(error = %e, "upgraded connection ended with an error");
        }
    });
}
