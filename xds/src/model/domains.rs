//! Which virtual host of a route table a Host header reaches, found as Envoy finds it: an
//! exact domain by hash, then the longest suffix wildcard (`*.example.com`), then the longest
//! prefix wildcard (`api.*`), then `*`. istiod writes a table of every service's domains (tens
//! of thousands at scale), so the exact ones, nearly all of them, are looked up rather than
//! compared one by one.

use super::route::VirtualHost;

/// The domains of a table's virtual hosts, each naming its host by position. Built once with
/// the table ([`DomainIndex::of`]); on equal domains the first virtual host wins.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DomainIndex {
    /// Lower-cased (hosts and domains compare without regard to ASCII case).
    exact: foldhash::HashMap<String, usize>,
    /// `*.example.com` as `.example.com`, longest first.
    suffixes: Vec<(String, usize)>,
    /// `api.*` as `api.`, longest first.
    prefixes: Vec<(String, usize)>,
    any: Option<usize>,
}

impl DomainIndex {
    pub fn of(virtual_hosts: &[VirtualHost]) -> DomainIndex {
        let mut index = DomainIndex::default();
        for (at, vh) in virtual_hosts.iter().enumerate() {
            for domain in &vh.domains {
                if domain == "*" {
                    index.any.get_or_insert(at);
                } else if let Some(suffix) = domain.strip_prefix('*') {
                    index.suffixes.push((suffix.to_ascii_lowercase(), at));
                } else if let Some(prefix) = domain.strip_suffix('*') {
                    index.prefixes.push((prefix.to_ascii_lowercase(), at));
                } else {
                    index.exact.entry(domain.to_ascii_lowercase()).or_insert(at);
                }
            }
        }
        // Stable: among wildcards of one length, the first written wins.
        index
            .suffixes
            .sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        index
            .prefixes
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        index
    }

    /// The position of the virtual host `host` (its port already taken off, if the table says
    /// so) reaches.
    pub fn find(&self, host: &str) -> Option<usize> {
        let exact = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            self.exact.get(&host.to_ascii_lowercase())
        } else {
            self.exact.get(host)
        };
        if let Some(at) = exact {
            return Some(*at);
        }
        // A wildcard must match at least one character besides its fixed part.
        let bytes = host.as_bytes();
        let suffix = self.suffixes.iter().find(|(s, _)| {
            bytes.len() > s.len()
                && bytes[bytes.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes())
        });
        if let Some((_, at)) = suffix {
            return Some(*at);
        }
        let prefix = self.prefixes.iter().find(|(p, _)| {
            bytes.len() > p.len() && bytes[..p.len()].eq_ignore_ascii_case(p.as_bytes())
        });
        prefix.map(|(_, at)| *at).or(self.any)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vh(name: &str, domains: &[&str]) -> VirtualHost {
        VirtualHost {
            name: name.into(),
            domains: domains.iter().map(|d| d.to_string()).collect(),
            routes: vec![],
            retry_policy: None,
            include_request_attempt_count: false,
            request_headers_to_add: vec![],
            request_headers_to_remove: vec![],
            response_headers_to_add: vec![],
            response_headers_to_remove: vec![],
        }
    }

    #[test]
    fn exact_then_longest_suffix_then_longest_prefix_then_any() {
        let hosts = [
            vh("a", &["*"]),
            vh("b", &["*.com"]),
            vh("c", &["*.example.com", "Reviews"]),
            vh("d", &["api.*", "api.v1.*"]),
            vh("e", &["api.v1.*", "*.example.com", "reviews"]),
        ];
        let index = DomainIndex::of(&hosts);
        assert_eq!(index.find("reviews"), Some(2), "the first of equal domains");
        assert_eq!(index.find("REVIEWS"), Some(2), "without regard to case");
        assert_eq!(index.find("www.example.com"), Some(2));
        assert_eq!(index.find("www.other.com"), Some(1));
        assert_eq!(index.find("api.v1.x"), Some(3));
        assert_eq!(index.find("api.x"), Some(3));
        assert_eq!(
            index.find("api.v1.example.com"),
            Some(2),
            "a suffix before a prefix"
        );
        // A wildcard matches at least one character besides its fixed part.
        assert_eq!(index.find(".com"), Some(0));
        assert_eq!(index.find("api."), Some(0));
        assert_eq!(DomainIndex::of(&hosts[1..2]).find("other"), None);
    }
}
