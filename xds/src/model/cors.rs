//! CORS as Envoy's cors filter applies it (`envoy.filters.http.cors` in the connection
//! manager), from the `CorsPolicy` per-filter configs istiod writes for a VirtualService's
//! `corsPolicy`: a preflight from an allowed origin is answered here (200 and the
//! `access-control-allow-*` headers); any other request from an allowed origin is forwarded
//! and its response gets `access-control-allow-origin`, `-credentials` and `-expose-headers`.
//!
//! A route's policies are its own, its virtual host's and its table's, most specific first.
//! As in Envoy, each setting is taken from the most specific policy that sets it, and whether
//! CORS acts at all (`filter_enabled`) from the most specific policy alone.

use super::fault::Fraction;
use super::matcher::StringMatcher;
use std::sync::Arc;

/// One level's `CorsPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub struct CorsPolicy {
    /// `allow_origin_string_match` (empty: this level says nothing of origins).
    pub allow_origins: Vec<StringMatcher>,
    /// `allow_methods`, `allow_headers`, `expose_headers`, `max_age`: header values as
    /// written (empty: unset). `*` in the first two echoes the preflight's request.
    pub allow_methods: String,
    pub allow_headers: String,
    pub expose_headers: String,
    pub max_age: String,
    pub allow_credentials: Option<bool>,
    pub allow_private_network_access: Option<bool>,
    /// Unset: Envoy's default, forward a preflight whose origin is not allowed.
    pub forward_not_matching_preflights: Option<bool>,
    /// `filter_enabled.default_value` (unset: every request).
    pub enabled: Fraction,
}

/// The policies a route applies, most specific first (never empty).
#[derive(Debug, Clone, PartialEq)]
pub struct Cors {
    pub policies: Vec<Arc<CorsPolicy>>,
}

/// The request headers CORS reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct CorsRequest<'a> {
    pub method: &'a str,
    pub origin: Option<&'a str>,
    pub request_method: Option<&'a str>,
    pub request_headers: Option<&'a str>,
    pub request_private_network: Option<&'a str>,
}

/// What CORS does to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOutcome {
    /// Nothing: the request goes on and its response is not touched.
    Pass,
    /// A preflight answered here: 200 with these headers (and none of the route's header
    /// edits), nothing forwarded.
    Preflight(Vec<(&'static str, String)>),
    /// Forward the request; set these headers on its response (the upstream's or a local
    /// reply of the router).
    Response(Vec<(&'static str, String)>),
}

pub const ALLOW_ORIGIN: &str = "access-control-allow-origin";
pub const ALLOW_CREDENTIALS: &str = "access-control-allow-credentials";
pub const ALLOW_METHODS: &str = "access-control-allow-methods";
pub const ALLOW_HEADERS: &str = "access-control-allow-headers";
pub const MAX_AGE: &str = "access-control-max-age";
pub const EXPOSE_HEADERS: &str = "access-control-expose-headers";
pub const ALLOW_PRIVATE_NETWORK: &str = "access-control-allow-private-network";

impl Cors {
    /// The first non-empty string any policy sets, most specific first.
    fn text(&self, field: impl Fn(&CorsPolicy) -> &str) -> &str {
        self.policies
            .iter()
            .map(|p| field(p))
            .find(|s| !s.is_empty())
            .unwrap_or("")
    }

    /// The first flag any policy sets, most specific first.
    fn flag(&self, field: impl Fn(&CorsPolicy) -> Option<bool>) -> Option<bool> {
        self.policies.iter().find_map(|p| field(p))
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        self.policies
            .iter()
            .map(|p| &p.allow_origins)
            .find(|o| !o.is_empty())
            .is_some_and(|o| o.iter().any(|m| m.matches("*") || m.matches(origin)))
    }

    /// What CORS does to `req`; `roll` is a uniformly random number for `filter_enabled`.
    pub fn evaluate(&self, req: &CorsRequest<'_>, roll: u64) -> CorsOutcome {
        self.evaluate_origin(req, roll).0
    }

    /// What CORS does to `req`, and whether its origin was found allowed (`None`: not judged,
    /// the filter being off for it or the request having no `Origin`), which Envoy's filter
    /// counts (`cors.origin_valid`, `cors.origin_invalid`).
    pub fn evaluate_origin(&self, req: &CorsRequest<'_>, roll: u64) -> (CorsOutcome, Option<bool>) {
        let Some(first) = self.policies.first() else {
            return (CorsOutcome::Pass, None);
        };
        if !first.enabled.hits(roll) {
            return (CorsOutcome::Pass, None);
        }
        let Some(origin) = req.origin.filter(|o| !o.is_empty()) else {
            return (CorsOutcome::Pass, None);
        };
        let allowed = self.origin_allowed(origin);
        (self.outcome(req, origin, allowed), Some(allowed))
    }

    /// What CORS does to `req` from `origin`, allowed or not.
    fn outcome(&self, req: &CorsRequest<'_>, origin: &str, allowed: bool) -> CorsOutcome {
        let credentials = self.flag(|p| p.allow_credentials) == Some(true);
        let request_method = req.request_method.unwrap_or("");
        let preflight = req.method == "OPTIONS" && !request_method.is_empty();
        if !preflight {
            if !allowed {
                return CorsOutcome::Pass;
            }
            let mut headers = vec![(ALLOW_ORIGIN, origin.to_string())];
            if credentials {
                headers.push((ALLOW_CREDENTIALS, "true".to_string()));
            }
            let expose = self.text(|p| &p.expose_headers);
            if !expose.is_empty() {
                headers.push((EXPOSE_HEADERS, expose.to_string()));
            }
            return CorsOutcome::Response(headers);
        }
        if !allowed && self.flag(|p| p.forward_not_matching_preflights) != Some(false) {
            return CorsOutcome::Pass;
        }
        // Answered here; a preflight whose origin is not allowed (and is not forwarded) gets
        // every header but the allowed origin, as in Envoy.
        let mut headers = Vec::new();
        if allowed {
            headers.push((ALLOW_ORIGIN, origin.to_string()));
        }
        if credentials {
            headers.push((ALLOW_CREDENTIALS, "true".to_string()));
        }
        let echo = |configured: &str, asked: Option<&str>| match configured {
            "*" => asked.unwrap_or("").to_string(),
            other => other.to_string(),
        };
        let methods = self.text(|p| &p.allow_methods);
        if !methods.is_empty() {
            headers.push((ALLOW_METHODS, echo(methods, Some(request_method))));
        }
        let allow_headers = self.text(|p| &p.allow_headers);
        if !allow_headers.is_empty() {
            headers.push((ALLOW_HEADERS, echo(allow_headers, req.request_headers)));
        }
        let max_age = self.text(|p| &p.max_age);
        if !max_age.is_empty() {
            headers.push((MAX_AGE, max_age.to_string()));
        }
        if self.flag(|p| p.allow_private_network_access) == Some(true)
            && req.request_private_network == Some("true")
        {
            headers.push((ALLOW_PRIVATE_NETWORK, "true".to_string()));
        }
        // Envoy's answer passes through the filter's own response side too, which adds the
        // exposed headers when the origin is allowed.
        let expose = self.text(|p| &p.expose_headers);
        if allowed && !expose.is_empty() {
            headers.push((EXPOSE_HEADERS, expose.to_string()));
        }
        CorsOutcome::Preflight(headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::matcher::{StringMatch, StringMatcher};

    fn policy() -> CorsPolicy {
        CorsPolicy {
            allow_origins: vec![],
            allow_methods: String::new(),
            allow_headers: String::new(),
            expose_headers: String::new(),
            max_age: String::new(),
            allow_credentials: None,
            allow_private_network_access: None,
            forward_not_matching_preflights: None,
            enabled: Fraction::ALL,
        }
    }

    fn istio_like() -> CorsPolicy {
        CorsPolicy {
            allow_origins: vec![
                StringMatcher::exact("https://a.example"),
                StringMatcher {
                    kind: StringMatch::Prefix("https://b.".into()),
                    ignore_case: false,
                },
            ],
            allow_methods: "GET,POST".into(),
            allow_headers: "x-custom".into(),
            expose_headers: "x-exposed".into(),
            max_age: "600".into(),
            allow_credentials: Some(true),
            ..policy()
        }
    }

    fn cors(policies: Vec<CorsPolicy>) -> Cors {
        Cors {
            policies: policies.into_iter().map(Arc::new).collect(),
        }
    }

    fn preflight(origin: &str) -> CorsRequest<'_> {
        CorsRequest {
            method: "OPTIONS",
            origin: Some(origin),
            request_method: Some("PUT"),
            request_headers: Some("x-asked"),
            request_private_network: None,
        }
    }

    fn get(origin: Option<&str>) -> CorsRequest<'_> {
        CorsRequest {
            method: "GET",
            origin,
            ..CorsRequest::default()
        }
    }

    #[test]
    fn preflight_from_an_allowed_origin_is_answered_with_every_header() {
        let c = cors(vec![istio_like()]);
        assert_eq!(
            c.evaluate(&preflight("https://b.example"), 0),
            CorsOutcome::Preflight(vec![
                (ALLOW_ORIGIN, "https://b.example".into()),
                (ALLOW_CREDENTIALS, "true".into()),
                (ALLOW_METHODS, "GET,POST".into()),
                (ALLOW_HEADERS, "x-custom".into()),
                (MAX_AGE, "600".into()),
                (EXPOSE_HEADERS, "x-exposed".into()),
            ])
        );
    }

    #[test]
    fn preflight_from_another_origin_is_forwarded_unless_told_not_to() {
        let c = cors(vec![istio_like()]);
        assert_eq!(c.evaluate(&preflight("https://evil"), 0), CorsOutcome::Pass);
        let c = cors(vec![CorsPolicy {
            forward_not_matching_preflights: Some(false),
            ..istio_like()
        }]);
        // Answered, without an allowed origin.
        let CorsOutcome::Preflight(h) = c.evaluate(&preflight("https://evil"), 0) else {
            panic!("not answered");
        };
        assert!(h
            .iter()
            .all(|(n, _)| *n != ALLOW_ORIGIN && *n != EXPOSE_HEADERS));
        assert!(h.contains(&(ALLOW_METHODS, "GET,POST".into())));
    }

    #[test]
    fn options_without_a_request_method_is_not_a_preflight() {
        let c = cors(vec![istio_like()]);
        let req = CorsRequest {
            request_method: None,
            ..preflight("https://a.example")
        };
        assert!(matches!(c.evaluate(&req, 0), CorsOutcome::Response(_)));
    }

    #[test]
    fn simple_request_gets_origin_credentials_and_exposed_headers() {
        let c = cors(vec![istio_like()]);
        assert_eq!(
            c.evaluate(&get(Some("https://a.example")), 0),
            CorsOutcome::Response(vec![
                (ALLOW_ORIGIN, "https://a.example".into()),
                (ALLOW_CREDENTIALS, "true".into()),
                (EXPOSE_HEADERS, "x-exposed".into()),
            ])
        );
        assert_eq!(
            c.evaluate(&get(Some("https://a.example.evil")), 0),
            CorsOutcome::Pass
        );
        assert_eq!(c.evaluate(&get(Some("")), 0), CorsOutcome::Pass);
        assert_eq!(c.evaluate(&get(None), 0), CorsOutcome::Pass);
    }

    #[test]
    fn star_echoes_the_request_and_a_matcher_of_star_allows_all() {
        let c = cors(vec![CorsPolicy {
            allow_origins: vec![StringMatcher::exact("*")],
            allow_methods: "*".into(),
            allow_headers: "*".into(),
            allow_private_network_access: Some(true),
            ..policy()
        }]);
        let req = CorsRequest {
            request_private_network: Some("true"),
            ..preflight("https://any")
        };
        assert_eq!(
            c.evaluate(&req, 0),
            CorsOutcome::Preflight(vec![
                (ALLOW_ORIGIN, "https://any".into()),
                (ALLOW_METHODS, "PUT".into()),
                (ALLOW_HEADERS, "x-asked".into()),
                (ALLOW_PRIVATE_NETWORK, "true".into()),
            ])
        );
    }

    #[test]
    fn each_setting_comes_from_the_most_specific_policy_that_sets_it() {
        // The route's policy sets origins only; the virtual host's the rest.
        let route = CorsPolicy {
            allow_origins: vec![StringMatcher::exact("https://r")],
            allow_credentials: Some(false),
            ..policy()
        };
        let c = cors(vec![route, istio_like()]);
        assert_eq!(
            c.evaluate(&get(Some("https://a.example")), 0),
            CorsOutcome::Pass
        );
        assert_eq!(
            c.evaluate(&get(Some("https://r")), 0),
            CorsOutcome::Response(vec![
                (ALLOW_ORIGIN, "https://r".into()),
                (EXPOSE_HEADERS, "x-exposed".into()),
            ])
        );
    }

    #[test]
    fn filter_enabled_is_the_most_specific_policys() {
        let off = CorsPolicy {
            enabled: Fraction::new(0, 100).expect("fraction"),
            ..policy()
        };
        let c = cors(vec![off, istio_like()]);
        assert_eq!(
            c.evaluate(&preflight("https://a.example"), 0),
            CorsOutcome::Pass
        );
        let half = CorsPolicy {
            enabled: Fraction::new(50, 100).expect("fraction"),
            ..istio_like()
        };
        let c = cors(vec![half]);
        assert_eq!(
            c.evaluate(&get(Some("https://a.example")), 600_000),
            CorsOutcome::Pass
        );
        assert!(matches!(
            c.evaluate(&get(Some("https://a.example")), 100_000),
            CorsOutcome::Response(_)
        ));
    }
}
