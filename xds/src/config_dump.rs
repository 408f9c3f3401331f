//! The held resources in the shape of Envoy's `/config_dump` (its `configs` array of
//! `ListenersConfigDump`, `ClustersConfigDump`, `RoutesConfigDump` and `EndpointsConfigDump`,
//! dynamic resources with version and last-updated time), which `istioctl proxy-config` reads.

use crate::convert::Resource;
use crate::json::JsonError;
use crate::snapshot::{Resources, Snapshot};
use serde_json::{json, Map, Value};

const ADMIN: &str = "type.googleapis.com/envoy.admin.v3.";

/// The snapshot's resources as Envoy's config dump.
pub fn config_dump(snapshot: &Snapshot) -> Result<Value, JsonError> {
    Ok(json!({"configs": [
        section("ListenersConfigDump", "dynamic_listeners", &snapshot.listeners, |entry, name| {
            // Envoy nests a listener's state: the active one is what is in force.
            json!({"name": name, "active_state": entry})
        })?,
        section("ClustersConfigDump", "dynamic_active_clusters", &snapshot.clusters, |e, _| e)?,
        section("RoutesConfigDump", "dynamic_route_configs", &snapshot.routes, |e, _| e)?,
        section("EndpointsConfigDump", "dynamic_endpoint_configs", &snapshot.endpoints, |e, _| e)?,
    ]}))
}

/// The field a dump entry holds its resource in.
fn resource_field<T: Resource>() -> &'static str {
    use crate::refusal::Kind;
    match T::KIND {
        Kind::Listener => "listener",
        Kind::Cluster => "cluster",
        Kind::Route => "route_config",
        Kind::Endpoint => "endpoint_config",
        Kind::Secret => "secret",
        Kind::ExtensionConfig => "ecds_filter",
    }
}

fn section<T: Resource>(
    dump_type: &str,
    list: &str,
    resources: &Resources<T>,
    wrap: impl Fn(Value, &str) -> Value,
) -> Result<Value, JsonError> {
    let mut entries = Vec::with_capacity(resources.len());
    for (name, entry) in resources {
        let mut resource = entry.to_json()?;
        if let Some(map) = resource.as_object_mut() {
            // An Any in the dump: the resource names its own type first.
            let mut with_type = Map::new();
            with_type.insert(
                "@type".into(),
                format!("type.googleapis.com/{}", T::KIND.message_name()).into(),
            );
            with_type.extend(std::mem::take(map));
            *map = with_type;
        }
        let last_updated = humantime::format_rfc3339_millis(entry.last_updated).to_string();
        let inner = json!({
            "version_info": entry.version,
            resource_field::<T>(): resource,
            "last_updated": last_updated,
        });
        entries.push(wrap(inner, name));
    }
    Ok(json!({"@type": format!("{ADMIN}{dump_type}"), list: entries}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::{type_url, Resource as Delivered, Sink, Update};
    use crate::store::Store;
    use crate::validate::validate_config_dump;

    #[test]
    fn a_dump_of_the_store_validates_and_carries_versions() {
        let store = Store::new();
        let cluster = json!({"name": "outbound|80||a", "type": "EDS",
            "eds_cluster_config": {"eds_config": {"ads": {}}}, "lb_policy": "LEAST_REQUEST"});
        let proto: envoy_types::pb::envoy::config::cluster::v3::Cluster =
            crate::json::from_json_typed(&cluster, "envoy.config.cluster.v3.Cluster")
                .expect("reads");
        store.apply(
            type_url::CLUSTER,
            Update {
                resources: vec![Delivered {
                    name: String::new(),
                    version: "2026-11-27T00:00:00Z/7".into(),
                    body: prost::Message::encode_to_vec(&proto),
                }],
                removed: vec![],
                complete: true,
            },
        );
        let dump = config_dump(&store.snapshot()).expect("dumps");
        let clusters = &dump["configs"][1];
        assert_eq!(
            clusters["@type"],
            "type.googleapis.com/envoy.admin.v3.ClustersConfigDump"
        );
        let entry = &clusters["dynamic_active_clusters"][0];
        assert_eq!(entry["version_info"], "2026-11-27T00:00:00Z/7");
        assert_eq!(entry["cluster"]["name"], "outbound|80||a");
        assert_eq!(entry["cluster"]["lb_policy"], "LEAST_REQUEST");
        assert!(entry["last_updated"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')));
        let verdicts = validate_config_dump(&dump);
        assert_eq!(verdicts.len(), 1);
        assert_eq!(verdicts[0].to_string(), "accepted cluster outbound|80||a");
    }
}
