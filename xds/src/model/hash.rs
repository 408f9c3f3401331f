//! A route's hash policies (`RouteAction.hash_policy`): what of a request a consistent-hash
//! cluster (RING_HASH, MAGLEV) hashes to pick its host, as istiod writes them from a
//! DestinationRule's `loadBalancer.consistentHash`.

/// One hash policy. The request's hash combines those that yield one, in order, stopping
/// after a `terminal` one that did (Envoy's rule); none yielding one leaves the pick random.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashPolicy {
    pub kind: HashKind,
    pub terminal: bool,
}

/// What a policy hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKind {
    /// Every value of the header (name in lower case); absent, no hash.
    Header(String),
    /// The value of the request cookie of this name; absent, no hash.
    Cookie(String),
    /// The value of the request cookie of this name (a `ttl` set); absent, Envoy's router
    /// makes one up for the connection, hashes it, and sets it on the upstream's response.
    GeneratedCookie(GeneratedCookie),
    /// The downstream peer's IP address, as text.
    SourceIp,
    /// The first value of the query parameter of this name; absent, no hash.
    QueryParameter(String),
}

/// A hash cookie with a `ttl` (DestinationRule `consistentHash.httpCookie` with `ttl`): what
/// the `Set-Cookie` of a request that had none says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedCookie {
    pub name: String,
    /// `Max-Age`, whole seconds; zero: none (a session cookie).
    pub ttl_seconds: u64,
    /// `Path`; empty: none.
    pub path: String,
    /// Further attributes, in order: `name=value`, or `name` alone when the value is empty.
    pub attributes: Vec<(String, String)>,
}
