//! The request's hash for consistent-hash clusters (RING_HASH, MAGLEV), as Envoy computes it
//! from the route's hash policies: each policy that finds its input adds its xxHash64 (the
//! hash so far rotated left by one, then xored with it), and a `terminal` one that did ends
//! the walk. No policy finding its input leaves the request without a hash: its pick is
//! random, as Envoy's.

use http::HeaderMap;
use remora_xds::model::hash::{GeneratedCookie, HashKind, HashPolicy};
use remora_xds::model::route::RequestParts;
use std::net::SocketAddr;
use twox_hash::XxHash64;

/// xxHash64 of `bytes` with `seed` (Envoy's `HashUtil::xxHash64`).
pub fn xxhash64(bytes: &[u8], seed: u64) -> u64 {
    XxHash64::oneshot(seed, bytes)
}

/// The downstream connection a request came on: its peer (whose IP the source-IP policy
/// hashes) and its local end (the original destination), of which a generated cookie's value
/// is made.
#[derive(Debug, Clone, Copy)]
pub struct Downstream {
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

/// The hash of a request by `policies`. `headers`, when there are (hyper's path), give
/// every value of a repeated header; without them (the HTTP/1.1 fast path) `req`'s lookup
/// gives the first. A cookie policy with a TTL whose cookie the request lacks makes one, as
/// Envoy's router does, and pushes its `Set-Cookie` value onto `set_cookies`.
pub fn request_hash(
    policies: &[HashPolicy],
    req: &RequestParts<'_>,
    headers: Option<&HeaderMap>,
    conn: Downstream,
    set_cookies: &mut Vec<String>,
) -> Option<u64> {
    let mut hash: Option<u64> = None;
    for p in policies {
        let new = match &p.kind {
            HashKind::Header(name) => header_hash(name, req, headers),
            HashKind::Cookie(name) => cookie_hash(name, req, headers),
            HashKind::GeneratedCookie(c) => cookie_hash(&c.name, req, headers).or_else(|| {
                let value = generated_value(conn);
                set_cookies.push(set_cookie(c, &value));
                Some(xxhash64(value.as_bytes(), 0))
            }),
            HashKind::SourceIp => Some(xxhash64(conn.peer.ip().to_string().as_bytes(), 0)),
            HashKind::QueryParameter(name) => {
                query_parameter(req.path_and_query, name).map(|v| xxhash64(v.as_bytes(), 0))
            }
        };
        if let Some(new) = new {
            // Rotated, so that two equal policies do not cancel each other out.
            hash = Some(hash.map_or(0, |h| h.rotate_left(1)) ^ new);
        }
        if p.terminal && hash.is_some() {
            break;
        }
    }
    hash
}

/// The value Envoy's router gives a cookie it makes: xxHash64 of the connection's remote and
/// local addresses (`ip:port`, `[ip]:port`), in 16 lower-case hex digits. The same for every
/// request of a connection, so that concurrent requests on it get the same cookie.
fn generated_value(conn: Downstream) -> String {
    let addresses = format!("{}{}", conn.peer, conn.local);
    format!("{:016x}", xxhash64(addresses.as_bytes(), 0))
}

/// A generated cookie's `Set-Cookie` value, as Envoy writes it: the value quoted, `Max-Age`
/// (unless the TTL is zero), `Path` (unless empty), the attributes in order, `HttpOnly`.
fn set_cookie(c: &GeneratedCookie, value: &str) -> String {
    let mut out = format!("{}=\"{value}\"", c.name);
    if c.ttl_seconds != 0 {
        out.push_str(&format!("; Max-Age={}", c.ttl_seconds));
    }
    if !c.path.is_empty() {
        out.push_str(&format!("; Path={}", c.path));
    }
    for (name, value) in &c.attributes {
        if value.is_empty() {
            out.push_str(&format!("; {name}"));
        } else {
            out.push_str(&format!("; {name}={value}"));
        }
    }
    out.push_str("; HttpOnly");
    out
}

/// Every value of the header, sorted (the same hash whatever their order), each hashed with
/// the hash of those before as its seed.
fn header_hash(name: &str, req: &RequestParts<'_>, headers: Option<&HeaderMap>) -> Option<u64> {
    let Some(headers) = headers else {
        return (req.header)(name).map(|v| xxhash64(v.as_bytes(), 0));
    };
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    let Some(second) = values.next() else {
        return Some(xxhash64(first.as_bytes(), 0));
    };
    let mut all: Vec<&[u8]> = vec![first.as_bytes(), second.as_bytes()];
    all.extend(values.map(|v| v.as_bytes()));
    all.sort_unstable();
    Some(all.iter().fold(0, |seed, v| xxhash64(v, seed)))
}

/// The hash of the value of the request cookie `name` (the first found; quotes around it
/// dropped, as Envoy's parser drops them); an empty value is none.
fn cookie_hash(name: &str, req: &RequestParts<'_>, headers: Option<&HeaderMap>) -> Option<u64> {
    let find = |line: &[u8]| -> Option<u64> {
        line.split(|b| *b == b';').find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|b| *b == b'=')?;
            let (k, v) = (&pair[..eq], &pair[eq + 1..]);
            if k != name.as_bytes() {
                return None;
            }
            let v = match v {
                [b'"', inner @ .., b'"'] => inner,
                v => v,
            };
            (!v.is_empty()).then(|| xxhash64(v, 0))
        })
    };
    match headers {
        Some(h) => h
            .get_all(http::header::COOKIE)
            .iter()
            .find_map(|v| find(v.as_bytes())),
        None => (req.header)("cookie").and_then(|v| find(v.as_bytes())),
    }
}

/// The first value of query parameter `name` in `path_and_query`, as it is written (no
/// decoding, as Envoy's hash policy reads it); a parameter without `=` has the empty value.
fn query_parameter<'a>(path_and_query: &'a str, name: &str) -> Option<&'a str> {
    let query = path_and_query.split_once('?')?.1;
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(kind: HashKind, terminal: bool) -> HashPolicy {
        HashPolicy { kind, terminal }
    }

    fn hash_of(policies: &[HashPolicy], path: &str, headers: &HeaderMap) -> Option<u64> {
        let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        let values = |n: &str, visit: &mut dyn FnMut(&str) -> bool| {
            headers
                .get_all(n)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(visit)
        };
        let req = RequestParts {
            method: "GET",
            path_and_query: path,
            header: &header,
            values: &values,
        };
        let mut cookies = Vec::new();
        let full = request_hash(policies, &req, Some(headers), conn(), &mut cookies);
        let fast = request_hash(policies, &req, None, conn(), &mut cookies);
        if headers.get_all("x-user").iter().count() <= 1 {
            assert_eq!(full, fast, "both paths hash alike");
        }
        full
    }

    fn conn() -> Downstream {
        Downstream {
            peer: "10.1.2.3:40000".parse().expect("addr"),
            local: "10.96.0.10:80".parse().expect("addr"),
        }
    }

    #[test]
    fn a_cookie_with_a_ttl_is_made_when_absent_and_hashed_as_if_sent() {
        let sticky = GeneratedCookie {
            name: "sticky".into(),
            ttl_seconds: 3600,
            path: "/app".into(),
            attributes: vec![
                ("SameSite".into(), "Strict".into()),
                ("Secure".into(), String::new()),
            ],
        };
        let policies = [policy(HashKind::GeneratedCookie(sticky.clone()), false)];
        let header = |_: &str| None;
        let req = RequestParts {
            method: "GET",
            path_and_query: "/app",
            header: &header,
            values: &|_: &str, _: &mut dyn FnMut(&str) -> bool| false,
        };
        let mut cookies = Vec::new();
        let hash = request_hash(
            &policies,
            &req,
            Some(&HeaderMap::new()),
            conn(),
            &mut cookies,
        );
        // Envoy's value: xxHash64 of "10.1.2.3:4000010.96.0.10:80", as 16 hex digits.
        let value = format!("{:016x}", xxhash64(b"10.1.2.3:4000010.96.0.10:80", 0));
        assert_eq!(
            cookies,
            [format!(
                "sticky=\"{value}\"; Max-Age=3600; Path=/app; SameSite=Strict; Secure; HttpOnly"
            )]
        );
        assert_eq!(hash, Some(xxhash64(value.as_bytes(), 0)));
        // Sent back, the cookie hashes to the same host, and none is made.
        let mut back = HeaderMap::new();
        back.insert(
            "cookie",
            format!("sticky=\"{value}\"").parse().expect("value"),
        );
        let mut again = Vec::new();
        let sent = request_hash(&policies, &req, Some(&back), conn(), &mut again);
        assert_eq!((sent, again.len()), (hash, 0));
        // A zero TTL and no path: a session cookie, Envoy's shape.
        let session = GeneratedCookie {
            ttl_seconds: 0,
            path: String::new(),
            attributes: vec![],
            ..sticky
        };
        let mut cookies = Vec::new();
        let policies = [policy(HashKind::GeneratedCookie(session), false)];
        request_hash(&policies, &req, None, conn(), &mut cookies);
        assert_eq!(cookies, [format!("sticky=\"{value}\"; HttpOnly")]);
    }

    /// xxHash64's published check values: Envoy's hash, so that a key picks Envoy's host.
    #[test]
    fn xxhash64_is_the_reference_function() {
        assert_eq!(xxhash64(b"", 0), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxhash64(b"a", 0), 0xD24E_C4F1_A98C_6E5B);
        assert_eq!(xxhash64(b"abc", 0), 0x44BC_2CF5_AD77_0999);
    }

    #[test]
    fn policies_hash_their_inputs_and_combine_as_envoy() {
        let mut h = HeaderMap::new();
        h.insert("x-user", "alice".parse().expect("value"));
        h.insert("cookie", "a=1; session=\"s1\"; b=2".parse().expect("value"));
        let header = [policy(HashKind::Header("x-user".into()), false)];
        assert_eq!(hash_of(&header, "/", &h), Some(xxhash64(b"alice", 0)));
        let cookie = [policy(HashKind::Cookie("session".into()), false)];
        assert_eq!(hash_of(&cookie, "/", &h), Some(xxhash64(b"s1", 0)));
        let query = [policy(HashKind::QueryParameter("u".into()), false)];
        assert_eq!(
            hash_of(&query, "/p?x=1&u=bob&u=eve", &h),
            Some(xxhash64(b"bob", 0))
        );
        assert_eq!(hash_of(&query, "/p?uu=bob", &h), None);
        let ip = [policy(HashKind::SourceIp, false)];
        assert_eq!(hash_of(&ip, "/", &h), Some(xxhash64(b"10.1.2.3", 0)));
        // Two policies: the first rotated, xored with the second.
        let both = [header[0].clone(), cookie[0].clone()];
        let want = xxhash64(b"alice", 0).rotate_left(1) ^ xxhash64(b"s1", 0);
        assert_eq!(hash_of(&both, "/", &h), Some(want));
        // A terminal policy that found its input ends the walk; one that did not, does not.
        let terminal = [
            policy(HashKind::Header("x-user".into()), true),
            cookie[0].clone(),
        ];
        assert_eq!(hash_of(&terminal, "/", &h), Some(xxhash64(b"alice", 0)));
        let missing = [
            policy(HashKind::Header("x-none".into()), true),
            cookie[0].clone(),
        ];
        assert_eq!(hash_of(&missing, "/", &h), Some(xxhash64(b"s1", 0)));
        // Nothing found: no hash (a random pick).
        let none = [policy(HashKind::Header("x-none".into()), false)];
        assert_eq!(hash_of(&none, "/", &h), None);
    }

    #[test]
    fn a_repeated_header_hashes_alike_in_any_order() {
        let policies = [policy(HashKind::Header("x-user".into()), false)];
        let mut ab = HeaderMap::new();
        ab.append("x-user", "a".parse().expect("value"));
        ab.append("x-user", "b".parse().expect("value"));
        let mut ba = HeaderMap::new();
        ba.append("x-user", "b".parse().expect("value"));
        ba.append("x-user", "a".parse().expect("value"));
        let want = xxhash64(b"b", xxhash64(b"a", 0));
        assert_eq!(hash_of(&policies, "/", &ab), Some(want));
        assert_eq!(hash_of(&policies, "/", &ba), Some(want));
    }
}
