//! Envoy's statistics of the filters on istiod's chains, each kept per stat prefix or
//! connection manager: RBAC, fault, network and HTTP ext_authz, `tcp_proxy` and cors. Those
//! Envoy makes when it loads a listener are made here first from the resources in force, at a
//! scrape, off the data path.

use super::{EnvoyStat, EnvoyStats, Kind, Scope};

impl EnvoyStats {
    /// The filters' statistics, onto `stats`.
    pub(super) fn filter_stats(&self, stats: &mut Vec<EnvoyStat>) {
        let stat = EnvoyStat::new;
        let c = |scope, name, value| stat(Kind::Counter, scope, name, value);
        let mut listeners = Vec::new();
        if let Some(store) = self.xds.get() {
            let snapshot = store.current();
            crate::metrics::rbac_filters::make_configured(&self.rbac_filters, &snapshot);
            crate::http::ext_authz::stats::make_configured(&self.http_ext_authz, &snapshot);
            crate::metrics::tcp_proxy::make_configured(&self.tcp_proxy, &snapshot);
            listeners = crate::metrics::http_conn_manager::make_configured(
                &self.http_conn_managers,
                &snapshot,
            );
        }
        let rbac = &self.rbac_filters;
        for (stem, name, value) in crate::metrics::rbac_filters::each(&rbac.http) {
            stats.push(c(Scope::HttpRbac(stem), name, value));
        }
        for (stem, name, value) in crate::metrics::rbac_filters::each(&rbac.network) {
            stats.push(c(Scope::NetworkRbac(stem), name, value));
        }
        for (prefix, delays, aborts) in self.faults.snapshot() {
            let http = || Scope::HttpConnManager(prefix.to_string());
            stats.push(c(http(), "fault.aborts_injected", aborts));
            stats.push(c(http(), "fault.delays_injected", delays));
        }
        for (prefix, counters) in self.network_ext_authz.each() {
            let scope = || Scope::ExtAuthz(prefix.to_string());
            for (name, value) in counters.values() {
                stats.push(c(scope(), name, value));
            }
            stats.push(stat(Kind::Gauge, scope(), "active", counters.active()));
        }
        for (stem, counters) in crate::http::ext_authz::stats::stems(&self.http_ext_authz) {
            for (name, value) in counters.values() {
                stats.push(c(Scope::HttpExtAuthz(stem.clone()), name, value));
            }
        }
        for (prefix, counters) in self.tcp_proxy.each() {
            for (name, kind, value) in counters.values() {
                stats.push(stat(kind, Scope::TcpProxy(prefix.to_string()), name, value));
            }
        }
        self.connection_manager_stats(stats, &listeners);
        for (prefix, valid, invalid) in self.cors.snapshot() {
            let http = || Scope::HttpConnManager(prefix.to_string());
            stats.push(c(http(), "cors.origin_invalid", invalid));
            stats.push(c(http(), "cors.origin_valid", valid));
        }
    }

    /// The connection managers' statistics, and the copies of their answers each listener
    /// holding one keeps (`listener.0.0.0.0_80.http.outbound_0.0.0.0_80.downstream_rq_2xx`).
    /// A prefix in more than one listener gets no copies: its counts are not kept apart by
    /// listener (istiod gives each connection manager a prefix of its own listener's).
    fn connection_manager_stats(
        &self,
        stats: &mut Vec<EnvoyStat>,
        listeners: &[(String, Vec<std::sync::Arc<str>>)],
    ) {
        let managers = self.http_conn_managers.each();
        for (prefix, counters) in &managers {
            for (name, kind, value) in counters.values() {
                stats.push(EnvoyStat {
                    scope: Scope::HttpConnManager(prefix.to_string()),
                    stat: name,
                    code: None,
                    kind,
                    value,
                });
            }
        }
        for (listener, prefixes) in listeners {
            for prefix in prefixes {
                let holders = listeners.iter().filter(|(_, p)| p.contains(prefix)).count();
                let Some((_, counters)) = managers.iter().find(|(p, _)| p == prefix) else {
                    continue;
                };
                if holders != 1 {
                    continue;
                }
                for (name, value) in counters.answers() {
                    stats.push(EnvoyStat {
                        scope: Scope::Listener(format!("{listener}.http.{prefix}")),
                        stat: name,
                        code: None,
                        kind: Kind::Counter,
                        value,
                    });
                }
            }
        }
    }
}
