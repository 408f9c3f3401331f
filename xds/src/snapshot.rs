//! An immutable view of everything Remora holds from istiod, with the lookups the data path
//! makes. A new snapshot replaces the old one whole ([`crate::store::Store`] publishes it
//! through `arc-swap`), so a connection reads one consistent world without a lock.

use crate::convert::name_table::NameTableProto;
use crate::convert::Resource;
use crate::json::{self, JsonError};
use crate::model::listener::{Direction, RouteSource};
use crate::model::{Cluster, ClusterLoadAssignment, Listener, RouteConfiguration};
use envoy_types::pb::envoy::config::cluster::v3::Cluster as ClusterProto;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment as ClaProto;
use envoy_types::pb::envoy::config::listener::v3::Listener as ListenerProto;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration as RouteProto;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret as SecretProto;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::SystemTime;

/// One held resource: its model, and what a config dump shows of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<T: Resource> {
    pub model: Arc<T::Model>,
    /// The resource as received, encoded: decoded again only when a config dump asks. A
    /// decoded prost message takes several times its encoding in memory, for every resource
    /// held (the config-scale benchmark's first finding).
    encoded: Box<[u8]>,
    pub version: String,
    pub last_updated: SystemTime,
    kind: std::marker::PhantomData<fn() -> T>,
}

impl<T: Resource> Entry<T> {
    /// An entry for a resource received as `encoded` and converted into `model`.
    pub fn new(
        model: T::Model,
        encoded: Vec<u8>,
        version: String,
        last_updated: SystemTime,
    ) -> Self {
        Entry {
            model: Arc::new(model),
            encoded: encoded.into_boxed_slice(),
            version,
            last_updated,
            kind: std::marker::PhantomData,
        }
    }

    /// An entry for a resource held as its proto (read from JSON, built in a test).
    pub fn from_proto(
        model: T::Model,
        proto: &T,
        version: String,
        last_updated: SystemTime,
    ) -> Self {
        Entry::new(model, proto.encode_to_vec(), version, last_updated)
    }

    /// The resource as received, encoded.
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    /// The resource as received.
    pub fn proto(&self) -> Result<T, JsonError> {
        T::decode(&*self.encoded).map_err(|e| JsonError::Transcode {
            message: T::KIND.message_name().to_string(),
            reason: e.to_string(),
        })
    }

    /// The resource in Envoy's config-dump JSON.
    pub fn to_json(&self) -> Result<serde_json::Value, JsonError> {
        json::typed_to_json(&self.proto()?, T::KIND.message_name())
    }
}

/// Resources of one type by name.
pub type Resources<T> = BTreeMap<String, Arc<Entry<T>>>;

/// Everything held, at one instant. Each type's map sits behind its own `Arc`, so an update
/// of one type copies that map only, and the listener index is rebuilt only when listeners
/// change.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub listeners: Arc<Resources<ListenerProto>>,
    /// The clusters in force: what routing, balancing and `/config_dump`'s
    /// `dynamic_active_clusters` see.
    pub clusters: Arc<Resources<ClusterProto>>,
    /// Clusters (or new versions of clusters) received but not yet in force, as Envoy warms
    /// them: their endpoints (EDS) or the SDS secrets from the control plane their sockets name
    /// have neither arrived nor timed out (see `crate::warming`). Routing does not see them; an
    /// older version in `clusters` keeps serving meanwhile. `/config_dump`'s
    /// `dynamic_warming_clusters`.
    pub warming_clusters: Arc<Resources<ClusterProto>>,
    pub routes: Arc<Resources<RouteProto>>,
    pub endpoints: Arc<Resources<ClaProto>>,
    /// EDS names not held whose clusters' initial fetch timed out: those clusters initialised
    /// without endpoints, and want their secrets.
    pub endpoints_timed_out: Arc<BTreeSet<String>>,
    /// istiod's name table (NDS): one resource, unnamed, when DNS capture asked for it.
    pub name_tables: Arc<Resources<NameTableProto>>,
    /// Secrets istiod serves over ADS (SDS), for the clusters that name them.
    pub secrets: Arc<Resources<SecretProto>>,
    index: Arc<ListenerIndex>,
}

/// Where an original destination leads.
#[derive(Debug, Default)]
struct ListenerIndex {
    /// Listeners that are reached through another's `use_original_dst`, by exact address.
    by_address: HashMap<SocketAddr, Arc<Listener>>,
    /// The same, bound to the unspecified address (`0.0.0.0_9080`), by port and family.
    by_port: HashMap<(bool, u16), Arc<Listener>>,
    /// The listener that hands connections on by original destination (`virtualOutbound`).
    original_dst: Option<Arc<Listener>>,
    /// The bound inbound listener (`virtualInbound`), looked up for every inbound connection.
    inbound: Option<Arc<Listener>>,
}

impl ListenerIndex {
    fn new(listeners: &Resources<ListenerProto>) -> ListenerIndex {
        let mut index = ListenerIndex::default();
        for entry in listeners.values() {
            let l = &entry.model;
            if l.direction == Direction::Inbound && l.bind_to_port {
                // istiod writes one; should there be more, the first by name is taken.
                index.inbound.get_or_insert_with(|| l.clone());
            }
            if l.use_original_dst {
                // istiod writes one; should there be more, the first by name is taken.
                index.original_dst.get_or_insert_with(|| l.clone());
            } else if !l.bind_to_port {
                if l.address.ip().is_unspecified() {
                    index
                        .by_port
                        .insert((l.address.is_ipv4(), l.address.port()), l.clone());
                } else {
                    index.by_address.insert(l.address, l.clone());
                }
            }
        }
        index
    }
}

impl Snapshot {
    /// Build a snapshot (and its index) from the resources.
    pub fn new(
        listeners: Resources<ListenerProto>,
        clusters: Resources<ClusterProto>,
        routes: Resources<RouteProto>,
        endpoints: Resources<ClaProto>,
    ) -> Snapshot {
        Snapshot {
            index: Arc::new(ListenerIndex::new(&listeners)),
            listeners: Arc::new(listeners),
            clusters: Arc::new(clusters),
            warming_clusters: Arc::default(),
            endpoints_timed_out: Arc::default(),
            routes: Arc::new(routes),
            endpoints: Arc::new(endpoints),
            name_tables: Arc::default(),
            secrets: Arc::default(),
        }
    }

    /// The same snapshot with other listeners (the index follows them).
    pub fn with_listeners(&self, listeners: Resources<ListenerProto>) -> Snapshot {
        Snapshot {
            index: Arc::new(ListenerIndex::new(&listeners)),
            listeners: Arc::new(listeners),
            ..self.clone()
        }
    }

    /// The listener an outbound connection to `destination` meets, as Envoy hands it on from
    /// `virtualOutbound`: the listener for that exact address and port, else the one for any
    /// address on that port (`0.0.0.0_<port>`), else `virtualOutbound` itself (its own chains
    /// send the connection to PassthroughCluster or BlackHoleCluster).
    pub fn outbound_listener(&self, destination: SocketAddr) -> Option<&Arc<Listener>> {
        let ip = match destination.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        let destination = SocketAddr::new(ip, destination.port());
        let index = &self.index;
        index
            .by_address
            .get(&destination)
            .or_else(|| index.by_port.get(&(ip.is_ipv4(), destination.port())))
            .or(index.original_dst.as_ref())
    }

    /// The inbound listener (`virtualInbound`): bound, INBOUND.
    pub fn inbound_listener(&self) -> Option<&Arc<Listener>> {
        self.index.inbound.as_ref()
    }

    /// Every listener held, by name.
    pub fn listeners(&self) -> impl Iterator<Item = &Arc<Listener>> {
        self.listeners.values().map(|e| &e.model)
    }

    /// A listener by name.
    pub fn listener(&self, name: &str) -> Option<&Arc<Listener>> {
        self.listeners.get(name).map(|e| &e.model)
    }

    /// Every cluster held, in force or warming (an old version and its warming successor
    /// both).
    pub fn all_clusters(&self) -> impl Iterator<Item = &Arc<Entry<ClusterProto>>> {
        self.clusters.values().chain(self.warming_clusters.values())
    }

    /// The newest version held of each cluster: the warming one where there is one.
    pub fn newest_clusters(&self) -> Resources<ClusterProto> {
        let mut newest = Resources::clone(&self.clusters);
        newest.extend(
            self.warming_clusters
                .iter()
                .map(|(name, e)| (name.clone(), Arc::clone(e))),
        );
        newest
    }

    /// A cluster in force, by name (a warming one is not: Envoy's routing does not find it).
    pub fn cluster(&self, name: &str) -> Option<&Arc<Cluster>> {
        self.clusters.get(name).map(|e| &e.model)
    }

    /// An RDS route table by name.
    pub fn route_configuration(&self, name: &str) -> Option<&Arc<RouteConfiguration>> {
        self.routes.get(name).map(|e| &e.model)
    }

    /// The route table of an HTTP chain: inline, or from RDS once it has arrived.
    pub fn routes_of<'a>(&'a self, source: &'a RouteSource) -> Option<&'a Arc<RouteConfiguration>> {
        match source {
            RouteSource::Inline(rc) => Some(rc),
            RouteSource::Rds(name) => self.route_configuration(name),
        }
    }

    /// The route an HTTP request takes through a chain: its route table (inline, or from RDS),
    /// the virtual host for `host`, the first route that matches. `None`: Envoy's 404 `NR`.
    pub fn http_route<'a>(
        &'a self,
        chain: &'a crate::model::listener::HttpChain,
        host: &str,
        request: &crate::model::route::RequestParts<'_>,
    ) -> Option<&'a Arc<crate::model::route::Route>> {
        self.routes_of(&chain.routes)?
            .virtual_host(host)?
            .route(request)
    }

    /// The endpoints of a cluster: from EDS for EDS clusters (once they have arrived), else
    /// its own `load_assignment`. ORIGINAL_DST clusters have none (the destination is the
    /// endpoint).
    pub fn endpoints(&self, cluster: &str) -> Option<&ClusterLoadAssignment> {
        self.endpoints_of(self.cluster(cluster)?)
    }

    /// [`Snapshot::endpoints`] of a cluster already found.
    pub fn endpoints_of<'a>(&'a self, c: &'a Cluster) -> Option<&'a ClusterLoadAssignment> {
        match c.eds_service_name() {
            Some(service) => self.endpoints.get(service).map(|e| e.model.as_ref()),
            None => c.load_assignment.as_ref(),
        }
    }

    /// The EDS assignment of an EDS cluster already found, shared (`None` for any other
    /// cluster, and before EDS delivered it).
    pub fn eds_of(&self, c: &Cluster) -> Option<&Arc<ClusterLoadAssignment>> {
        self.endpoints.get(c.eds_service_name()?).map(|e| &e.model)
    }

    /// The name table in force: istiod's one, unnamed (or, should a source name it, the first
    /// by name). The entry, not only the model: its identity tells a reader whether the table
    /// changed since it last looked.
    pub fn name_table(&self) -> Option<&Arc<Entry<NameTableProto>>> {
        self.name_tables
            .get("")
            .or_else(|| self.name_tables.values().next())
    }

    /// A secret served over ADS, by name: its entry, whose identity tells a reader that
    /// built something from it whether it changed (a rotation).
    pub fn secret(&self, name: &str) -> Option<&Arc<Entry<SecretProto>>> {
        self.secrets.get(name)
    }

    /// The SDS names the held clusters' sockets need from the control plane. Envoy asks for a
    /// cluster's secrets when the cluster initialises, which for an EDS cluster is once its
    /// endpoints have arrived (seen on the wire from Envoy 1.40, `tests/ads_envoy.rs`): so
    /// only the clusters whose endpoints are held (or that need none) want theirs.
    /// Warming clusters count: they are what waits for the secrets.
    pub fn wanted_secrets(&self) -> BTreeSet<String> {
        self.all_clusters()
            .filter(|e| {
                e.model.eds_service_name().is_none_or(|n| {
                    self.endpoints.contains_key(n) || self.endpoints_timed_out.contains(n)
                })
            })
            .flat_map(|e| {
                e.model
                    .ads_secrets()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The EDS names the held clusters (warming ones too) need.
    pub fn wanted_endpoints(&self) -> BTreeSet<String> {
        self.all_clusters()
            .filter_map(|e| e.model.eds_service_name().map(str::to_string))
            .collect()
    }

    /// The RDS names the held listeners' HTTP chains need.
    pub fn wanted_routes(&self) -> BTreeSet<String> {
        self.listeners
            .values()
            .flat_map(|e| e.model.all_chains())
            .filter_map(|c| match &c.kind {
                crate::model::listener::ChainKind::Http(h) => match &h.routes {
                    RouteSource::Rds(name) => Some(name.clone()),
                    RouteSource::Inline(_) => None,
                },
                crate::model::listener::ChainKind::Tcp(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::{from_json, Resource};
    use serde_json::{json, Value};

    fn entry<T: Resource>(value: Value) -> (String, Arc<Entry<T>>) {
        let c = from_json::<T>(&value).unwrap_or_else(|r| panic!("{r}"));
        let name = c.proto.name().to_string();
        let entry = Entry::from_proto(c.model, &c.proto, "1".into(), SystemTime::UNIX_EPOCH);
        (name, Arc::new(entry))
    }

    #[test]
    fn static_endpoints_inbound_listener_and_route_sources() {
        let clusters = Resources::from([
            entry::<ClusterProto>(json!({"name": "inbound|8080||", "type": "STATIC",
                "load_assignment": {"cluster_name": "inbound|8080||", "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8080}}}}]}]}})),
            entry::<ClusterProto>(json!({"name": "PassthroughCluster", "type": "ORIGINAL_DST",
                "lb_policy": "CLUSTER_PROVIDED"})),
        ]);
        let listeners = Resources::from([entry::<ListenerProto>(json!({
            "name": "virtualInbound", "traffic_direction": "INBOUND",
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "inbound", "route_config": {"name": "inbound|8080||"},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]
        }))]);
        let snap = Snapshot::new(listeners, clusters, Resources::new(), Resources::new());
        let endpoints = snap.endpoints("inbound|8080||").expect("static host set");
        assert_eq!(
            endpoints.localities[0].endpoints[0].address,
            "127.0.0.1:8080".parse().expect("addr")
        );
        assert!(snap.endpoints("PassthroughCluster").is_none());
        assert!(snap.endpoints("nowhere").is_none());
        let inbound = snap.inbound_listener().expect("inbound");
        assert_eq!(inbound.name, "virtualInbound");
        // Bound listeners are not reached by original destination; with no virtualOutbound
        // nothing is.
        assert!(snap
            .outbound_listener("10.0.0.1:15006".parse().expect("addr"))
            .is_none());
        let crate::model::listener::ChainKind::Http(http) = &inbound.filter_chains[0].kind else {
            panic!("HTTP")
        };
        assert_eq!(
            snap.routes_of(&http.routes).map(|r| r.name.as_str()),
            Some("inbound|8080||")
        );
        assert!(snap.routes_of(&RouteSource::Rds("9080".into())).is_none());
        let none = |_: &str| None;
        let request = crate::model::route::RequestParts {
            method: "GET",
            path_and_query: "/health?full=1",
            header: &none,
            values: &|_: &str, _: &mut dyn FnMut(&str) -> bool| false,
        };
        // The inline table has no virtual hosts: no route (404 NR).
        assert!(snap.http_route(http, "anything", &request).is_none());
        assert!(snap.wanted_routes().is_empty());
        assert!(snap.wanted_endpoints().is_empty());
    }
}
