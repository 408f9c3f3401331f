//! The protobuf descriptors of every message Remora may meet in a resource: Envoy's, as
//! envoy-types generated them (copied by build.rs).

use prost_reflect::DescriptorPool;

/// Envoy's descriptor set, as envoy-types ships it.
const ENVOY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy.bin"));

/// Decode the descriptor pool.
pub fn pool() -> Result<DescriptorPool, prost_reflect::DescriptorError> {
    DescriptorPool::decode(ENVOY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_messages_are_known() {
        let pool = pool().expect("envoy-types' descriptors decode");
        for name in [
            "envoy.config.listener.v3.Listener",
            "envoy.config.cluster.v3.Cluster",
            "envoy.config.route.v3.RouteConfiguration",
            "envoy.config.endpoint.v3.ClusterLoadAssignment",
        ] {
            assert!(pool.get_message_by_name(name).is_some(), "{name}");
        }
    }
}
