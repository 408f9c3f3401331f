//! From a parsed `AuthorizationPolicy` to compiled rules, with Istio's validation: what its
//! admission webhook refuses is refused here, naming the field. The structure (rules, sources,
//! operations, conditions, what may be empty, what goes with the CUSTOM action) is checked
//! here; each value becomes the matchers Istio's builder would give Envoy in [`super::value`].

use super::engine::{Action, Policy, Rule};
use super::matcher::{AllOf, Constraint, Matcher};
use super::policy::{Document, Operation, RawAction, RawRule, Source};
pub use super::value::CLUSTER_LOCAL;
use super::value::{condition_kind, matchers, Kind};

/// The annotation that makes a policy dry-run.
const DRY_RUN: &str = "istio.io/dry-run";

/// What compilation needs to know of the workload.
#[derive(Debug, Clone)]
pub struct Context {
    /// The workload's trust domain, then its aliases.
    pub trust_domains: Vec<String>,
}

impl Default for Context {
    fn default() -> Self {
        Context {
            trust_domains: vec![CLUSTER_LOCAL.into()],
        }
    }
}

/// A field path and why it is wrong.
pub type Invalid = (String, String);

fn invalid(field: impl Into<String>, message: impl Into<String>) -> Invalid {
    (field.into(), message.into())
}

/// Validate and compile one policy; also returns warnings for the log.
pub(super) fn policy(doc: &Document, ctx: &Context) -> Result<(Policy, Vec<String>), Invalid> {
    let mut warnings = Vec::new();
    let meta = &doc.metadata;
    let namespace = match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => ns.to_string(),
        // A file has no kubectl context to take a namespace from.
        _ => {
            return Err(invalid(
                "metadata.namespace",
                "must be set: policies apply by namespace",
            ))
        }
    };
    let spec = &doc.spec;
    let targets = usize::from(spec.target_ref.is_some())
        + usize::from(spec.target_refs.as_ref().is_some_and(|t| !t.is_empty()));
    if targets > 0 && spec.selector.is_some() || targets > 1 {
        return Err(invalid(
            "spec",
            "only one of selector, targetRef or targetRefs may be set",
        ));
    }
    let action = match spec.action {
        RawAction::Allow => Action::Allow,
        RawAction::Deny => Action::Deny,
        RawAction::Audit => Action::Audit,
        RawAction::Custom => Action::Custom,
    };
    match (action, &spec.provider, &spec.rules) {
        (Action::Custom, _, None) => {
            return Err(invalid("spec.rules", "CUSTOM action without `rules` is never triggered; add an empty rule `{}` for every request"));
        }
        (Action::Custom, p, Some(_)) if p.as_ref().is_none_or(|p| p.name.is_empty()) => {
            return Err(invalid("spec.provider.name", "must not be empty"));
        }
        (Action::Custom, ..) => {}
        (_, Some(_), _) => {
            return Err(invalid(
                "spec.provider",
                "is only allowed with the CUSTOM action",
            ));
        }
        (Action::Deny, _, None) => {
            return Err(invalid("spec.action", "DENY action without `rules` is never triggered; add an empty rule `{}` to deny every request"));
        }
        _ => {}
    }
    let dry_run = match meta.annotations.get(DRY_RUN).map(String::as_str) {
        None => false,
        Some("true" | "True" | "TRUE" | "t" | "T" | "1") => true,
        Some("false" | "False" | "FALSE" | "f" | "F" | "0") => false,
        Some(other) => {
            // Istio logs it and enforces the policy.
            warnings.push(format!(
                "{DRY_RUN}: `{other}` is not a boolean; the policy is enforced"
            ));
            false
        }
    };
    let mut rules = Vec::new();
    for (i, rule) in spec.rules.iter().flatten().enumerate() {
        let field = format!("spec.rules[{i}]");
        let Some(rule) = rule else {
            return Err(invalid(field, "must not be null"));
        };
        let name = format!("ns[{namespace}]-policy[{}]-rule[{i}]", meta.name);
        let compiled = self::rule(rule, &field, name, &namespace, ctx)?;
        if action == Action::Custom {
            check_custom(rule, &field)?;
        }
        if action == Action::Deny && denies_all_tcp(rule) {
            warnings.push(format!("rule {i} denies all TCP traffic to the ports it covers: it uses only HTTP attributes, which a DENY rule ignores on TCP; name the port"));
        }
        rules.push(compiled);
    }
    let policy = Policy {
        namespace,
        name: meta.name.clone(),
        action,
        dry_run,
        selector: spec.selector.as_ref().map(|s| s.match_labels.clone()),
        targets_gateways: targets > 0,
        rules,
    };
    Ok((policy, warnings))
}

/// Istio's warning: a DENY rule whose sources and operations carry only HTTP fields.
fn denies_all_tcp(rule: &RawRule) -> bool {
    let from_tcp = rule.from.iter().flatten().flatten().any(|f| {
        f.source.as_ref().is_some_and(|s| {
            [
                &s.principals,
                &s.not_principals,
                &s.ip_blocks,
                &s.not_ip_blocks,
                &s.namespaces,
            ]
            .into_iter()
            .chain([
                &s.not_namespaces,
                &s.remote_ip_blocks,
                &s.not_remote_ip_blocks,
            ])
            .chain([&s.service_accounts, &s.not_service_accounts])
            .any(Option::is_some)
        })
    });
    let has_from = rule
        .from
        .iter()
        .flatten()
        .flatten()
        .any(|f| f.source.is_some());
    let ops: Vec<&Operation> = rule
        .to
        .iter()
        .flatten()
        .flatten()
        .filter_map(|t| t.operation.as_ref())
        .collect();
    let to_tcp = ops
        .iter()
        .any(|o| o.ports.is_some() || o.not_ports.is_some());
    (has_from && ops.is_empty() && !from_tcp) || (!ops.is_empty() && !to_tcp)
}

/// CUSTOM rules may not use identities: the external authorizer is asked before they exist.
fn check_custom(rule: &RawRule, field: &str) -> Result<(), Invalid> {
    for (j, from) in rule.from.iter().flatten().enumerate() {
        let Some(s) = from.as_ref().and_then(|f| f.source.as_ref()) else {
            continue;
        };
        let identity = [&s.principals, &s.not_principals, &s.request_principals]
            .into_iter()
            .chain([&s.not_request_principals, &s.namespaces, &s.not_namespaces])
            .chain([
                &s.service_accounts,
                &s.not_service_accounts,
                &s.trust_domains,
            ])
            .chain([&s.not_trust_domains])
            .any(Option::is_some);
        if identity {
            return Err(invalid(
                format!("{field}.from[{j}].source"),
                "identities are not supported with the CUSTOM action",
            ));
        }
    }
    for (j, when) in rule.when.iter().flatten().flatten().enumerate() {
        let k = when.key.as_str();
        if k.starts_with("source.") && k != "source.ip" || k.starts_with("request.auth.") {
            return Err(invalid(
                format!("{field}.when[{j}].key"),
                format!("{k} is not supported with the CUSTOM action"),
            ));
        }
    }
    Ok(())
}

fn rule(
    rule: &RawRule,
    field: &str,
    name: String,
    ns: &str,
    ctx: &Context,
) -> Result<Rule, Invalid> {
    let mut from = Vec::new();
    if rule.from.as_ref().is_some_and(Vec::is_empty) {
        return Err(invalid(format!("{field}.from"), "must not be empty"));
    }
    for (j, f) in rule.from.iter().flatten().enumerate() {
        let at = format!("{field}.from[{j}]");
        match f.as_ref().and_then(|f| f.source.as_ref()) {
            Some(s) => from.push(source(s, &format!("{at}.source"), ns, ctx)?),
            None => return Err(invalid(format!("{at}.source"), "must be set")),
        }
    }
    let mut to = Vec::new();
    if rule.to.as_ref().is_some_and(Vec::is_empty) {
        return Err(invalid(format!("{field}.to"), "must not be empty"));
    }
    for (j, t) in rule.to.iter().flatten().enumerate() {
        let at = format!("{field}.to[{j}]");
        match t.as_ref().and_then(|t| t.operation.as_ref()) {
            Some(o) => to.push(operation(o, &format!("{at}.operation"))?),
            None => return Err(invalid(format!("{at}.operation"), "must be set")),
        }
    }
    let mut when = Vec::new();
    for (j, c) in rule.when.iter().flatten().enumerate() {
        let at = format!("{field}.when[{j}]");
        let Some(c) = c else {
            return Err(invalid(at, "must not be null"));
        };
        if c.key.is_empty() {
            return Err(invalid(format!("{at}.key"), "must not be empty"));
        }
        if c.values.is_none() && c.not_values.is_none() {
            return Err(invalid(
                at,
                format!(
                    "at least one of `values` or `notValues` must be set for key {}",
                    c.key
                ),
            ));
        }
        let kind = condition_kind(&c.key).map_err(|m| invalid(format!("{at}.key"), m))?;
        let field = |name| format!("{at}.{name}");
        when.push(constraint(
            kind,
            &c.values,
            &c.not_values,
            field("values"),
            field("notValues"),
            ns,
            ctx,
        )?);
    }
    Ok(Rule {
        name: name.into(),
        from,
        to,
        when: AllOf(when),
    })
}

fn source(s: &Source, at: &str, ns: &str, ctx: &Context) -> Result<AllOf, Invalid> {
    let identity = [
        &s.principals,
        &s.not_principals,
        &s.namespaces,
        &s.not_namespaces,
    ];
    let accounts = [&s.service_accounts, &s.not_service_accounts];
    if identity.iter().any(|v| v.is_some()) && accounts.iter().any(|v| v.is_some()) {
        return Err(invalid(
            at,
            "cannot set serviceAccounts with namespaces or principals",
        ));
    }
    let fields = [
        (
            Kind::Principal,
            &s.principals,
            &s.not_principals,
            "principals",
            "notPrincipals",
        ),
        (
            Kind::RequestAuth,
            &s.request_principals,
            &s.not_request_principals,
            "requestPrincipals",
            "notRequestPrincipals",
        ),
        (
            Kind::Namespace,
            &s.namespaces,
            &s.not_namespaces,
            "namespaces",
            "notNamespaces",
        ),
        (
            Kind::ServiceAccount,
            &s.service_accounts,
            &s.not_service_accounts,
            "serviceAccounts",
            "notServiceAccounts",
        ),
        (
            Kind::TrustDomain,
            &s.trust_domains,
            &s.not_trust_domains,
            "trustDomains",
            "notTrustDomains",
        ),
        (
            Kind::SourceIp,
            &s.ip_blocks,
            &s.not_ip_blocks,
            "ipBlocks",
            "notIpBlocks",
        ),
        (
            Kind::RemoteIp,
            &s.remote_ip_blocks,
            &s.not_remote_ip_blocks,
            "remoteIpBlocks",
            "notRemoteIpBlocks",
        ),
    ];
    all_of(fields, at, "`from.source` must not be empty", ns, ctx)
}

fn operation(o: &Operation, at: &str) -> Result<AllOf, Invalid> {
    let fields = [
        (Kind::Host, &o.hosts, &o.not_hosts, "hosts", "notHosts"),
        (Kind::Port, &o.ports, &o.not_ports, "ports", "notPorts"),
        (
            Kind::Method,
            &o.methods,
            &o.not_methods,
            "methods",
            "notMethods",
        ),
        (Kind::Path, &o.paths, &o.not_paths, "paths", "notPaths"),
    ];
    all_of(
        fields,
        at,
        "`to.operation` must not be empty",
        "",
        &Context::default(),
    )
}

type Field<'a> = (
    Kind,
    &'a Option<Vec<String>>,
    &'a Option<Vec<String>>,
    &'a str,
    &'a str,
);

fn all_of<const N: usize>(
    fields: [Field<'_>; N],
    at: &str,
    empty: &str,
    ns: &str,
    ctx: &Context,
) -> Result<AllOf, Invalid> {
    let mut out = Vec::new();
    for (kind, values, not_values, name, not_name) in fields {
        if values.as_ref().is_some_and(|v| !v.is_empty())
            || not_values.as_ref().is_some_and(|v| !v.is_empty())
        {
            let (f, nf) = (format!("{at}.{name}"), format!("{at}.{not_name}"));
            out.push(constraint(kind, values, not_values, f, nf, ns, ctx)?);
        }
    }
    if out.is_empty() {
        return Err(invalid(at, empty));
    }
    Ok(AllOf(out))
}

fn constraint(
    kind: Kind,
    values: &Option<Vec<String>>,
    not_values: &Option<Vec<String>>,
    field: String,
    not_field: String,
    ns: &str,
    ctx: &Context,
) -> Result<Constraint, Invalid> {
    let compile = |list: &Option<Vec<String>>, field: &str| -> Result<Vec<Matcher>, Invalid> {
        let list = list.as_deref().unwrap_or_default();
        if matches!(kind, Kind::ServiceAccount) && list.len() > 16 {
            return Err(invalid(field, "may not have more than 16 values"));
        }
        let mut out = Vec::new();
        for (i, v) in list.iter().enumerate() {
            let at = || format!("{field}[{i}]");
            if v.is_empty() {
                return Err(invalid(at(), "empty value not allowed"));
            }
            out.extend(matchers(&kind, v, ns, ctx).map_err(|m| invalid(at(), m))?);
        }
        Ok(out)
    };
    Ok(Constraint {
        values: compile(values, &field)?,
        not_values: compile(not_values, &not_field)?,
    })
}
