//! The consistent-hash tables of RING_HASH and MAGLEV clusters, built as Envoy builds them so
//! that a request's hash picks the host Envoy would: over the hosts that take traffic (the
//! [`super::balance::Candidates`]), each keyed by its `address:port`, with xxHash64.
//!
//! - The ring (ketama): each host gets hashes of `address:port_0`, `…_1`, … in proportion to
//!   its weight, scaled so that the lightest host gets a whole number and the ring is at least
//!   `minimum_ring_size` (at most `maximum_ring_size`); a hash picks the first entry at or
//!   after it, wrapping round.
//! - Maglev: each host (sorted by key) fills the table along its own permutation (offset and
//!   skip from the key's hash with seeds 0 and 1), in turns by weight; a hash picks entry
//!   `hash % table_size`.
//!
//! A table is built once per set of candidates ([`fingerprint`]) and kept in the cluster's
//! state with the one before it ([`choose_kept`]); entries are indices into the candidates, in
//! their order.

use super::hash::xxhash64;
use remora_xds::model::cluster::LbPolicy;
use remora_xds::model::endpoint::Endpoint;

/// The index among `candidates` that `hash` picks, by a table `state` keeps for them: the
/// current one or the one before it when either was built for these candidates, else one
/// built now, which becomes the current (two priorities sharing the traffic keep a table each,
/// as Envoy keeps one per priority, instead of building one per request).
pub fn choose_kept<'a>(
    state: &super::ClusterState,
    policy: LbPolicy,
    candidates: impl Iterator<Item = &'a Endpoint> + Clone,
    hash: u64,
    attempt: u32,
) -> Option<usize> {
    let fingerprint = fingerprint(candidates.clone());
    let current = state.hash_table.load();
    let previous;
    let kept = match current.as_deref().filter(|t| t.fingerprint == fingerprint) {
        Some(t) => Some(t),
        None => {
            previous = state.previous_hash_table.load();
            previous.as_deref().filter(|t| t.fingerprint == fingerprint)
        }
    };
    if let Some(t) = kept {
        return t.choose(hash, attempt);
    }
    let built = HashTable::build(policy, candidates);
    let index = built.as_ref().and_then(|t| t.choose(hash, attempt));
    state.previous_hash_table.store(current.clone());
    state.hash_table.store(built.map(std::sync::Arc::new));
    index
}

/// One built table, for the candidates whose [`fingerprint`] it carries.
#[derive(Debug)]
pub struct HashTable {
    pub fingerprint: u64,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// (hash, candidate index), sorted by hash.
    Ring(Vec<(u64, u32)>),
    /// Candidate index per slot.
    Maglev(Vec<u32>),
}

/// What identifies a set of candidates in order: their addresses and weights.
pub fn fingerprint<'a>(candidates: impl Iterator<Item = &'a Endpoint>) -> u64 {
    let mut h = 0u64;
    let mut n = 0u64;
    for e in candidates {
        let mut buf = [0u8; 16 + 2 + 4];
        match e.address.ip() {
            std::net::IpAddr::V4(ip) => buf[..4].copy_from_slice(&ip.octets()),
            std::net::IpAddr::V6(ip) => buf[..16].copy_from_slice(&ip.octets()),
        }
        buf[16..18].copy_from_slice(&e.address.port().to_be_bytes());
        buf[18..].copy_from_slice(&e.weight.to_be_bytes());
        h = xxhash64(&buf, h);
        n += 1;
    }
    h ^ n.rotate_left(32)
}

impl HashTable {
    /// The table of `policy` (RING_HASH or MAGLEV) over `candidates`; `None` for another
    /// policy or no candidate.
    pub fn build<'a>(
        policy: LbPolicy,
        candidates: impl Iterator<Item = &'a Endpoint> + Clone,
    ) -> Option<HashTable> {
        let fingerprint = fingerprint(candidates.clone());
        let hosts: Vec<(String, f64)> = normalized(candidates);
        if hosts.is_empty() {
            return None;
        }
        let kind = match policy {
            LbPolicy::RingHash {
                minimum_ring_size,
                maximum_ring_size,
            } => Kind::Ring(ring(&hosts, minimum_ring_size, maximum_ring_size)),
            LbPolicy::Maglev { table_size } => Kind::Maglev(maglev(&hosts, table_size)),
            _ => return None,
        };
        Some(HashTable { fingerprint, kind })
    }

    /// The candidate index `hash` picks; `attempt` above 0 (a retry's pick again) moves off
    /// the first choice as Envoy does.
    pub fn choose(&self, hash: u64, attempt: u32) -> Option<usize> {
        match &self.kind {
            Kind::Ring(ring) => {
                if ring.is_empty() {
                    return None;
                }
                let at = ring.partition_point(|(h, _)| *h < hash);
                let at = if at == ring.len() { 0 } else { at };
                let at = (at + attempt as usize) % ring.len();
                Some(ring[at].1 as usize)
            }
            Kind::Maglev(table) => {
                if table.is_empty() {
                    return None;
                }
                let hash = if attempt > 0 {
                    hash ^ (u64::MAX - u64::from(attempt) + 1)
                } else {
                    hash
                };
                let slot = (hash % table.len() as u64) as usize;
                Some(table[slot] as usize)
            }
        }
    }

    /// Entries of the ring or the table (admin pages, tests).
    pub fn len(&self) -> usize {
        match &self.kind {
            Kind::Ring(r) => r.len(),
            Kind::Maglev(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Each candidate's key and weight over the sum of the weights.
fn normalized<'a>(candidates: impl Iterator<Item = &'a Endpoint> + Clone) -> Vec<(String, f64)> {
    let sum: u64 = candidates.clone().map(|e| u64::from(e.weight.max(1))).sum();
    candidates
        .map(|e| {
            (
                e.address.to_string(),
                f64::from(e.weight.max(1)) / sum as f64,
            )
        })
        .collect()
}

fn ring(hosts: &[(String, f64)], min_size: u64, max_size: u64) -> Vec<(u64, u32)> {
    let min_weight = hosts.iter().map(|h| h.1).fold(1.0, f64::min);
    // Envoy's arithmetic, in the same order, so that the ring has the same entries.
    let scale = ((min_weight * min_size as f64).ceil() / min_weight).min(max_size as f64);
    let size = scale.ceil() as usize;
    let mut ring = Vec::with_capacity(size);
    let (mut current, mut target) = (0.0f64, 0.0f64);
    let mut key = String::new();
    for (index, (address, weight)) in hosts.iter().enumerate() {
        target += scale * weight;
        let mut i = 0u64;
        while current < target {
            key.clear();
            key.push_str(address);
            key.push('_');
            key.push_str(&i.to_string());
            ring.push((xxhash64(key.as_bytes(), 0), index as u32));
            i += 1;
            current += 1.0;
        }
    }
    ring.sort_by_key(|(h, _)| *h);
    ring
}

fn maglev(hosts: &[(String, f64)], table_size: u64) -> Vec<u32> {
    struct Entry {
        index: u32,
        offset: u64,
        skip: u64,
        weight: f64,
        target: f64,
        next: u64,
    }
    let max_weight = hosts.iter().map(|h| h.1).fold(0.0, f64::max);
    let mut sorted: Vec<(usize, &(String, f64))> = hosts.iter().enumerate().collect();
    sorted.sort_by(|a, b| a.1 .0.cmp(&b.1 .0));
    let mut entries: Vec<Entry> = sorted
        .into_iter()
        .map(|(index, (key, weight))| Entry {
            index: index as u32,
            offset: xxhash64(key.as_bytes(), 0) % table_size,
            skip: xxhash64(key.as_bytes(), 1) % (table_size - 1) + 1,
            weight: *weight,
            target: 0.0,
            next: 0,
        })
        .collect();
    let size = table_size as usize;
    let mut table = vec![u32::MAX; size];
    let mut filled = 0usize;
    let mut iteration = 1u64;
    let permutation = |e: &Entry| ((e.offset + e.skip * e.next) % table_size) as usize;
    while filled < size {
        for e in entries.iter_mut() {
            if filled >= size {
                break;
            }
            // A host of the heaviest weight takes a slot every turn, one of a third of it
            // every third turn.
            if (iteration as f64) * e.weight < e.target {
                continue;
            }
            e.target += max_weight;
            let mut c = permutation(e);
            while table[c] != u32::MAX {
                e.next += 1;
                c = permutation(e);
            }
            table[c] = e.index;
            e.next += 1;
            filled += 1;
        }
        iteration += 1;
    }
    table
}

#[cfg(test)]
mod tests;
