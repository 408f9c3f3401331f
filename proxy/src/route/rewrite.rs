//! What a route rewrites: the path of a forwarded request (`prefix_rewrite`) and the URL a
//! redirect sends the client to, both as Envoy computes them (the differential tests against
//! Envoy 1.40 hold Remora to it).

use remora_xds::model::route::{PathMatch, Redirect};

/// Envoy's `prefix_rewrite`: what the route matched of the path is replaced (the whole path
/// for an exact match), the rest, query included, kept; regex routes are left as they are.
pub fn prefix(matched: &PathMatch, path_and_query: &str, to: &str) -> Option<String> {
    let prefix = match matched {
        PathMatch::Prefix(p) | PathMatch::PathSeparatedPrefix(p) | PathMatch::Exact(p) => p,
        PathMatch::Regex(_) | PathMatch::Connect => return None,
    };
    let rest = path_and_query.get(prefix.len()..)?;
    path_and_query
        .get(..prefix.len())
        .filter(|head| head.eq_ignore_ascii_case(prefix))?;
    Some(format!("{to}{rest}"))
}

/// What a redirect's `Location` is made from, of the request.
#[derive(Debug, Clone, Copy)]
pub struct RedirectRequest<'a> {
    /// The Host (or authority), port included if the client sent one.
    pub host: &'a str,
    pub path_and_query: &'a str,
    /// `x-forwarded-proto` (Envoy's connection manager has set it by then): `http` on a
    /// plaintext outbound connection.
    pub scheme: &'a str,
}

/// The `Location` of a redirect, as Envoy builds it: the scheme, host and port the redirect
/// names, else the request's (its port dropped when a new port is given, or when the scheme
/// changes away from the one whose default port it is); the path the redirect names with the
/// request's query (unless the new path has its own), or the request's path with the
/// matched prefix rewritten; the query stripped when asked (not one the new path carries).
pub fn redirect_location(r: &Redirect, matched: &PathMatch, req: RedirectRequest<'_>) -> String {
    let scheme = r.scheme.as_deref().unwrap_or(req.scheme);
    let port = r.port.map(|p| format!(":{p}")).unwrap_or_default();
    let host = match &r.host {
        Some(h) => h.as_str(),
        None => request_host(req, scheme, r.port.is_some()),
    };
    let query_at = req.path_and_query.find('?');
    let mut path = match (&r.path, &r.prefix_rewrite) {
        // A new path with a query of its own: taken whole, never stripped.
        (Some(p), _) if p.contains('?') => return format!("{scheme}://{host}{port}{p}"),
        (Some(p), _) => format!("{p}{}", query_at.map_or("", |i| &req.path_and_query[i..])),
        (None, Some(to)) => prefix(matched, req.path_and_query, to)
            .unwrap_or_else(|| req.path_and_query.to_string()),
        (None, None) => req.path_and_query.to_string(),
    };
    if r.strip_query {
        if let Some(i) = path.find('?') {
            path.truncate(i);
        }
    }
    format!("{scheme}://{host}{port}{path}")
}

/// The request's host for a redirect: without its port when the redirect gives a new one, or
/// when the scheme changes and the port was the old scheme's default.
fn request_host<'a>(req: RedirectRequest<'a>, scheme: &str, new_port: bool) -> &'a str {
    let host = req.host;
    let port_at = if host.starts_with('[') {
        host.rfind("]:").map(|i| i + 1)
    } else {
        host.rfind(':')
    };
    let Some(at) = port_at else {
        return host;
    };
    let port = &host[at..];
    let default_port =
        (req.scheme == "https" && port == ":443") || (req.scheme == "http" && port == ":80");
    if new_port || (scheme != req.scheme && default_port) {
        &host[..at]
    } else {
        host
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_rewrite_replaces_what_the_route_matched() {
        let p = PathMatch::Prefix("/api".into());
        assert_eq!(prefix(&p, "/api/v1?x=1", "/").as_deref(), Some("//v1?x=1"));
        assert_eq!(prefix(&p, "/API/v1", "/v2").as_deref(), Some("/v2/v1"));
        let exact = PathMatch::Exact("/old".into());
        assert_eq!(prefix(&exact, "/old", "/new").as_deref(), Some("/new"));
    }

    fn redirect() -> Redirect {
        Redirect {
            scheme: None,
            host: None,
            port: None,
            path: None,
            prefix_rewrite: None,
            status: 301,
            strip_query: false,
        }
    }

    fn req<'a>(host: &'a str, path_and_query: &'a str) -> RedirectRequest<'a> {
        RedirectRequest {
            host,
            path_and_query,
            scheme: "http",
        }
    }

    #[test]
    fn a_new_path_keeps_the_query_unless_stripped_or_its_own() {
        let any = PathMatch::Prefix("/".into());
        let r = Redirect {
            path: Some("/new".into()),
            ..redirect()
        };
        let at = |r: &Redirect, pq| redirect_location(r, &any, req("h", pq));
        assert_eq!(at(&r, "/old?keep=1"), "http://h/new?keep=1");
        let stripped = Redirect {
            strip_query: true,
            ..r.clone()
        };
        assert_eq!(at(&stripped, "/old?keep=1"), "http://h/new");
        let own = Redirect {
            path: Some("/new?mine=1".into()),
            strip_query: true,
            ..redirect()
        };
        assert_eq!(at(&own, "/old?keep=1"), "http://h/new?mine=1");
    }

    #[test]
    fn a_prefix_rewrite_keeps_the_rest_and_the_query() {
        let r = Redirect {
            prefix_rewrite: Some("/v2/".into()),
            ..redirect()
        };
        let matched = PathMatch::Prefix("/v1/".into());
        assert_eq!(
            redirect_location(&r, &matched, req("h", "/v1/items?id=3")),
            "http://h/v2/items?id=3"
        );
    }

    #[test]
    fn the_port_goes_with_a_new_port_or_a_scheme_change_from_its_default() {
        let any = PathMatch::Prefix("/".into());
        let https = Redirect {
            scheme: Some("https".into()),
            ..redirect()
        };
        let at = |r: &Redirect, host| redirect_location(r, &any, req(host, "/x"));
        assert_eq!(at(&https, "h:80"), "https://h/x");
        assert_eq!(at(&https, "h:8080"), "https://h:8080/x");
        let port = Redirect {
            port: Some(8443),
            ..redirect()
        };
        assert_eq!(at(&port, "h:80"), "http://h:8443/x");
        assert_eq!(at(&port, "[::1]:80"), "http://[::1]:8443/x");
        assert_eq!(at(&redirect(), "h:80"), "http://h:80/x");
        let host = Redirect {
            host: Some("elsewhere".into()),
            ..redirect()
        };
        assert_eq!(at(&host, "h:8080"), "http://elsewhere/x");
    }
}
