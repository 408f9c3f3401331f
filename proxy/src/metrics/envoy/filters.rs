//! Envoy's statistics of the filters on istiod's chains, each kept per stat prefix or
//! connection manager: RBAC, fault, network and HTTP ext_authz, `tcp_proxy` and cors. Those
//! Envoy makes when it loads a listener are made here first from the resources in force, at a
//! scrape, off the data path.

use super::{EnvoyStat, EnvoyStats, Kind, Scope};

impl EnvoyStats {
    /// The filters' statistics, onto `stats`.
    pub(super) fn filter_stats(&self, stats: &mut Vec<EnvoyStat>) {
        let stat = |kind, scope, stat, value| EnvoyStat {
            scope,
            stat,
            code: None,
            kind,
            value,
        };
        let c = |scope, name, value| stat(Kind::Counter, scope, name, value);
        if let Some(store) = self.xds.get() {
            let snapshot = store.current();
            crate::metrics::rbac_filters::make_configured(&self.rbac_filters, &snapshot);
            crate::http::ext_authz::stats::make_configured(&self.http_ext_authz, &snapshot);
            crate::metrics::tcp_proxy::make_configured(&self.tcp_proxy, &snapshot);
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
        for (prefix, valid, invalid) in self.cors.snapshot() {
            let http = || Scope::HttpConnManager(prefix.to_string());
            stats.push(c(http(), "cors.origin_invalid", invalid));
            stats.push(c(http(), "cors.origin_valid", valid));
        }
    }
}
