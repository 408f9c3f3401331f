//! The lookup table the DNS proxy answers mesh names from, built from istiod's name table
//! (NDS) as pilot-agent builds its own (`pkg/dns/client`), so that an application sees the
//! same answers behind Remora as behind the agent:
//!
//! - every host is known by its FQDN; a Kubernetes host of the pod's cluster domain also by
//!   `name.namespace`, `name.namespace.svc` (the domain's first label), and, for the pod's own
//!   namespace, `name`; plus any `alt_hosts` istiod lists;
//! - each of those names followed by the first resolv.conf search domain (what the
//!   application's resolver asks first for a name with few dots) answers a CNAME to the name,
//!   so the resolver's search walk ends at the second query;
//! - `*.example.com` hosts answer any name under them, the answer named after the question;
//! - a known name answers A or AAAA from the table, authoritatively, with TTL 30 s; a known
//!   name with no address of the asked family answers NOERROR with no records (never
//!   NXDOMAIN: a client asking A and AAAA at once would take it for the whole name);
//! - a name not in the table, or a question other than A and AAAA, goes to the upstream
//!   resolvers: pilot-agent never answers NXDOMAIN itself, not even in the cluster domain,
//!   so kube-dns keeps the last word on names istiod does not know.
//!
//! Hosts with no address that parses are left out, as pilot-agent leaves them.

use remora_xds::model::NameTable;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The TTL of every local answer: short, so that a client honouring it soon sees a new address.
pub const TTL: u32 = 30;

/// What the table needs to know of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// The pod's namespace: its services answer to their bare name.
    pub namespace: String,
    /// The cluster's service domain without the namespace (`svc.cluster.local`).
    pub domain: String,
    /// The first `search` domain of the pod's resolv.conf, if any.
    pub first_search: Option<String>,
}

impl Context {
    /// From the pod's namespace, its DNS domain as the node states it
    /// (`<ns>.svc.cluster.local`; a leading namespace label is dropped, as pilot-agent drops
    /// it) and the resolv.conf search domains.
    pub fn new(namespace: &str, dns_domain: &str, search: &[String]) -> Context {
        let domain = match dns_domain.split_once('.') {
            Some((first, rest)) if first == namespace => rest,
            _ => dns_domain,
        };
        Context {
            namespace: namespace.to_string(),
            domain: domain.to_string(),
            first_search: search.first().cloned(),
        }
    }
}

/// A question's record type, for the two the table answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    A,
    Aaaa,
}

/// One record of a local answer. Owner names are lowercase, with the trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Cname { owner: String, target: String },
    A { owner: String, ip: Ipv4Addr },
    Aaaa { owner: String, ip: Ipv6Addr },
}

/// What to do with a question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Answer locally with these records (possibly none: NOERROR, no data).
    Answer(Vec<Record>),
    /// Not ours: ask the upstream resolvers.
    Forward,
}

#[derive(Debug, Default)]
struct Addresses {
    v4: Vec<Ipv4Addr>,
    v6: Vec<Ipv6Addr>,
}

/// The built table: every name the pod may ask, lowercase with the trailing dot.
#[derive(Debug, Default)]
pub struct LookupTable {
    /// Every known name: the address names and the CNAME names.
    known: HashSet<String>,
    addresses: HashMap<String, Addresses>,
    cnames: HashMap<String, String>,
}

impl LookupTable {
    /// Build from istiod's table for the pod described by `context`.
    pub fn build(table: &NameTable, context: &Context) -> LookupTable {
        let mut out = LookupTable::default();
        for (host, info) in &table.hosts {
            let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = info.ips.iter().partition(|ip| ip.is_ipv4());
            if v4.is_empty() && v6.is_empty() {
                continue;
            }
            let names = match info.is_kubernetes() {
                true => kubernetes_names(host, info, context),
                false => HashSet::from([fqdn(host)]),
            };
            for name in &names {
                out.known.insert(name.clone());
                let entry = out.addresses.entry(name.clone()).or_default();
                entry.v4 = v4
                    .iter()
                    .filter_map(|ip| match ip {
                        IpAddr::V4(ip) => Some(*ip),
                        IpAddr::V6(_) => None,
                    })
                    .collect();
                entry.v6 = v6
                    .iter()
                    .filter_map(|ip| match ip {
                        IpAddr::V6(ip) => Some(*ip),
                        IpAddr::V4(_) => None,
                    })
                    .collect();
                // The first search domain appended: a CNAME to the name, unless that is one
                // of the host's own names (`reviews` + `ns.svc.cluster.local` is the FQDN).
                if let Some(search) = &context.first_search {
                    let expanded = fqdn(&format!("{name}{}", search.trim_end_matches('.')));
                    if !names.contains(&expanded) {
                        out.known.insert(expanded.clone());
                        out.cnames.insert(expanded, name.clone());
                    }
                }
            }
        }
        out
    }

    /// How many names the table answers.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether it answers none.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// The answer to a question for `name` (lowercase, trailing dot) of `family`; `None` as
    /// family means another record type, which is forwarded even for a known name.
    pub fn lookup(&self, name: &str, family: Option<Family>) -> Lookup {
        let mut host = name.to_string();
        let mut wildcard = false;
        if !self.known.contains(&host) {
            match self.wildcard_of(name) {
                Some(w) => {
                    host = w;
                    wildcard = true;
                }
                None => return Lookup::Forward,
            }
        }
        let Some(family) = family else {
            return Lookup::Forward;
        };
        let mut records = Vec::new();
        if let Some(target) = self.cnames.get(&host) {
            records.push(Record::Cname {
                owner: name.to_string(),
                target: target.clone(),
            });
            host = target.clone();
        }
        // A wildcard's addresses are named after the question (or, behind a CNAME, after its
        // target, which is the wildcard itself).
        let owner = match (wildcard, records.is_empty()) {
            (true, true) => name.to_string(),
            _ => host.clone(),
        };
        let before = records.len();
        if let Some(a) = self.addresses.get(&host) {
            match family {
                Family::A => records.extend(a.v4.iter().map(|ip| Record::A {
                    owner: owner.clone(),
                    ip: *ip,
                })),
                Family::Aaaa => records.extend(a.v6.iter().map(|ip| Record::Aaaa {
                    owner: owner.clone(),
                    ip: *ip,
                })),
            }
        }
        // A CNAME alone, with no address behind it, is not sent: pilot-agent answers only
        // when there are addresses.
        if records.len() == before {
            records.clear();
        }
        Lookup::Answer(records)
    }

    /// The closest `*.` entry above `name`.
    fn wildcard_of(&self, name: &str) -> Option<String> {
        let mut rest = name;
        while let Some((_, parent)) = rest.split_once('.') {
            if parent.is_empty() {
                return None;
            }
            let candidate = format!("*.{parent}");
            if self.known.contains(&candidate) {
                return Some(candidate);
            }
            rest = parent;
        }
        None
    }
}

/// `host` lowercase with one trailing dot.
fn fqdn(host: &str) -> String {
    let mut out = host.trim_end_matches('.').to_ascii_lowercase();
    out.push('.');
    out
}

/// The names of a Kubernetes host: its FQDN, and if it is in the pod's cluster domain,
/// `name.namespace`, `name.namespace.<first label of the domain>`, `name` for the pod's own
/// namespace, and the alt hosts.
fn kubernetes_names(
    host: &str,
    info: &remora_xds::model::name_table::NameInfo,
    context: &Context,
) -> HashSet<String> {
    let mut names = HashSet::from([fqdn(host)]);
    if context.domain.is_empty() || !host.trim_end_matches('.').ends_with(&context.domain) {
        // Another cluster's domain: its `name.namespace` could clash with ours.
        return names;
    }
    let (short, ns) = (&info.shortname, &info.namespace);
    names.insert(fqdn(&format!("{short}.{ns}")));
    if *ns == context.namespace {
        names.insert(fqdn(short));
    }
    let first = context.domain.split('.').next().unwrap_or_default();
    names.insert(fqdn(&format!("{short}.{ns}.{first}")));
    names.extend(info.alt_hosts.iter().map(|h| fqdn(h)));
    names
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
