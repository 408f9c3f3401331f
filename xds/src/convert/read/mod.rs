//! Which fields of Envoy's messages Remora reads: the list [`super::fields::check`] holds every
//! resource to. A field not listed for its message is refused by name; a message not listed
//! is a value its converter reads whole. Adding a field here is a promise that the converter
//! honours it (or refuses the values it cannot).
//!
//! The list is kept in one table per kind of resource (a module each); a message belongs to
//! exactly one of them, which the tests check.

mod authz;
mod cluster;
mod http;
mod listener;
mod route;
mod tls;

/// Message full name → the fields Remora reads in it.
type Table = &'static [(&'static str, &'static [&'static str])];

/// Every table, by kind of resource.
const TABLES: &[Table] = &[
    listener::READ,
    http::READ,
    authz::READ,
    route::READ,
    cluster::READ,
    tls::READ,
];

/// Every listed message with the fields Remora reads in it.
pub fn all() -> impl Iterator<Item = &'static (&'static str, &'static [&'static str])> {
    TABLES.iter().flat_map(|table| table.iter())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    #[test]
    fn no_message_is_listed_twice() {
        let mut seen = HashSet::new();
        for (message, _) in super::all() {
            assert!(seen.insert(*message), "{message} is listed twice");
        }
        assert!(seen.len() > 100, "only {} messages listed", seen.len());
    }
}
