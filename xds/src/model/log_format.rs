//! An access log's text format (`text_format_source.inline_string`), parsed once when the
//! listener arrives into literal text and Envoy's command operators (`%START_TIME%`,
//! `%REQ(X?Y):N%`…), so that a line is written per request or connection by walking the pieces,
//! never by parsing the string again. The proxy's access log renders each operator from what
//! it knows of the request or connection; the converter refuses an operator it cannot render.

use std::sync::Arc;

/// A parsed text format: pieces in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextFormat {
    pub pieces: Arc<[Piece]>,
    /// The lower-case names of the request headers other than the ones every request log
    /// keeps (method, path, authority, user agent, request id, forwarded-for and Envoy's
    /// original path), which `%REQ(…)%` reads: captured per request only when named.
    pub extra_request_headers: Arc<[Box<str>]>,
}

impl TextFormat {
    /// Whether any piece renders `op`.
    pub fn uses(&self, op: &Operator) -> bool {
        self.pieces.iter().any(|p| p.operator.as_ref() == Some(op))
    }
}

/// One piece of a format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Written as it is.
    pub literal: Box<str>,
    /// Then this operator's value, if any.
    pub operator: Option<Operator>,
    /// `:N`: at most this many characters of the operator's value.
    pub max_len: Option<usize>,
}

/// Envoy's command operators that Remora renders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operator {
    StartTime,
    /// `%REQ(X?Y)%`: the request header `X`, or `Y` when `X` is absent.
    Request(RequestHeader, Option<RequestHeader>),
    /// `%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%`: the upstream's time to its response headers.
    UpstreamServiceTime,
    Protocol,
    ResponseCode,
    ResponseFlags,
    ResponseCodeDetails,
    ConnectionTerminationDetails,
    UpstreamTransportFailureReason,
    BytesReceived,
    BytesSent,
    Duration,
    UpstreamHost,
    /// `%UPSTREAM_CLUSTER_RAW%` and `%UPSTREAM_CLUSTER%`: the cluster's name (Envoy prints a
    /// cluster's `alt_stat_name` for the latter, which istiod writes only when the mesh sets
    /// a cluster stat name pattern; Remora prints the name).
    UpstreamCluster,
    UpstreamLocalAddress,
    DownstreamLocalAddress,
    DownstreamRemoteAddress,
    /// `%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%`.
    DownstreamRemoteIp,
    /// `%DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT%`.
    DownstreamLocalIp,
    RequestedServerName,
    RouteName,
}

/// A request header an operator reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestHeader {
    Method,
    Path,
    Authority,
    Scheme,
    UserAgent,
    RequestId,
    ForwardedFor,
    /// `x-envoy-original-path`: the path before a route rewrote it.
    OriginalPath,
    /// Another header, by its index in [`TextFormat::extra_request_headers`].
    Other(usize),
}
