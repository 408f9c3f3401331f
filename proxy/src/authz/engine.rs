//! The decision: a pure function from the policies that apply to this workload and what is
//! known of one request (or TCP connection) to allow or deny, in Istio's order.
//!
//! CUSTOM policies have no external authorizer to ask here, so their rules deny, as istiod
//! turns a CUSTOM policy whose provider it cannot use into DENY rules (failing closed, so that
//! the security posture a CUSTOM policy sets is never weaker); AUDIT policies are matched and
//! reported but decide nothing; a matching DENY rule denies; then, when any ALLOW policy applies
//! to the workload, one of its rules must match; with none, the request is allowed. Policies
//! marked `istio.io/dry-run` are evaluated beside the enforced ones and only reported, as Envoy's
//! shadow rules are.
//!
//! On a TCP connection HTTP-only fields (hosts, methods, paths, request principals, request
//! headers and JWT claims) cannot be known. Istio then drops an ALLOW rule that names one (the
//! rule never matches: less is allowed) and ignores those fields in a DENY or AUDIT rule (the
//! rest of the rule decides: more is denied).

use super::matcher::AllOf;
use super::Attributes;
use std::collections::BTreeMap;

/// A policy's `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
    Audit,
    /// An external authorizer's (`provider`); not supported by Remora.
    Custom,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Audit => "audit",
            Action::Custom => "custom",
        }
    }
}

/// One rule of a policy, compiled.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Envoy's name for it: `ns[NS]-policy[NAME]-rule[I]`.
    pub name: Box<str>,
    /// Any of these sources (none: any source).
    pub from: Vec<AllOf>,
    /// Any of these operations (none: any operation).
    pub to: Vec<AllOf>,
    /// All of these conditions.
    pub when: AllOf,
}

impl Rule {
    /// Whether any part of the rule is HTTP-only.
    fn http_only(&self) -> bool {
        self.from
            .iter()
            .chain(&self.to)
            .chain(std::iter::once(&self.when))
            .any(AllOf::http_only_anywhere)
    }

    /// Whether the rule matches, for a policy of `action`.
    fn matches(&self, a: &Attributes<'_>, action: Action) -> bool {
        let tcp = a.request.is_none();
        if tcp && action == Action::Allow && self.http_only() {
            return false;
        }
        let skip_http = tcp;
        (self.from.is_empty() || self.from.iter().any(|s| s.matches(a, skip_http)))
            && (self.to.is_empty() || self.to.iter().any(|o| o.matches(a, skip_http)))
            && self.when.matches(a, skip_http)
    }
}

/// One policy, compiled and validated.
#[derive(Debug, Clone)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    pub action: Action,
    /// `istio.io/dry-run: "true"`: evaluated and reported, never enforced.
    pub dry_run: bool,
    /// `spec.selector.matchLabels`; `None` selects every workload of the namespace.
    pub selector: Option<BTreeMap<String, String>>,
    /// The policy names a `targetRef(s)` (a gateway or waypoint): sidecars ignore it.
    pub targets_gateways: bool,
    /// No rules: an ALLOW policy then allows nothing.
    pub rules: Vec<Rule>,
}

/// The rules of the policies that apply to one workload, by how they act.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    deny: Vec<Rule>,
    /// `Some` as soon as one ALLOW policy applies, even one without rules.
    allow: Option<Vec<Rule>>,
    audit: Vec<Rule>,
    dry_run_deny: Option<Vec<Rule>>,
    dry_run_allow: Option<Vec<Rule>>,
    /// `namespace/name` of the CUSTOM policies that apply, whose rules deny (no external
    /// authorizer here).
    pub custom: Vec<String>,
    /// How many policies of each action apply (dry-run ones included).
    pub counts: Counts,
}

/// Policies that apply, by action.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub allow: usize,
    pub deny: usize,
    pub audit: usize,
    pub custom: usize,
    pub dry_run: usize,
}

impl PolicySet {
    /// The set of `policies` (already selected for the workload).
    pub fn new(policies: &[Policy]) -> PolicySet {
        let mut set = PolicySet::default();
        for p in policies {
            let rules = p.rules.iter().cloned();
            match (p.action, p.dry_run) {
                (Action::Custom, dry_run) => {
                    set.custom.push(format!("{}/{}", p.namespace, p.name));
                    set.counts.custom += 1;
                    match dry_run {
                        false => set.deny.extend(rules),
                        true => set.dry_run_deny.get_or_insert_with(Vec::new).extend(rules),
                    }
                }
                (Action::Audit, _) => {
                    set.audit.extend(rules);
                    set.counts.audit += 1;
                }
                (Action::Deny, false) => {
                    set.deny.extend(rules);
                    set.counts.deny += 1;
                }
                (Action::Allow, false) => {
                    set.allow.get_or_insert_with(Vec::new).extend(rules);
                    set.counts.allow += 1;
                }
                (Action::Deny, true) => {
                    set.dry_run_deny.get_or_insert_with(Vec::new).extend(rules);
                    set.counts.dry_run += 1;
                }
                (Action::Allow, true) => {
                    set.dry_run_allow.get_or_insert_with(Vec::new).extend(rules);
                    set.counts.dry_run += 1;
                }
            }
        }
        // Envoy keeps an RBAC filter's policies in a map sorted by name; the first match in
        // that order is the one reported.
        for rules in [&mut set.deny, &mut set.audit]
            .into_iter()
            .chain(set.allow.as_mut())
            .chain(set.dry_run_deny.as_mut())
            .chain(set.dry_run_allow.as_mut())
        {
            rules.sort_by(|a, b| a.name.cmp(&b.name));
        }
        set
    }

    /// Whether nothing is evaluated: no decision is made or counted.
    pub fn is_empty(&self) -> bool {
        self.deny.is_empty()
            && self.allow.is_none()
            && self.audit.is_empty()
            && self.dry_run_deny.is_none()
            && self.dry_run_allow.is_none()
    }

    /// Decide one request or connection.
    pub fn evaluate(&self, a: &Attributes<'_>) -> Decision<'_> {
        fn first<'p>(rules: &'p [Rule], a: &Attributes<'_>, action: Action) -> Option<&'p str> {
            rules
                .iter()
                .find(|r| r.matches(a, action))
                .map(|r| &*r.name)
        }
        let reason = if let Some(rule) = first(&self.deny, a, Action::Deny) {
            Reason::DenyMatched(rule)
        } else {
            match &self.allow {
                None => Reason::NoAllowPolicy,
                Some(rules) => match first(rules, a, Action::Allow) {
                    Some(rule) => Reason::AllowMatched(rule),
                    None => Reason::NoAllowMatched,
                },
            }
        };
        Decision {
            reason,
            audited: first(&self.audit, a, Action::Audit),
            dry_run_deny: self
                .dry_run_deny
                .as_ref()
                .map(|rules| first(rules, a, Action::Deny)),
            dry_run_allow: self
                .dry_run_allow
                .as_ref()
                .map(|rules| first(rules, a, Action::Allow)),
        }
    }
}

/// Why a request was allowed or denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason<'p> {
    /// This DENY rule matched.
    DenyMatched(&'p str),
    /// This ALLOW rule matched.
    AllowMatched(&'p str),
    /// ALLOW policies apply and none of their rules matched.
    NoAllowMatched,
    /// No DENY rule matched and no ALLOW policy applies.
    NoAllowPolicy,
}

/// The outcome of [`PolicySet::evaluate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision<'p> {
    pub reason: Reason<'p>,
    /// The AUDIT rule that matched, if any.
    pub audited: Option<&'p str>,
    /// With dry-run DENY policies: the rule that would have denied, if any.
    pub dry_run_deny: Option<Option<&'p str>>,
    /// With dry-run ALLOW policies: the rule that would have allowed (`None`: would deny).
    pub dry_run_allow: Option<Option<&'p str>>,
}

impl Decision<'_> {
    pub fn allowed(&self) -> bool {
        matches!(self.reason, Reason::AllowMatched(_) | Reason::NoAllowPolicy)
    }

    /// Envoy's `response_code_details` for a denial: the matched DENY rule, or `none` when no
    /// ALLOW rule matched.
    pub fn denial_details(&self) -> String {
        match self.reason {
            Reason::DenyMatched(rule) => format!("rbac_access_denied_matched_policy[{rule}]"),
            _ => "rbac_access_denied_matched_policy[none]".into(),
        }
    }
}
