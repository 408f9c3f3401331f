use super::*;
use remora_xds::model::endpoint::Health;
use std::collections::HashMap;
use std::net::SocketAddr;

fn hosts(lasts: &[u8]) -> Vec<Endpoint> {
    lasts
        .iter()
        .map(|last| Endpoint {
            address: SocketAddr::from(([10, 0, 0, *last], 8080)),
            health: Health::Healthy,
            weight: 1,
            tls_mode: None,
            workload: None,
        })
        .collect()
}

const RING: LbPolicy = LbPolicy::RingHash {
    minimum_ring_size: 1024,
    maximum_ring_size: 8 * 1024 * 1024,
};
const MAGLEV: LbPolicy = LbPolicy::Maglev { table_size: 65537 };

/// The address each of `keys` picks.
fn picks(policy: LbPolicy, hosts: &[Endpoint], keys: u32) -> Vec<SocketAddr> {
    let table = HashTable::build(policy, hosts.iter()).expect("table");
    (0..keys)
        .map(|k| {
            let hash = xxhash64(format!("user-{k}").as_bytes(), 0);
            hosts[table.choose(hash, 0).expect("host")].address
        })
        .collect()
}

#[test]
fn the_ring_has_envoys_size_and_the_table_its_prime() {
    let three = hosts(&[1, 2, 3]);
    // The lightest host gets a whole number of entries: ceil(1024 / 3) = 342 each.
    assert_eq!(
        HashTable::build(RING, three.iter()).expect("ring").len(),
        1026
    );
    let small = LbPolicy::RingHash {
        minimum_ring_size: 1024,
        maximum_ring_size: 64,
    };
    assert_eq!(
        HashTable::build(small, three.iter()).expect("ring").len(),
        64
    );
    assert_eq!(
        HashTable::build(MAGLEV, three.iter()).expect("table").len(),
        65537
    );
    assert!(HashTable::build(RING, hosts(&[]).iter()).is_none());
    assert!(HashTable::build(LbPolicy::Random, three.iter()).is_none());
}

#[test]
fn the_same_key_picks_the_same_host_and_keys_spread() {
    for policy in [RING, MAGLEV] {
        let four = hosts(&[1, 2, 3, 4]);
        let first = picks(policy, &four, 4000);
        assert_eq!(first, picks(policy, &four, 4000), "{policy:?}: stable");
        let mut count: HashMap<SocketAddr, u32> = HashMap::new();
        for a in &first {
            *count.entry(*a).or_default() += 1;
        }
        assert_eq!(count.len(), 4, "{policy:?}: every host takes keys");
        for (a, n) in count {
            // 1000 each if even; a ring of 1024 spreads within a few tens of percent.
            assert!((600..1400).contains(&n), "{policy:?}: {a} took {n}");
        }
    }
}

#[test]
fn removing_a_host_moves_only_its_keys() {
    for policy in [RING, MAGLEV] {
        let before = picks(policy, &hosts(&[1, 2, 3, 4]), 4000);
        let after = picks(policy, &hosts(&[1, 2, 4]), 4000);
        let gone = SocketAddr::from(([10, 0, 0, 3], 8080));
        let mut moved_others = 0;
        for (b, a) in before.iter().zip(&after) {
            assert_ne!(*a, gone);
            if *b != gone && a != b {
                moved_others += 1;
            }
        }
        // A hash modulo the hosts would move three quarters of them. The ring moves some:
        // the hosts left take more entries each (256 of 1024 become 342 of 1026), as in
        // Envoy; Maglev a few (its table refills along the permutations).
        let bound = match policy {
            LbPolicy::RingHash { .. } => 4000 / 8,
            _ => 4000 / 50,
        };
        assert!(moved_others < bound, "{policy:?}: {moved_others} moved");
    }
}

#[test]
fn weights_share_the_keys_and_the_order_of_hosts_does_not_matter_to_maglev() {
    let mut weighted = hosts(&[1, 2]);
    weighted[0].weight = 3;
    for policy in [RING, MAGLEV] {
        let first = picks(policy, &weighted, 4000);
        let heavy = first.iter().filter(|a| **a == weighted[0].address).count();
        assert!((2700..3300).contains(&heavy), "{policy:?}: {heavy} of 4000");
    }
    let forward = hosts(&[1, 2, 3]);
    let mut backward = forward.clone();
    backward.reverse();
    assert_eq!(picks(MAGLEV, &forward, 500), picks(MAGLEV, &backward, 500));
}

#[test]
fn a_retry_moves_off_the_first_pick() {
    let three = hosts(&[1, 2, 3]);
    for policy in [RING, MAGLEV] {
        let table = HashTable::build(policy, three.iter()).expect("table");
        let moved = (0..200u64)
            .filter(|k| {
                table.choose(xxhash64(&k.to_be_bytes(), 0), 0)
                    != table.choose(xxhash64(&k.to_be_bytes(), 0), 1)
            })
            .count();
        assert!(moved > 50, "{policy:?}: {moved}");
    }
}

#[test]
fn the_fingerprint_changes_with_the_set() {
    let a = hosts(&[1, 2, 3]);
    let mut b = a.clone();
    assert_eq!(fingerprint(a.iter()), fingerprint(b.iter()));
    b[1].weight = 2;
    assert_ne!(fingerprint(a.iter()), fingerprint(b.iter()));
    assert_ne!(fingerprint(a.iter()), fingerprint(a[..2].iter()));
}
