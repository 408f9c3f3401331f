//! A route's header edits: the picked weighted cluster's, the route's, its virtual host's and
//! its table's, their `%…%` values filled in from the request.

use super::header_format;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use remora_xds::model::route::{
    ClusterTarget, Forward, HeaderEdit, Route, RouteConfiguration, VirtualHost,
};

/// The request and response header edits of a forwarded request: the picked weighted cluster's
/// own (most specific, so first, as Envoy applies them), then the route's, the virtual
/// host's and the table's; their `%…%` values filled in from `request`.
pub(super) fn edits(
    table: &RouteConfiguration,
    vhost: &VirtualHost,
    route: &Route,
    forward: &Forward,
    cluster: &str,
    request: &header_format::Request<'_>,
) -> (Edits, Edits) {
    let picked = match &forward.target {
        ClusterTarget::Weighted(set) => set.iter().find(|c| c.name == cluster),
        ClusterTarget::Cluster(_) => None,
    };
    let none: (&[HeaderEdit], &[String]) = (&[], &[]);
    let request_edits = Edits::of(
        [
            picked.map_or(none, |c| {
                (
                    &c.request_headers_to_add[..],
                    &c.request_headers_to_remove[..],
                )
            }),
            (
                &route.request_headers_to_add,
                &route.request_headers_to_remove,
            ),
            (
                &vhost.request_headers_to_add,
                &vhost.request_headers_to_remove,
            ),
            (
                &table.request_headers_to_add,
                &table.request_headers_to_remove,
            ),
        ],
        request,
    );
    let response_edits = Edits::of(
        [
            picked.map_or(none, |c| {
                (
                    &c.response_headers_to_add[..],
                    &c.response_headers_to_remove[..],
                )
            }),
            (
                &route.response_headers_to_add,
                &route.response_headers_to_remove,
            ),
            (
                &vhost.response_headers_to_add,
                &vhost.response_headers_to_remove,
            ),
            (
                &table.response_headers_to_add,
                &table.response_headers_to_remove,
            ),
        ],
        request,
    );
    (request_edits, response_edits)
}

/// The response header edits of an answer made here (a redirect, a direct response): the
/// route's, its virtual host's and the table's, as Envoy applies them to its own replies.
pub(super) fn local_edits(
    table: &RouteConfiguration,
    vhost: &VirtualHost,
    route: &Route,
    request: &header_format::Request<'_>,
) -> Edits {
    Edits::of(
        [
            (
                &route.response_headers_to_add[..],
                &route.response_headers_to_remove[..],
            ),
            (
                &vhost.response_headers_to_add,
                &vhost.response_headers_to_remove,
            ),
            (
                &table.response_headers_to_add,
                &table.response_headers_to_remove,
            ),
        ],
        request,
    )
}

/// Header edits of a route, its virtual host and its table, in Envoy's default order (the
/// most specific first, so the least specific's overwrite wins); removals before additions.
/// Values are filled in when the edits are made: a response's edits read the request too.
///
/// Boxed, and absent when there are none (nearly always): a request's route decision is moved
/// several times on its way, and carries two of these.
#[derive(Debug, Default)]
pub struct Edits(Option<Box<EditLists>>);

#[derive(Debug, Default)]
struct EditLists {
    remove: Vec<String>,
    add: Vec<(HeaderName, HeaderValue, bool)>,
}

impl Edits {
    pub(super) fn of<'a>(
        levels: impl IntoIterator<Item = (&'a [HeaderEdit], &'a [String])>,
        request: &header_format::Request<'_>,
    ) -> Edits {
        let mut edits = EditLists::default();
        for (add, remove) in levels {
            for edit in add {
                let value = header_format::render(&edit.value, request);
                // Envoy drops an added header whose value is empty (`keep_empty_value`, which
                // the converter refuses, is false); a value that is not a valid header value
                // cannot be sent.
                if value.is_empty() {
                    continue;
                }
                let (Ok(name), Ok(value)) = (
                    HeaderName::try_from(edit.name.as_str()),
                    HeaderValue::try_from(value),
                ) else {
                    tracing::debug!(header = %edit.name, "added header value not valid; not added");
                    continue;
                };
                edits.add.push((name, value, edit.append));
            }
            edits.remove.extend_from_slice(remove);
        }
        if edits.remove.is_empty() && edits.add.is_empty() {
            return Edits::default();
        }
        Edits(Some(Box::new(edits)))
    }

    /// Also set these headers, after every other edit (the cors filter's, which Envoy sets
    /// on a response after its router has edited it). A value that cannot be sent is dropped.
    pub(super) fn set_after(&mut self, headers: &[(&'static str, String)]) {
        if headers.is_empty() {
            return;
        }
        let edits = self.0.get_or_insert_with(Box::default);
        for (name, value) in headers {
            if let Ok(value) = HeaderValue::try_from(value.as_str()) {
                edits
                    .add
                    .push((HeaderName::from_static(name), value, false));
            }
        }
    }

    /// Whether there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Apply to `headers`.
    pub fn apply(&self, headers: &mut HeaderMap) {
        let Some(edits) = &self.0 else {
            return;
        };
        for name in &edits.remove {
            headers.remove(name.as_str());
        }
        for (name, value, append) in &edits.add {
            if *append {
                headers.append(name.clone(), value.clone());
            } else {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
}

/// Whether a route's header edits (any level's, before their values are filled in) are
/// empty.
pub(super) fn edits_none(
    table: &RouteConfiguration,
    vhost: &VirtualHost,
    route: &Route,
    forward: &Forward,
    cluster: &str,
) -> bool {
    let picked = match &forward.target {
        ClusterTarget::Weighted(set) => set.iter().find(|c| c.name == cluster),
        ClusterTarget::Cluster(_) => None,
    };
    picked.is_none_or(|c| {
        c.request_headers_to_add.is_empty()
            && c.request_headers_to_remove.is_empty()
            && c.response_headers_to_add.is_empty()
            && c.response_headers_to_remove.is_empty()
    }) && route.request_headers_to_add.is_empty()
        && route.request_headers_to_remove.is_empty()
        && route.response_headers_to_add.is_empty()
        && route.response_headers_to_remove.is_empty()
        && vhost.request_headers_to_add.is_empty()
        && vhost.request_headers_to_remove.is_empty()
        && vhost.response_headers_to_add.is_empty()
        && vhost.response_headers_to_remove.is_empty()
        && table.request_headers_to_add.is_empty()
        && table.request_headers_to_remove.is_empty()
        && table.response_headers_to_add.is_empty()
        && table.response_headers_to_remove.is_empty()
}
