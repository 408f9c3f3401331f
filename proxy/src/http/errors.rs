//! What can go wrong with one request, where (downstream, upstream or inside Remora), whether it
//! may be retried, and how it is reported: Envoy's response flag, the HTTP status of the local
//! reply, and the gRPC status when the client speaks gRPC.

use std::fmt;
use std::net::SocketAddr;

/// Envoy's response flags, as a set. Displayed the way Envoy prints them: `URX,UF`, or `-`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Flags(u16);

impl Flags {
    /// Upstream connection failure.
    pub const UF: Flags = Flags(1);
    /// Upstream connection termination (before or during the response).
    pub const UC: Flags = Flags(1 << 1);
    /// Upstream remote reset of the stream.
    pub const UR: Flags = Flags(1 << 2);
    /// Upstream request timeout.
    pub const UT: Flags = Flags(1 << 3);
    /// Upstream retry limit exceeded.
    pub const URX: Flags = Flags(1 << 4);
    /// Downstream protocol error: a malformed request.
    pub const DPE: Flags = Flags(1 << 5);
    /// Downstream connection termination before the response was complete.
    pub const DC: Flags = Flags(1 << 6);
    /// Upstream protocol error: a malformed response.
    pub const UPE: Flags = Flags(1 << 7);
    /// No route (xDS: no virtual host or route for the request).
    pub const NR: Flags = Flags(1 << 8);
    /// No cluster (xDS: the route names a cluster that does not exist).
    pub const NC: Flags = Flags(1 << 9);
    /// No healthy upstream host in the cluster.
    pub const UH: Flags = Flags(1 << 10);
    /// The fault filter delayed the request.
    pub const DI: Flags = Flags(1 << 11);
    /// The fault filter aborted the request (answered it here).
    pub const FI: Flags = Flags(1 << 12);
    /// Upstream overflow: a circuit breaker of the cluster was open.
    pub const UO: Flags = Flags(1 << 13);
    /// The external authorizer denied the request, or failed and failure was not allowed
    /// (Envoy's `UAEX`, set by its ext_authz filter).
    pub const UAEX: Flags = Flags(1 << 14);

    /// In the order Envoy 1.40 prints them: as it sets them, so the fault filter's first
    /// (a delay before its abort), and the retry limit before the failure of the last attempt
    /// (`URX,UF`).
    const NAMES: [(Flags, &'static str); 15] = [
        (Flags::DI, "DI"),
        (Flags::FI, "FI"),
        (Flags::URX, "URX"),
        (Flags::UF, "UF"),
        (Flags::UC, "UC"),
        (Flags::UR, "UR"),
        (Flags::UT, "UT"),
        (Flags::DPE, "DPE"),
        (Flags::DC, "DC"),
        (Flags::UPE, "UPE"),
        (Flags::NR, "NR"),
        (Flags::NC, "NC"),
        (Flags::UH, "UH"),
        (Flags::UO, "UO"),
        (Flags::UAEX, "UAEX"),
    ];

    /// The set as bits, one per flag.
    pub fn bits(self) -> u16 {
        self.0
    }

    /// Add `other` to the set.
    pub fn insert(&mut self, other: Flags) {
        self.0 |= other.0;
    }

    /// Clear `other`'s flags.
    pub fn remove(&mut self, other: Flags) {
        self.0 &= !other.0;
    }

    /// Whether every flag of `other` is set.
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether no flag is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Envoy's name of each flag set, in Envoy's order (what an access log's
    /// `response_flag_filter` compares).
    pub fn names(self) -> impl Iterator<Item = &'static str> + Clone {
        Flags::NAMES
            .into_iter()
            .filter(move |(flag, _)| self.contains(*flag))
            .map(|(_, name)| name)
    }
}

impl fmt::Display for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("-");
        }
        let mut first = true;
        for (flag, name) in Flags::NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str(",")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

/// Which party a failure belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Downstream,
    Upstream,
    Internal,
}

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The upstream connection could not be opened (refused, unreachable, handshake failed).
    ConnectFailed,
    /// The upstream connection was not opened within the connect timeout.
    ConnectTimeout,
    /// The upstream connection ended before the response headers.
    ConnectionTerminated,
    /// The upstream refused the HTTP/2 stream (REFUSED_STREAM): it never processed it.
    RefusedStream,
    /// The upstream reset the stream before the response headers.
    RemoteReset,
    /// The upstream's response could not be parsed.
    UpstreamProtocol,
    /// No response within the request's timeout (`grpc-timeout` or `http.request_timeout`).
    Timeout,
    /// The request is malformed; it is answered here and never forwarded.
    MalformedRequest(&'static str),
    /// The path cannot be normalised (a NUL): Envoy's connection manager
    /// answers 400 with no body and no flag (`path_normalization_failed`), closing an HTTP/1.1
    /// connection.
    UnnormalizablePath,
    /// An HTTP/1.1 request without a Host: Envoy's connection manager answers it 400 with no
    /// body and no flag (`missing_host_header`), not as a protocol error.
    MissingHost,
    /// The request has more headers than `http.max_headers`; never forwarded.
    HeadersTooLarge,
    /// An authorization policy denied the request (Envoy's RBAC filter); never forwarded.
    AccessDenied,
    /// The client's request body ended early (it reset or closed) while it went upstream: no
    /// response reaches it, and Envoy logs response code 0 with `DC`.
    DownstreamAborted,
    /// ext_authz's `with_request_body`: the body is over `max_request_bytes` and partial
    /// messages are not allowed (413, never forwarded).
    PayloadTooLarge,
    /// xDS: a target that is not a path (`OPTIONS *`): Envoy's connection manager answers it
    /// 404 with no flag (`absolute_path`) before any filter or route.
    NonRelativePath,
    /// xDS: no virtual host or route matches the request (404 `NR`).
    NoRoute,
    /// xDS: the route's cluster does not exist (503 `NC`).
    NoCluster,
    /// xDS: the cluster has no healthy endpoint, or none that can be reached as configured
    /// (503 `UH`).
    NoHealthyUpstream,
    /// xDS: a circuit breaker of the cluster is open (503 `UO`); never sent upstream.
    Overflow,
}

impl ErrorKind {
    /// Who is at fault.
    pub fn origin(self) -> Origin {
        match self {
            ErrorKind::MalformedRequest(_)
            | ErrorKind::UnnormalizablePath
            | ErrorKind::MissingHost
            | ErrorKind::HeadersTooLarge
            | ErrorKind::AccessDenied
            | ErrorKind::DownstreamAborted
            | ErrorKind::NonRelativePath
            | ErrorKind::PayloadTooLarge => Origin::Downstream,
            ErrorKind::Timeout
            | ErrorKind::NoRoute
            | ErrorKind::NoCluster
            | ErrorKind::NoHealthyUpstream => Origin::Internal,
            _ => Origin::Upstream,
        }
    }

    /// Envoy's response flag for it.
    pub fn flag(self) -> Flags {
        match self {
            ErrorKind::ConnectFailed | ErrorKind::ConnectTimeout => Flags::UF,
            ErrorKind::ConnectionTerminated => Flags::UC,
            ErrorKind::RefusedStream | ErrorKind::RemoteReset => Flags::UR,
            ErrorKind::UpstreamProtocol => Flags::UPE,
            ErrorKind::Timeout => Flags::UT,
            ErrorKind::MalformedRequest(_) | ErrorKind::HeadersTooLarge => Flags::DPE,
            // Envoy's RBAC filter sets no flag, only its response code details.
            ErrorKind::AccessDenied | ErrorKind::MissingHost | ErrorKind::UnnormalizablePath => {
                Flags::default()
            }
            ErrorKind::DownstreamAborted => Flags::DC,
            ErrorKind::PayloadTooLarge | ErrorKind::NonRelativePath => Flags::default(),
            ErrorKind::NoRoute => Flags::NR,
            ErrorKind::NoCluster => Flags::NC,
            ErrorKind::NoHealthyUpstream => Flags::UH,
            ErrorKind::Overflow => Flags::UO,
        }
    }

    /// Whether Istio's default retry policy retries it: `connect-failure` and `refused-stream`.
    /// Other resets are not retried: the upstream may have acted on the request.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::ConnectFailed | ErrorKind::ConnectTimeout | ErrorKind::RefusedStream
        )
    }

    /// The status of the local reply, as Envoy answers.
    pub fn status(self) -> http::StatusCode {
        use http::StatusCode;
        match self {
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::UpstreamProtocol => StatusCode::BAD_GATEWAY,
            ErrorKind::MalformedRequest(_)
            | ErrorKind::MissingHost
            | ErrorKind::UnnormalizablePath => StatusCode::BAD_REQUEST,
            ErrorKind::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorKind::AccessDenied => StatusCode::FORBIDDEN,
            ErrorKind::NoRoute | ErrorKind::NonRelativePath => StatusCode::NOT_FOUND,
            // Nobody reads it; the request's metrics and log say 0, as Envoy's do.
            ErrorKind::DownstreamAborted => StatusCode::BAD_REQUEST,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The gRPC status of the local reply to a gRPC client.
    pub fn grpc_status(self) -> u8 {
        match self {
            // DEADLINE_EXCEEDED
            ErrorKind::Timeout => 4,
            // INTERNAL
            ErrorKind::MalformedRequest(_)
            | ErrorKind::MissingHost
            | ErrorKind::UnnormalizablePath
            | ErrorKind::HeadersTooLarge
            | ErrorKind::UpstreamProtocol => 13,
            // PERMISSION_DENIED, as Envoy maps a 403.
            ErrorKind::AccessDenied => 7,
            // UNIMPLEMENTED, as Envoy maps a 404.
            ErrorKind::NoRoute | ErrorKind::NonRelativePath => 12,
            // CANCELLED: the client went away.
            ErrorKind::DownstreamAborted => 1,
            // UNKNOWN, as Envoy maps a 413.
            ErrorKind::PayloadTooLarge => 2,
            // UNAVAILABLE: the call may be retried by the client.
            _ => 14,
        }
    }

    /// The body of the local reply, worded as Envoy words it.
    pub fn details(self) -> &'static str {
        match self {
            ErrorKind::ConnectFailed => {
                "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"
            }
            ErrorKind::ConnectTimeout => {
                "upstream connect error or disconnect/reset before headers. reset reason: connection timeout"
            }
            ErrorKind::ConnectionTerminated => {
                "upstream connect error or disconnect/reset before headers. reset reason: connection termination"
            }
            ErrorKind::RefusedStream => {
                "upstream connect error or disconnect/reset before headers. reset reason: remote refused stream reset"
            }
            ErrorKind::RemoteReset => {
                "upstream connect error or disconnect/reset before headers. reset reason: remote reset"
            }
            ErrorKind::UpstreamProtocol => {
                "upstream connect error or disconnect/reset before headers. reset reason: protocol error"
            }
            ErrorKind::Timeout => "upstream request timeout",
            ErrorKind::MalformedRequest(why) => why,
            ErrorKind::MissingHost => "missing_host_header",
            ErrorKind::UnnormalizablePath => "path_normalization_failed",
            ErrorKind::HeadersTooLarge => "request headers too large",
            ErrorKind::AccessDenied => "RBAC: access denied",
            ErrorKind::DownstreamAborted => "downstream_remote_disconnect",
            ErrorKind::PayloadTooLarge => "request_payload_too_large",
            ErrorKind::NonRelativePath => "absolute_path",
            ErrorKind::NoRoute => "route_not_found",
            ErrorKind::NoCluster => "cluster_not_found",
            ErrorKind::NoHealthyUpstream => "no healthy upstream",
            ErrorKind::Overflow => {
                "upstream connect error or disconnect/reset before headers. reset reason: overflow"
            }
        }
    }

    /// Envoy's `response_code_details` for a reply to this failure (`None` where Remora does
    /// not know Envoy's exact words: a malformed request's codec detail, a policy's match).
    pub fn code_details(self) -> Option<&'static str> {
        Some(match self {
            ErrorKind::ConnectFailed => {
                "upstream_reset_before_response_started{remote_connection_failure}"
            }
            ErrorKind::ConnectTimeout => {
                "upstream_reset_before_response_started{connection_timeout}"
            }
            ErrorKind::ConnectionTerminated => {
                "upstream_reset_before_response_started{connection_termination}"
            }
            ErrorKind::RefusedStream => {
                "upstream_reset_before_response_started{remote_refused_stream_reset}"
            }
            ErrorKind::RemoteReset => "upstream_reset_before_response_started{remote_reset}",
            ErrorKind::UpstreamProtocol => "upstream_reset_before_response_started{protocol_error}",
            ErrorKind::Timeout => "upstream_response_timeout",
            ErrorKind::MissingHost => "missing_host_header",
            ErrorKind::UnnormalizablePath => "path_normalization_failed",
            ErrorKind::DownstreamAborted => "downstream_remote_disconnect",
            ErrorKind::PayloadTooLarge => "request_payload_too_large",
            ErrorKind::NonRelativePath => "absolute_path",
            ErrorKind::NoRoute => "route_not_found",
            ErrorKind::NoCluster => "cluster_not_found",
            ErrorKind::NoHealthyUpstream => "no_healthy_upstream",
            ErrorKind::Overflow => "upstream_reset_before_response_started{overflow}",
            ErrorKind::MalformedRequest(_)
            | ErrorKind::HeadersTooLarge
            | ErrorKind::AccessDenied => return None,
        })
    }

    /// The body of the local reply to a request whose retries ran out (`retried`) or not:
    /// Envoy's reply to a reset before the response then names the latest reason.
    pub fn reply_body(self, retried: bool) -> std::borrow::Cow<'static, str> {
        const RESET: &str =
            "upstream connect error or disconnect/reset before headers. reset reason: ";
        match self.body().strip_prefix(RESET) {
            Some(reason) if retried => format!(
                "upstream connect error or disconnect/reset before headers. retried and the latest reset reason: {reason}"
            )
            .into(),
            _ => self.body().into(),
        }
    }

    /// The body of the local reply: the details, but for those whose reply Envoy sends
    /// empty (no route, no cluster, no Host; the details are only for the log).
    pub fn body(self) -> &'static str {
        match self {
            ErrorKind::NoRoute
            | ErrorKind::NoCluster
            | ErrorKind::MissingHost
            | ErrorKind::NonRelativePath
            | ErrorKind::UnnormalizablePath => "",
            // Envoy's ext_authz answers its status's name.
            ErrorKind::PayloadTooLarge => "Payload Too Large",
            other => other.details(),
        }
    }
}

/// One failed request, with the upstream it was going to and the underlying error.
#[derive(Debug, thiserror::Error)]
#[error("{}: {upstream}{}", kind.details(), source.as_ref().map(|s| format!(": {s}")).unwrap_or_default())]
pub struct ProxyError {
    pub kind: ErrorKind,
    pub upstream: SocketAddr,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ProxyError {
    /// A failure of `kind` talking to `upstream`.
    pub fn new(
        kind: ErrorKind,
        upstream: SocketAddr,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ProxyError {
            kind,
            upstream,
            source: Some(source.into()),
        }
    }

    /// Whether the upstream connection said GOAWAY: no new stream should go on it.
    pub fn went_away(&self) -> bool {
        self.source
            .as_deref()
            .is_some_and(|e| refused_by_go_away(e as &(dyn std::error::Error + 'static)))
    }

    /// Classify an error of the HTTP client sending a request and awaiting its response head.
    pub fn from_send(upstream: SocketAddr, e: hyper::Error) -> Self {
        let kind = if let Some(kind) = request_body_failure(&e) {
            kind
        } else if e.is_parse() {
            ErrorKind::UpstreamProtocol
        } else if e.is_timeout() {
            ErrorKind::Timeout
        } else if refused_by_go_away(&e) {
            ErrorKind::RefusedStream
        } else {
            match h2_reason(&e) {
                Some(h2::Reason::REFUSED_STREAM) => ErrorKind::RefusedStream,
                Some(h2::Reason::NO_ERROR) | None => ErrorKind::ConnectionTerminated,
                Some(_) => ErrorKind::RemoteReset,
            }
        };
        ProxyError::new(kind, upstream, e)
    }
}

/// The client's fault, when sending failed because its request body did: hyper reports a
/// body's own error as the user's. Bytes that are no valid body framing (a bad chunk size) are
/// a malformed request (400, `DPE`); a body that just stopped (the client reset or left) is
/// the client gone (`DC`). Neither is the upstream's failure.
fn request_body_failure(e: &hyper::Error) -> Option<ErrorKind> {
    if !e.is_user() {
        return None;
    }
    let malformed = chain(e).skip(1).any(|c| {
        c.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_parse)
            || c.downcast_ref::<std::io::Error>().is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData
                )
            })
    });
    if malformed {
        return Some(ErrorKind::MalformedRequest("invalid request body framing"));
    }
    Some(ErrorKind::DownstreamAborted)
}

/// Whether the stream failed on the server's GOAWAY. h2 fails a stream with the peer's GOAWAY
/// only when its id is above the GOAWAY's last stream id, or when it was opened after it: the
/// server never processed it (RFC 9113 §6.8), so it is as safe to retry as a refused stream,
/// as Envoy retries it. A stream the server had taken and did not finish ends otherwise (a
/// broken pipe) and is not retried.
fn refused_by_go_away(e: &(dyn std::error::Error + 'static)) -> bool {
    first_h2(e).is_some_and(|h2| h2.is_go_away() && h2.is_remote())
}

/// The HTTP/2 error code carried somewhere in an error's source chain.
pub fn h2_reason(e: &(dyn std::error::Error + 'static)) -> Option<h2::Reason> {
    first_h2(e)?.reason()
}

/// The first h2 error in `e`'s source chain.
fn first_h2<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a h2::Error> {
    chain(e).find_map(|c| c.downcast_ref::<h2::Error>())
}

/// `e` and its sources. Chains are short; the bound only guards against a cycle.
fn chain<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |c| c.source()).take(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_print_as_envoy_prints_them() {
        let mut f = Flags::default();
        assert_eq!(f.to_string(), "-");
        f.insert(Flags::URX);
        f.insert(Flags::UF);
        assert_eq!(f.to_string(), "URX,UF");
    }

    #[test]
    fn connect_failure_is_a_retryable_503_uf_and_grpc_unavailable() {
        let k = ErrorKind::ConnectFailed;
        assert_eq!(k.status(), 503);
        assert_eq!(k.flag(), Flags::UF);
        assert!(k.retryable());
        assert_eq!(k.grpc_status(), 14);
        assert_eq!(k.origin(), Origin::Upstream);
        assert!(!ErrorKind::ConnectionTerminated.retryable());
        assert_eq!(ErrorKind::Timeout.status(), 504);
        assert_eq!(ErrorKind::MalformedRequest("x").status(), 400);
        assert_eq!(ErrorKind::HeadersTooLarge.status(), 431);
        assert_eq!(ErrorKind::HeadersTooLarge.flag(), Flags::DPE);
        assert_eq!(ErrorKind::HeadersTooLarge.origin(), Origin::Downstream);
    }
}
