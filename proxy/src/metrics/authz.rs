//! Authorization: each decision by protocol, the action whose policies made it and its result;
//! dry-run and audit matches; the policies in force and their reloads. Envoy's RBAC filter
//! statistics (`rbac.allowed`, `rbac.denied`, `rbac.shadow_allowed`, `rbac.shadow_denied`) are
//! read from the same counters.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, &'static str)>;

/// What a request or connection was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Tcp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Tcp => "tcp",
        }
    }
}

/// Which policies decided, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A DENY rule matched.
    DenyMatched,
    /// An ALLOW rule matched.
    AllowMatched,
    /// ALLOW policies apply and none matched.
    NoAllowMatched,
    /// No DENY rule matched and no ALLOW policy applies.
    NoAllowPolicy,
}

impl Outcome {
    const ALL: [Outcome; 4] = [
        Outcome::DenyMatched,
        Outcome::AllowMatched,
        Outcome::NoAllowMatched,
        Outcome::NoAllowPolicy,
    ];

    fn labels(self) -> (&'static str, &'static str) {
        match self {
            Outcome::DenyMatched => ("deny", "denied"),
            Outcome::AllowMatched => ("allow", "allowed"),
            Outcome::NoAllowMatched => ("allow", "denied"),
            Outcome::NoAllowPolicy => ("none", "allowed"),
        }
    }

    fn allowed(self) -> bool {
        self.labels().1 == "allowed"
    }
}

/// Counters of one protocol, resolved once.
#[derive(Debug, Clone, Default)]
struct ByProtocol {
    decisions: [Counter; 4],
    audited: Counter,
    /// [action allow, deny] × [allowed, denied].
    dry_run: [[Counter; 2]; 2],
}

/// The authorization metrics.
#[derive(Debug, Clone, Default)]
pub struct AuthzMetrics {
    http: ByProtocol,
    tcp: ByProtocol,
    /// Policies in force for this workload, by action (`dry_run` counted apart).
    pub policies: Family<Labels, Gauge>,
    /// Policy directory reloads that took effect.
    pub reloads_ok: Counter,
    /// Policy directory reloads refused (the running policies stayed).
    pub reloads_failed: Counter,
    /// Policies in force, all actions (not exported: it tells whether the RBAC stats exist).
    in_force: Gauge,
    /// RBAC filters from xDS have decided something: Envoy has the filters, so their stats.
    xds_rbac: Gauge,
}

impl AuthzMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let decisions = Family::<Labels, Counter>::default();
        let audited = Family::<Labels, Counter>::default();
        let dry_run = Family::<Labels, Counter>::default();
        let reloads = Family::<Labels, Counter>::default();
        // One statement each: the family's lock is held until the end of the statement.
        let reloads_ok = reloads.get_or_create(&vec![("result", "success")]).clone();
        let reloads_failed = reloads.get_or_create(&vec![("result", "failure")]).clone();
        let m = AuthzMetrics {
            http: ByProtocol::resolve(Protocol::Http, &decisions, &audited, &dry_run),
            tcp: ByProtocol::resolve(Protocol::Tcp, &decisions, &audited, &dry_run),
            policies: Family::default(),
            reloads_ok,
            reloads_failed,
            in_force: Gauge::default(),
            xds_rbac: Gauge::default(),
        };
        registry.register(
            "remora_authorization_decisions",
            "Inbound requests (http) and connections (tcp) decided by authorization policies, by the action that decided and the result",
            decisions,
        );
        registry.register(
            "remora_authorization_dry_run",
            "What dry-run (istio.io/dry-run) policies would have decided, by action and result",
            dry_run,
        );
        registry.register(
            "remora_authorization_audited",
            "Requests and connections an AUDIT policy matched",
            audited,
        );
        registry.register(
            "remora_authorization_policies",
            "Authorization policies in force for this workload, by action (custom: unsupported, not enforced)",
            m.policies.clone(),
        );
        registry.register(
            "remora_authorization_policy_reloads",
            "Policy directory reloads by result",
            reloads,
        );
        m
    }

    /// Show the policies in force, by action: `allow`, `deny`, `audit`, `custom`, `dry_run`.
    pub fn set_policies(&self, counts: [(&'static str, usize); 5]) {
        let mut total = 0;
        for (action, n) in counts {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.policies
                .get_or_create(&vec![("action", action)])
                .set(n);
            total += n;
        }
        self.in_force.set(total);
    }

    /// Whether any policy is in force.
    pub fn policies_in_force(&self) -> bool {
        self.in_force.get() > 0 || self.xds_rbac.get() > 0
    }

    /// Note that RBAC filters from xDS are deciding (their statistics exist from now on).
    pub fn xds_rbac_decided(&self) {
        self.xds_rbac.set(1);
    }

    fn of(&self, p: Protocol) -> &ByProtocol {
        match p {
            Protocol::Http => &self.http,
            Protocol::Tcp => &self.tcp,
        }
    }

    /// Count one enforced decision.
    pub fn decided(&self, p: Protocol, outcome: Outcome) {
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == outcome) {
            self.of(p).decisions[i].inc();
        }
    }

    /// Count one AUDIT match.
    pub fn audited(&self, p: Protocol) {
        self.of(p).audited.inc();
    }

    /// Count what dry-run policies of `deny` (or allow) action would have done.
    pub fn dry_run(&self, p: Protocol, deny: bool, allowed: bool) {
        self.of(p).dry_run[usize::from(deny)][usize::from(!allowed)].inc();
    }

    /// Envoy's RBAC statistics of one protocol: allowed, denied, shadow_allowed, shadow_denied.
    pub fn envoy_rbac(&self, p: Protocol) -> [u64; 4] {
        let b = self.of(p);
        let sum = |allowed: bool| {
            Outcome::ALL
                .iter()
                .zip(&b.decisions)
                .filter(|(o, _)| o.allowed() == allowed)
                .map(|(_, c)| c.get())
                .sum::<u64>()
        };
        let shadow = |col: usize| b.dry_run[0][col].get() + b.dry_run[1][col].get();
        [sum(true), sum(false), shadow(0), shadow(1)]
    }
}

impl ByProtocol {
    fn resolve(
        p: Protocol,
        decisions: &Family<Labels, Counter>,
        audited: &Family<Labels, Counter>,
        dry_run: &Family<Labels, Counter>,
    ) -> Self {
        let proto = p.as_str();
        let decision = |o: Outcome| {
            let (action, result) = o.labels();
            decisions
                .get_or_create(&vec![
                    ("protocol", proto),
                    ("action", action),
                    ("result", result),
                ])
                .clone()
        };
        let shadow = |action, result| {
            dry_run
                .get_or_create(&vec![
                    ("protocol", proto),
                    ("action", action),
                    ("result", result),
                ])
                .clone()
        };
        ByProtocol {
            decisions: Outcome::ALL.map(decision),
            audited: audited.get_or_create(&vec![("protocol", proto)]).clone(),
            dry_run: [
                [shadow("allow", "allowed"), shadow("allow", "denied")],
                [shadow("deny", "allowed"), shadow("deny", "denied")],
            ],
        }
    }
}
