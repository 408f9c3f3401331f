//! What a connection keeps of its last route decision, so the next request on it (nearly
//! always to the same host, and mostly to the same cluster) does not look them up again: the
//! route table, the virtual host of the last Host, the last few clusters resolved with their
//! run-time state and endpoints, and the plans of the last few routes and clusters forwarded
//! by ([`RoutePlan`]): a few, as a weighted route (a canary's two subsets) alternates between
//! its clusters, and kept alone the last one was made again on every change of cluster. All of it is valid for one generation of the store
//! ([`Store::generation`]): a push makes it again on the next request. It holds what it
//! found (a table, a cluster), never a whole snapshot, so an idle connection keeps no old
//! snapshot alive. One per connection, locked only while a request is decided (never across
//! an await), so contended by nothing but the streams of one HTTP/2 connection.

use super::plan::{RoutePlan, Source};
use super::RoutedCluster;
use crate::http::ConnContext;
use remora_xds::model::listener::RouteSource;
use remora_xds::model::route::{Route, RouteConfiguration, VirtualHost};
use remora_xds::store::Store;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A connection's memo of its route decisions (empty until its first request).
#[derive(Debug, Default)]
pub struct RouteMemo(Mutex<Option<Memo>>);

impl RouteMemo {
    /// The memo, for the decision of one request.
    pub fn lock(&self) -> MutexGuard<'_, Option<Memo>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What one generation of the store gave the connection's last requests.
#[derive(Debug)]
pub struct Memo {
    generation: u64,
    /// The connection's route table (`None`: RDS has not delivered it).
    table: Option<Arc<RouteConfiguration>>,
    /// The last request's Host, and its virtual host's position in the table (`None`: none
    /// takes it); `host` is empty before any was looked up.
    host: String,
    vhost: Option<usize>,
    /// The last clusters requests were routed to, resolved.
    clusters: Kept<Arc<RoutedCluster>>,
    /// The plans of the last routes and clusters requests were forwarded by.
    plans: Kept<(PlanKey, Arc<RoutePlan>)>,
}

/// How many clusters and plans a memo keeps: a weighted route's clusters (istiod writes one
/// per subset of a VirtualService's split; two for a canary, rarely more than four).
const KEPT: usize = 4;

/// The last [`KEPT`] values kept, the oldest replaced first.
#[derive(Debug)]
struct Kept<T> {
    slots: [Option<T>; KEPT],
    next: usize,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept {
            slots: std::array::from_fn(|_| None),
            next: 0,
        }
    }
}

impl<T> Kept<T> {
    fn find(&self, wanted: impl Fn(&T) -> bool) -> Option<&T> {
        self.slots.iter().flatten().find(|t| wanted(t))
    }

    fn keep(&mut self, value: T) {
        self.slots[self.next] = Some(value);
        self.next = (self.next + 1) % KEPT;
    }
}

/// A route of the memo's table and one of its clusters, by address: both live in the table
/// the memo holds, so no other route or name can take their addresses while it is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PlanKey {
    route: usize,
    cluster: usize,
    cluster_len: usize,
}

impl PlanKey {
    fn of(route: &Route, cluster: &str) -> PlanKey {
        PlanKey {
            route: std::ptr::from_ref(route) as usize,
            cluster: cluster.as_ptr() as usize,
            cluster_len: cluster.len(),
        }
    }
}

impl Memo {
    /// The memo of the store's generation now: `slot`'s when it is of it, else a new one.
    pub fn of<'m>(slot: &'m mut Option<Memo>, store: &Store, routes: &RouteSource) -> &'m mut Memo {
        let generation = store.generation();
        if slot.as_ref().is_some_and(|m| m.generation == generation) {
            if let Some(memo) = slot {
                return memo;
            }
        }
        let snapshot = store.current();
        slot.insert(Memo {
            generation,
            table: crate::route::route_table(&snapshot, routes).cloned(),
            host: String::new(),
            vhost: None,
            clusters: Kept::default(),
            plans: Kept::default(),
        })
    }

    /// The route table and the virtual host for `host` in it (`None`: no table), and the
    /// clusters, apart so that both can be used at once. `host` is the request's Host as
    /// received: it is checked for UTF-8 only when it is not the last one (`None`: it is not
    /// UTF-8).
    #[allow(clippy::type_complexity)] // two views of one memo
    pub fn split<'m>(
        &'m mut self,
        store: &'m Store,
        host: &[u8],
    ) -> Option<(Option<Table<'m>>, Clusters<'m>)> {
        let clusters = Clusters {
            store,
            generation: self.generation,
            last: &mut self.clusters,
            plans: &mut self.plans,
        };
        let Some(table) = self.table.as_deref() else {
            return Some((None, clusters));
        };
        if self.host.is_empty() || self.host.as_bytes() != host {
            let host = std::str::from_utf8(host).ok()?;
            self.vhost = table.virtual_host_index(host);
            self.host.clear();
            self.host.push_str(host);
        }
        let vhost = self.vhost.and_then(|i| table.virtual_hosts.get(i));
        let host = self.host.as_str();
        Some((Some(Table { table, vhost, host }), clusters))
    }
}

/// The connection's route table, and the virtual host of the request's Host.
#[derive(Debug, Clone, Copy)]
pub struct Table<'m> {
    pub table: &'m RouteConfiguration,
    pub vhost: Option<&'m VirtualHost>,
    /// The request's Host, checked.
    pub host: &'m str,
}

/// The store's clusters, the last ones resolved kept.
#[derive(Debug)]
pub struct Clusters<'m> {
    store: &'m Store,
    generation: u64,
    last: &'m mut Kept<Arc<RoutedCluster>>,
    plans: &'m mut Kept<(PlanKey, Arc<RoutePlan>)>,
}

impl Clusters<'_> {
    /// The cluster named `name`, resolved for `ctx`'s requests (`None`: there is no such
    /// cluster).
    pub fn get(&mut self, ctx: &ConnContext, name: &str) -> Option<Arc<RoutedCluster>> {
        if let Some(c) = self.last.find(|c| c.model.name == name) {
            return Some(Arc::clone(c));
        }
        let snapshot = self.store.current();
        let model = snapshot.cluster(name)?;
        let resolved = RoutedCluster::resolve(ctx, &snapshot, model, self.generation);
        let resolved = Arc::new(resolved);
        self.last.keep(Arc::clone(&resolved));
        Some(resolved)
    }

    /// The plan of a forwarding decision (`source`: a route of the memo's table and one of
    /// its clusters): a kept one's again when it is of the same route and cluster, else made
    /// now, its cluster resolved.
    pub(super) fn plan(&mut self, ctx: &ConnContext, source: &Source<'_>) -> Arc<RoutePlan> {
        let key = PlanKey::of(source.route, source.cluster);
        if let Some((_, plan)) = self.plans.find(|(k, _)| *k == key) {
            return Arc::clone(plan);
        }
        let target = self.get(ctx, source.cluster);
        let plan = Arc::new(RoutePlan::new(source, target));
        self.plans.keep((key, Arc::clone(&plan)));
        plan
    }
}

#[cfg(test)]
mod tests {
    use crate::http::routed::{decide_request, Answer, Decided};
    use crate::http::ConnContext;
    use prost::Message;
    use remora_config::Config;
    use remora_xds::model::listener::RouteSource;
    use remora_xds::model::route::RequestParts;
    use remora_xds::sink::{type_url, Resource, Sink, Update};
    use serde_json::json;
    use std::sync::Arc;

    const REVIEWS: &str = "outbound|9080||reviews.default.svc.cluster.local";
    const V1: &str = "outbound|9080|v1|reviews.default.svc.cluster.local";

    fn decide(ctx: &ConnContext, host: &str, path: &str) -> Decided {
        let header = |_: &str| None;
        let req = RequestParts {
            method: "GET",
            path_and_query: path,
            header: &header,
            values: &|_: &str, _: &mut dyn FnMut(&str) -> bool| false,
        };
        decide_request(
            ctx,
            &RouteSource::Rds("9080".into()),
            host.as_bytes(),
            &req,
            None,
            0,
        )
        .unwrap_or_else(|_| panic!("{host}{path} is routed"))
    }

    fn cluster_of(d: &Decided) -> Arc<super::RoutedCluster> {
        Arc::clone(d.routed.cluster.as_ref().expect("a known cluster"))
    }

    /// Table `9080` with every request sent to `cluster`.
    fn push_route_to(store: &remora_xds::store::Store, cluster: &str) {
        let table = json!({"name": "9080", "ignore_port_in_host_matching": true, "virtual_hosts": [
            {"name": "reviews", "domains": ["reviews"], "routes": [
                {"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}]});
        let body = remora_xds::json::from_json(&table, "envoy.config.route.v3.RouteConfiguration")
            .expect("a route table")
            .encode_to_vec();
        let applied = store.apply(
            type_url::ROUTE,
            Update {
                resources: vec![Resource {
                    name: "9080".into(),
                    version: "2".into(),
                    body,
                }],
                removed: vec![],
                complete: false,
            },
        );
        assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
    }

    #[test]
    fn a_connection_reuses_its_decisions_until_a_push() {
        let store = crate::route::tests::bookinfo();
        let mut proxy = crate::proxy::Proxy::for_tests(Config::default());
        Arc::get_mut(&mut proxy).expect("not shared yet").xds = Some(Arc::new(store));
        let dst = "10.96.0.10:9080".parse().expect("address");
        let ctx = ConnContext::for_tests(
            Arc::clone(&proxy),
            dst,
            "10.0.0.9:4000".parse().expect("address"),
        );
        let store = proxy.xds.as_deref().expect("the store");

        // The same cluster again: resolved once, shared; so is the route's plan.
        let (a, b) = (
            decide(&ctx, "reviews:9080", "/a"),
            decide(&ctx, "reviews:9080", "/b"),
        );
        assert!(Arc::ptr_eq(&a.routed.plan, &b.routed.plan), "planned again");
        let first = cluster_of(&a);
        let again = cluster_of(&b);
        assert_eq!(first.model.name, REVIEWS);
        assert!(Arc::ptr_eq(&first, &again), "resolved again without a push");
        assert_eq!(first.generation, store.generation());
        // Another route of the same virtual host, to another cluster: its own plan.
        let to_v1 = decide(&ctx, "reviews:9080", "/?v=1");
        assert!(!Arc::ptr_eq(&to_v1.routed.plan, &b.routed.plan));
        let v1 = cluster_of(&to_v1);
        assert_eq!(v1.model.name, V1);
        // Back to the first route, as a weighted route alternates: its plan and its cluster
        // were kept beside the other's, not made again.
        let back = decide(&ctx, "reviews:9080", "/c");
        assert!(
            Arc::ptr_eq(&back.routed.plan, &b.routed.plan),
            "planned again after another cluster"
        );
        assert!(Arc::ptr_eq(&cluster_of(&back), &first), "resolved again");
        // Another Host is looked up, not taken from the last one.
        let header = |_: &str| None;
        let req = RequestParts {
            method: "GET",
            path_and_query: "/",
            header: &header,
            values: &|_: &str, _: &mut dyn FnMut(&str) -> bool| false,
        };
        let wild = decide_request(
            &ctx,
            &RouteSource::Rds("9080".into()),
            b"a.example.com",
            &req,
            None,
            0,
        );
        // (its direct response is hyper's path's to answer)
        assert!(matches!(wild, Err(Answer::Handover)), "{wild:?}");
        // A Host that is not UTF-8 is left to hyper's path, which refuses it.
        let bad = decide_request(
            &ctx,
            &RouteSource::Rds("9080".into()),
            b"revi\xffews",
            &req,
            None,
            0,
        );
        assert!(matches!(bad, Err(Answer::Handover)), "{bad:?}");
        let other = cluster_of(&decide(&ctx, "elsewhere:80", "/"));
        assert_eq!(other.model.name, "PassthroughCluster");
        assert_eq!(
            cluster_of(&decide(&ctx, "reviews", "/")).model.name,
            REVIEWS
        );

        // A push: the table is read again, and what it routes to resolved again.
        let before = store.generation();
        push_route_to(store, V1);
        assert!(store.generation() > before);
        let pushed = decide(&ctx, "reviews", "/a");
        assert!(
            !Arc::ptr_eq(&pushed.routed.plan, &a.routed.plan),
            "a plan of the table before the push"
        );
        let pushed = cluster_of(&pushed);
        assert_eq!(pushed.model.name, V1, "the pushed table routes");
        assert_eq!(pushed.generation, store.generation());
        assert!(!Arc::ptr_eq(&pushed, &v1), "resolved again after the push");
        push_route_to(store, REVIEWS);
        assert_eq!(
            cluster_of(&decide(&ctx, "reviews", "/a")).model.name,
            REVIEWS
        );
    }
}
