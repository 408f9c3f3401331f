//! The consistent-hash policies of a cluster: RING_HASH (`ring_hash_lb_config`) and MAGLEV
//! (`maglev_lb_config`), with Envoy's defaults and bounds.

use crate::model::cluster::{
    LbPolicy, DEFAULT_MAGLEV_TABLE_SIZE, DEFAULT_MAX_RING_SIZE, DEFAULT_MIN_RING_SIZE,
};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::cluster::v3 as pb;

/// Envoy's bound on both ring sizes.
const RING_SIZE_BOUND: u64 = 8 * 1024 * 1024;
/// Envoy's bound on a Maglev table (exclusive).
const MAGLEV_TABLE_BOUND: u64 = 5_000_011;

/// RING_HASH with its configuration.
pub fn ring_hash(c: &pb::Cluster) -> Result<LbPolicy, Fault> {
    let (minimum_ring_size, maximum_ring_size) = match &c.lb_config {
        Some(pb::cluster::LbConfig::RingHashLbConfig(r)) => {
            use pb::cluster::ring_hash_lb_config::HashFunction as H;
            match H::try_from(r.hash_function) {
                Ok(H::XxHash) => {}
                Ok(H::MurmurHash2) => {
                    return Err(Fault::new(
                        "ring_hash_lb_config.hash_function",
                        "MURMUR_HASH_2 not supported (XX_HASH only)",
                    ))
                }
                Err(_) => {
                    return Err(Fault::new(
                        "ring_hash_lb_config.hash_function",
                        "unknown hash function",
                    ))
                }
            }
            (
                r.minimum_ring_size
                    .as_ref()
                    .map_or(DEFAULT_MIN_RING_SIZE, |v| v.value),
                r.maximum_ring_size
                    .as_ref()
                    .map_or(DEFAULT_MAX_RING_SIZE, |v| v.value),
            )
        }
        _ => (DEFAULT_MIN_RING_SIZE, DEFAULT_MAX_RING_SIZE),
    };
    for (field, v) in [
        ("minimum_ring_size", minimum_ring_size),
        ("maximum_ring_size", maximum_ring_size),
    ] {
        if v == 0 || v > RING_SIZE_BOUND {
            return Err(Fault::new(
                format!("ring_hash_lb_config.{field}"),
                format!("must be in 1..={RING_SIZE_BOUND}"),
            ));
        }
    }
    if minimum_ring_size > maximum_ring_size {
        return Err(Fault::new(
            "ring_hash_lb_config.minimum_ring_size",
            format!("{minimum_ring_size} is over maximum_ring_size {maximum_ring_size}"),
        ));
    }
    Ok(LbPolicy::RingHash {
        minimum_ring_size,
        maximum_ring_size,
    })
}

/// MAGLEV with its table size, which must be a prime (as Envoy demands).
pub fn maglev(c: &pb::Cluster) -> Result<LbPolicy, Fault> {
    let table_size = match &c.lb_config {
        Some(pb::cluster::LbConfig::MaglevLbConfig(m)) => m
            .table_size
            .as_ref()
            .map_or(DEFAULT_MAGLEV_TABLE_SIZE, |v| v.value),
        _ => DEFAULT_MAGLEV_TABLE_SIZE,
    };
    if table_size >= MAGLEV_TABLE_BOUND || !prime(table_size) {
        return Err(Fault::new(
            "maglev_lb_config.table_size",
            format!("{table_size} is not a prime under {MAGLEV_TABLE_BOUND}"),
        ));
    }
    Ok(LbPolicy::Maglev { table_size })
}

fn prime(n: u64) -> bool {
    n >= 2
        && (2..)
            .take_while(|d| d * d <= n)
            .all(|d| !n.is_multiple_of(d))
}

#[cfg(test)]
mod tests {
    use super::prime;

    #[test]
    fn primes() {
        let small: Vec<u64> = (0..30).filter(|n| prime(*n)).collect();
        assert_eq!(small, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert!(prime(65537));
        assert!(!prime(65536));
    }
}
