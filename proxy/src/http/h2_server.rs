//! The HTTP/2 server on a client connection: h2's settings, each named rather than left to a
//! default that an upgrade may move (docs/hardening.md says why each value).

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// hyper's HTTP/2 server for a client connection: at most `max_streams` streams at once, and
/// header lists of at most `max_header_bytes`.
pub fn builder(max_streams: u32, max_header_bytes: usize) -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(max_streams)
        .max_header_list_size(u32::try_from(max_header_bytes).unwrap_or(u32::MAX))
        // Against Rapid Reset and MadeYouReset.
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESET_STREAMS)
        .max_send_buf_size(MAX_SEND_BUF)
        .initial_stream_window_size(RECEIVE_WINDOW)
        .initial_connection_window_size(RECEIVE_WINDOW);
    builder
}

/// HTTP/2 client connections: response bytes queued per stream while the client's socket
/// does not take them (hyper's `max_send_buf_size`, about 400 KiB by default). A client that
/// grants every window and then reads nothing makes Remora hold that per stream; 64 KiB is four
/// full DATA frames, enough to keep a stream moving while the socket drains. Over all the
/// connection's streams, [`super::send_budget`] bounds it to 1 MiB.
pub const MAX_SEND_BUF: usize = 64 * 1024;

/// HTTP/2 client connections: the receive window of each stream and of the whole connection,
/// so what a client can make Remora hold of its request bodies while the upstream does not
/// take them: 1 MiB per connection over all its streams, as Envoy's default
/// `per_connection_buffer_limit_bytes` (hyper's defaults, named so that an upgrade cannot move
/// them). Past the client's window, each stream's upstream send buffer
/// ([`super::pool::UPSTREAM_H2_SEND_BUF`]) holds what the upstream has not taken.
pub const RECEIVE_WINDOW: u32 = 1 << 20;

/// HTTP/2 client connections: streams the client may reset before hyper accepts them, before
/// GOAWAY(ENHANCE_YOUR_CALM) (Rapid Reset in one write; h2's own default).
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
/// HTTP/2 client connections: streams the proxy may have to reset for the client's protocol
/// errors over the connection's life, before GOAWAY(ENHANCE_YOUR_CALM) (MadeYouReset,
/// CVE-2025-8671). A well-behaved client causes none; under the 250 early resets of
/// [`super::premature_reset`], so that this attack ends with h2's GOAWAY rather than a plain close.
pub const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 100;
