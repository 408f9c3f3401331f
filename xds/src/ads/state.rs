//! What the client remembers per type across responses and reconnects, in both modes: whether
//! the subscription has started, the names wanted, the versions held, and (state of the world)
//! the last accepted version and nonce. It also holds the start-up order Envoy follows.
//!
//! Envoy's order, and ours:
//! - CDS (wildcard) is requested first, alone.
//! - EDS is requested for the names the sink wants once a CDS response has been applied. The
//!   request goes out before that response's ACK or NACK: Envoy pauses EDS while it applies CDS
//!   and resumes it as the update finishes, before the answer is queued (seen on the wire from
//!   Envoy 1.40 in `tests/ads_envoy.rs`).
//! - SDS (secrets istiod serves itself, a DestinationRule's `credentialName`) is requested
//!   for the names the clusters' sockets give once each cluster initialises, which for an EDS
//!   cluster is when its endpoints arrive: the SDS request goes out before that EDS response's
//!   ACK (Envoy 1.40 on the wire, `tests/ads_envoy.rs`).
//! - LDS starts once the cluster manager has initialised: the first CDS response is handled and
//!   every endpoint set and secret it asked for has arrived (or was refused), or `initial_fetch_timeout`
//!   has passed, whichever comes first. istiod pushes listeners that name clusters; asking for
//!   them after the clusters are warm is what keeps the first requests from reaching a cluster
//!   that has no endpoints yet. The LDS request goes out before the ACK of the EDS response
//!   that completed start-up, as Envoy sends it.
//! - RDS follows LDS the way EDS follows CDS.
//! - NDS (istiod's name table), when asked for, starts with LDS: pilot-agent sends its one
//!   wildcard request right after Envoy's first LDS request goes through it.
//! - After start-up, a CDS answer is held while the clusters it added warm (see
//!   `AdsClient::handle`), as Envoy holds it. Listeners warm too, waiting for their route
//!   tables, but Envoy answers LDS at once, and so do we.
//! - After a reconnect, every started type is requested again at once, in that order.
//!
//! EDS and RDS responses that name resources nobody asked for are dropped before they reach the
//! sink (Envoy delivers a response only to the watches of the names it carries).

use std::collections::{BTreeMap, BTreeSet};

use crate::sink::{type_url, Applied};

/// One type's subscription.
#[derive(Debug)]
pub(crate) struct TypeState {
    pub type_url: &'static str,
    /// CDS and LDS are wildcard: every resource of the type, no names.
    pub wildcard: bool,
    /// A request has been (or, on a fresh stream, will be) sent for this type.
    pub started: bool,
    /// A request for this type has gone out on the current stream.
    pub on_stream: bool,
    /// The names wanted, for EDS and RDS.
    pub wanted: BTreeSet<String>,
    /// The names the control plane has been told about on the current stream (delta).
    pub sent: BTreeSet<String>,
    /// The resources the sink holds, with their versions: delta's per-resource versions, which
    /// go back to the server as `initial_resource_versions` on a new stream.
    pub held: BTreeMap<String, String>,
    /// State of the world: the last accepted `version_info`, sent back in every request.
    pub accepted_version: String,
    /// State of the world: the last nonce received on the current stream.
    pub nonce: String,
}

impl TypeState {
    fn new(type_url: &'static str, wildcard: bool) -> Self {
        Self {
            type_url,
            wildcard,
            started: false,
            on_stream: false,
            wanted: BTreeSet::new(),
            sent: BTreeSet::new(),
            held: BTreeMap::new(),
            accepted_version: String::new(),
            nonce: String::new(),
        }
    }

    /// Whether a resource of this name is one this subscription asked for.
    pub fn wants(&self, name: &str) -> bool {
        self.wildcard || self.wanted.contains(name)
    }
}

/// Where start-up is in Envoy's order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum InitGate {
    /// No CDS response handled yet.
    AwaitingClusters,
    /// CDS handled; these endpoint sets and secrets (by type and name) have not arrived yet.
    AwaitingEndpoints(BTreeSet<(&'static str, String)>),
    /// LDS has started.
    Open,
}

/// Every type's subscription, in Envoy's subscription order (CDS, EDS, SDS, LDS, RDS), then NDS
/// when the DNS proxy wants the name table.
#[derive(Debug)]
pub(crate) struct Subscriptions {
    types: Vec<TypeState>,
    gate: InitGate,
}

impl Subscriptions {
    /// The subscriptions of a sidecar; with `name_table`, NDS too (pilot-agent asks for it
    /// only with DNS capture on).
    pub fn new(name_table: bool) -> Self {
        let mut types = vec![
            TypeState::new(type_url::CLUSTER, true),
            TypeState::new(type_url::ENDPOINT, false),
            TypeState::new(type_url::SECRET, false),
            TypeState::new(type_url::LISTENER, true),
            TypeState::new(type_url::ROUTE, false),
        ];
        if name_table {
            types.push(TypeState::new(type_url::NAME_TABLE, true));
        }
        if let Some(cds) = types.first_mut() {
            cds.started = true;
        }
        Self {
            types,
            gate: InitGate::AwaitingClusters,
        }
    }

    pub fn get(&self, type_url: &str) -> Option<&TypeState> {
        self.types.iter().find(|t| t.type_url == type_url)
    }

    pub fn get_mut(&mut self, type_url: &str) -> Option<&mut TypeState> {
        self.types.iter_mut().find(|t| t.type_url == type_url)
    }

    /// The names wanted of a type (empty for a wildcard type).
    pub fn wanted(&self, type_url: &str) -> BTreeSet<String> {
        self.get(type_url)
            .map(|t| t.wanted.clone())
            .unwrap_or_default()
    }

    /// The started types, in subscription order.
    pub fn started(&self) -> impl Iterator<Item = &TypeState> {
        self.types.iter().filter(|t| t.started)
    }

    pub fn started_mut(&mut self) -> impl Iterator<Item = &mut TypeState> {
        self.types.iter_mut().filter(|t| t.started)
    }

    /// Whether LDS is still waiting for start-up to finish (the timeout applies).
    pub fn awaiting_init(&self) -> bool {
        self.gate != InitGate::Open
    }

    /// A fresh stream: the server knows nothing of us; state of the world nonces belong to the
    /// old stream. Versions held stay: they are what we resubscribe with.
    pub fn stream_reset(&mut self) {
        for t in &mut self.types {
            t.on_stream = false;
            t.sent.clear();
            t.nonce.clear();
        }
    }

    /// After a response of `type_url` was handled, with what the sink said it now wants and
    /// the names the response delivered (for start-up ordering). Returns the types whose
    /// subscription must be (re)sent, in order: EDS/RDS whose wanted set changed or that start
    /// now, and LDS when start-up completes.
    pub fn after_response(
        &mut self,
        type_url: &str,
        applied: &Applied,
        delivered: &BTreeSet<String>,
    ) -> Vec<&'static str> {
        let mut changed = Vec::new();
        // Secrets first wanted while start-up waits (a cluster's endpoints arrived, so it
        // initialises and asks for them) are waited for too.
        if let (InitGate::AwaitingEndpoints(waiting), Some(secrets)) =
            (&mut self.gate, applied.wanted.get(type_url::SECRET))
        {
            let before = self
                .types
                .iter()
                .find(|t| t.type_url == type_url::SECRET)
                .map(|t| &t.wanted);
            for name in secrets {
                if before.is_none_or(|b| !b.contains(name)) {
                    waiting.insert((type_url::SECRET, name.clone()));
                }
            }
        }
        for (dependent, names) in &applied.wanted {
            let Some(state) = self.get_mut(dependent) else {
                continue;
            };
            if state.wildcard {
                continue;
            }
            // Envoy subscribes EDS (RDS) when the first cluster (listener) that needs it is
            // applied; an empty first interest is not worth a request.
            let starts = !state.started && !names.is_empty();
            if starts || (state.started && state.wanted != *names) {
                state.wanted = names.clone();
                state.started = true;
                changed.push(state.type_url);
            } else if !state.started {
                state.wanted = names.clone();
            }
        }
        match (&mut self.gate, type_url) {
            (InitGate::AwaitingClusters, type_url::CLUSTER) => {
                let waiting = [type_url::ENDPOINT, type_url::SECRET]
                    .into_iter()
                    .flat_map(|t| self.wanted(t).into_iter().map(move |name| (t, name)))
                    .collect();
                self.gate = InitGate::AwaitingEndpoints(waiting);
            }
            (InitGate::AwaitingEndpoints(waiting), type_url::ENDPOINT | type_url::SECRET) => {
                waiting.retain(|(t, name)| *t != type_url || !delivered.contains(name));
            }
            _ => {}
        }
        if matches!(&self.gate, InitGate::AwaitingEndpoints(w) if w.is_empty()) {
            changed.extend(self.open_gate());
        }
        changed
    }

    /// After a whole response of `type_url` was refused. Envoy's cluster manager counts a
    /// refused CDS, EDS or SDS update as an answer (the subscription's initialisation
    /// completes on failure too), so start-up moves on rather than waiting for a push that may
    /// never come.
    pub fn after_refusal(&mut self, type_url: &str) -> Vec<&'static str> {
        match (&self.gate, type_url) {
            (InitGate::AwaitingClusters, type_url::CLUSTER)
            | (InitGate::AwaitingEndpoints(_), type_url::ENDPOINT | type_url::SECRET) => {
                self.open_gate()
            }
            _ => Vec::new(),
        }
    }

    /// Start LDS now (start-up finished, or its bound passed), and NDS with it when asked for.
    /// Returns the types that started, in order.
    pub fn open_gate(&mut self) -> Vec<&'static str> {
        self.gate = InitGate::Open;
        let mut started = Vec::new();
        for type_url in [type_url::LISTENER, type_url::NAME_TABLE] {
            if let Some(state) = self.get_mut(type_url).filter(|s| !s.started) {
                state.started = true;
                started.push(state.type_url);
            }
        }
        started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(type_url: &'static str, names: &[&str]) -> Applied {
        let mut applied = Applied::default();
        applied
            .wanted
            .insert(type_url, names.iter().map(|n| (*n).to_owned()).collect());
        applied
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn lds_waits_for_the_endpoints_of_the_first_clusters() {
        let mut subs = Subscriptions::new(false);
        let started: Vec<_> = subs.started().map(|t| t.type_url).collect();
        assert_eq!(started, vec![type_url::CLUSTER]);

        let changed = subs.after_response(
            type_url::CLUSTER,
            &wanted(type_url::ENDPOINT, &["a", "b"]),
            &set(&["a", "b"]),
        );
        assert_eq!(changed, vec![type_url::ENDPOINT]);
        assert!(subs.awaiting_init());

        let changed = subs.after_response(type_url::ENDPOINT, &Applied::default(), &set(&["a"]));
        assert!(changed.is_empty());
        let changed = subs.after_response(type_url::ENDPOINT, &Applied::default(), &set(&["b"]));
        assert_eq!(changed, vec![type_url::LISTENER]);
        assert!(!subs.awaiting_init());
    }

    #[test]
    fn sds_follows_the_clusters_and_lds_waits_for_the_secrets_too() {
        let mut subs = Subscriptions::new(false);
        let mut applied = wanted(type_url::ENDPOINT, &["a"]);
        applied.wanted.insert(
            type_url::SECRET,
            set(&["kubernetes://c", "kubernetes://c-cacert"]),
        );
        let changed = subs.after_response(type_url::CLUSTER, &applied, &set(&["a"]));
        assert_eq!(changed, vec![type_url::ENDPOINT, type_url::SECRET]);
        let started: Vec<_> = subs.started().map(|t| t.type_url).collect();
        assert_eq!(
            started,
            vec![type_url::CLUSTER, type_url::ENDPOINT, type_url::SECRET],
            "Envoy's order: SDS after EDS"
        );
        let changed = subs.after_response(type_url::ENDPOINT, &Applied::default(), &set(&["a"]));
        assert!(changed.is_empty(), "the secrets have not arrived");
        // A secret named like an endpoint set is still awaited under its own type.
        let changed = subs.after_response(
            type_url::SECRET,
            &Applied::default(),
            &set(&["kubernetes://c"]),
        );
        assert!(changed.is_empty());
        let changed = subs.after_response(
            type_url::SECRET,
            &Applied::default(),
            &set(&["kubernetes://c-cacert"]),
        );
        assert_eq!(changed, vec![type_url::LISTENER]);
    }

    #[test]
    fn lds_starts_at_once_without_eds_clusters() {
        let mut subs = Subscriptions::new(false);
        let changed = subs.after_response(type_url::CLUSTER, &Applied::default(), &BTreeSet::new());
        assert_eq!(changed, vec![type_url::LISTENER]);
    }

    #[test]
    fn a_refused_first_cds_or_eds_response_does_not_hold_lds_back() {
        let mut subs = Subscriptions::new(false);
        assert!(subs.after_refusal(type_url::LISTENER).is_empty());
        assert_eq!(
            subs.after_refusal(type_url::CLUSTER),
            vec![type_url::LISTENER]
        );

        let mut subs = Subscriptions::new(false);
        subs.after_response(
            type_url::CLUSTER,
            &wanted(type_url::ENDPOINT, &["a"]),
            &set(&["a"]),
        );
        assert_eq!(
            subs.after_refusal(type_url::ENDPOINT),
            vec![type_url::LISTENER]
        );
        assert!(
            subs.after_refusal(type_url::ENDPOINT).is_empty(),
            "LDS starts once"
        );
    }

    #[test]
    fn nds_starts_with_lds_and_only_when_asked_for() {
        let mut subs = Subscriptions::new(true);
        assert!(subs
            .get(type_url::NAME_TABLE)
            .is_some_and(|n| n.wildcard && !n.started));
        let changed = subs.after_response(type_url::CLUSTER, &Applied::default(), &BTreeSet::new());
        assert_eq!(changed, vec![type_url::LISTENER, type_url::NAME_TABLE]);
        assert!(subs.open_gate().is_empty(), "each starts once");
        let started: Vec<_> = subs.started().map(|t| t.type_url).collect();
        assert_eq!(
            started,
            vec![type_url::CLUSTER, type_url::LISTENER, type_url::NAME_TABLE]
        );
        let mut without = Subscriptions::new(false);
        assert_eq!(without.open_gate(), vec![type_url::LISTENER]);
        assert!(without.get(type_url::NAME_TABLE).is_none());
    }

    #[test]
    fn rds_follows_the_listeners_and_changes_with_them() {
        let mut subs = Subscriptions::new(false);
        subs.open_gate();
        let changed = subs.after_response(
            type_url::LISTENER,
            &wanted(type_url::ROUTE, &["80"]),
            &set(&["l"]),
        );
        assert_eq!(changed, vec![type_url::ROUTE]);
        let same = subs.after_response(
            type_url::LISTENER,
            &wanted(type_url::ROUTE, &["80"]),
            &set(&["l"]),
        );
        assert!(same.is_empty());
        let changed = subs.after_response(
            type_url::LISTENER,
            &wanted(type_url::ROUTE, &["80", "9080"]),
            &set(&["l"]),
        );
        assert_eq!(changed, vec![type_url::ROUTE]);
        assert_eq!(
            subs.get(type_url::ROUTE).map(|r| r.wanted.clone()),
            Some(set(&["80", "9080"]))
        );
    }
}
