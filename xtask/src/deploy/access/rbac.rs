//! RBAC: the roles bound to the daemon's account grant what the daemon does ([`DAEMON_USES`],
//! and DeviceClasses by the names in `dra.deviceClasses`) and nothing else; in DRA mode every
//! required use is granted and the pod mounts its token, device-plugin mode has no role and no
//! token.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::super::{NAMESPACE, Object};
use super::{DAEMON_USES, DEVICE_CLASS_VERBS, daemon_user, strings};

/// Where a grant holds.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Cluster,
    Namespace(String),
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Cluster => f.write_str("across the cluster"),
            Scope::Namespace(ns) => write!(f, "in namespace {ns}"),
        }
    }
}

/// One verb on one resource that a bound role grants.
#[derive(Debug)]
struct Grant {
    scope: Scope,
    group: String,
    resource: String,
    verb: String,
    /// The rule's `resourceNames`; `None`: every name.
    names: Option<BTreeSet<String>>,
}

fn resource_name(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// Whether the daemon may be granted `verb` on `group`/`resource` with `scope` and `names`;
/// the reason when not.
fn judge(
    scope: &Scope,
    group: &str,
    resource: &str,
    verb: &str,
    names: Option<&BTreeSet<String>>,
    classes: &BTreeSet<String>,
    driver: &str,
) -> Result<(), String> {
    // The synthetic permission the API server (1.36+) asks of a driver changing a claim's
    // status.devices: for its own driver name, on claims of its own node.
    if group == "resource.k8s.io" && resource == "resourceclaims/driver" {
        if verb != "associated-node:patch" {
            return Err(
                "the daemon patches only claims allocated on its own node (associated-node:patch)"
                    .into(),
            );
        }
        return match names {
            Some(n) if n.len() == 1 && n.contains(driver) => Ok(()),
            _ => Err(format!(
                "for other drivers than {driver:?}; list only it in resourceNames"
            )),
        };
    }
    if group == "resource.k8s.io" && resource == "deviceclasses" {
        if classes.is_empty() {
            return Err("the daemon applies no DeviceClasses (dra.deviceClasses is empty)".into());
        }
        if !DEVICE_CLASS_VERBS.contains(&verb) {
            return Err(format!(
                "the daemon only server-side applies its classes ({})",
                DEVICE_CLASS_VERBS.join(", ")
            ));
        }
        return match names {
            None => Err(format!(
                "for every DeviceClass; the daemon applies only {classes:?}, so list them in \
                 resourceNames"
            )),
            Some(n) if !n.is_subset(classes) => Err(format!(
                "for {:?}, which the daemon does not apply",
                n.difference(classes).collect::<Vec<_>>()
            )),
            Some(_) => Ok(()),
        };
    }
    let Some(u) = DAEMON_USES
        .iter()
        .find(|u| u.group == group && u.resource == resource)
    else {
        return Err("the daemon does not use this resource".into());
    };
    if !u.verbs.contains(&verb) {
        return Err(format!("the daemon only uses {}", u.verbs.join(", ")));
    }
    match (u.namespace, scope) {
        (Some(ns), Scope::Cluster) => Err(format!("the daemon needs it only in namespace {ns}")),
        (Some(ns), Scope::Namespace(s)) if s != ns => {
            Err(format!("the daemon needs it only in namespace {ns}"))
        }
        _ => Ok(()),
    }
}

/// The daemon as the RBAC checks see it: DRA mode or not, the DeviceClasses it applies, the
/// ServiceAccount it runs as, and its DaemonSet (for messages).
struct Daemon {
    dra: bool,
    classes: BTreeSet<String>,
    driver: String,
    sa: String,
    ds_at: String,
}

impl Daemon {
    /// Reads the daemon from the rendering, its configuration and its pod spec.
    fn of(objects: &[Object], config: &Value, pod: &Value) -> Daemon {
        let dra = config.pointer("/dra/enabled") == Some(&Value::Bool(true));
        let classes: BTreeSet<String> = config
            .pointer("/dra/deviceClasses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        let driver = config
            .pointer("/dra/driverName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let (_, sa) = daemon_user(pod);
        let ds_at = objects
            .iter()
            .find(|o| o.kind == "DaemonSet")
            .map(|o| format!("{}: {}", o.source, o.id))
            .unwrap_or_else(|| "DaemonSet".into());
        Daemon {
            dra,
            classes,
            driver,
            sa,
            ds_at,
        }
    }
}

/// Roles by (kind, namespace, name).
type Roles<'o> = BTreeMap<(&'o str, &'o str, &'o str), &'o Object>;

/// The RBAC checks; see the module docs.
pub(super) fn check_rbac(objects: &[Object], config: &Value, pod: &Value) -> Vec<String> {
    let daemon = Daemon::of(objects, config, pod);
    let mut problems = check_token(&daemon, pod);
    let (roles, role_problems) = check_roles(objects, &daemon);
    problems.extend(role_problems);

    let mut grants: Vec<Grant> = Vec::new();
    let mut bound: BTreeSet<(&str, &str, &str)> = BTreeSet::new();
    for b in objects
        .iter()
        .filter(|o| o.kind == "ClusterRoleBinding" || o.kind == "RoleBinding")
    {
        problems.extend(check_binding(b, &roles, &daemon, &mut grants, &mut bound));
    }
    for (key, role) in &roles {
        if !bound.contains(key) {
            problems.push(format!(
                "{}: {}: bound to nobody: the daemon never gets these permissions",
                role.source, role.id
            ));
        }
    }

    if !daemon.dra {
        return problems;
    }
    problems.extend(check_required(&daemon, &grants));
    problems
}

/// The pod mounts a service-account token in DRA mode and none in device-plugin mode;
/// returns the problems.
fn check_token(daemon: &Daemon, pod: &Value) -> Vec<String> {
    let ds_at = &daemon.ds_at;
    match (daemon.dra, pod.get("automountServiceAccountToken")) {
        (true, Some(Value::Bool(false))) => vec![format!(
            "{ds_at}: DRA mode talks to the API server, but the pod mounts no service-account \
             token"
        )],
        (false, Some(Value::Bool(false))) | (true, _) => Vec::new(),
        (false, _) => vec![format!(
            "{ds_at}: device-plugin mode uses no API, but the pod mounts a service-account token \
             (automountServiceAccountToken: false)"
        )],
    }
}

/// The rendered ClusterRoles and Roles, by (kind, namespace, name), and their problems: none
/// in device-plugin mode, no aggregation either way.
fn check_roles<'o>(objects: &'o [Object], daemon: &Daemon) -> (Roles<'o>, Vec<String>) {
    let mut problems = Vec::new();
    let mut roles: Roles<'o> = BTreeMap::new();
    for o in objects
        .iter()
        .filter(|o| o.kind == "ClusterRole" || o.kind == "Role")
    {
        let at = format!("{}: {}", o.source, o.id);
        let ns = if o.kind == "Role" {
            o.value
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default()
        } else {
            ""
        };
        roles.insert((o.kind.as_str(), ns, o.name.as_str()), o);
        if !daemon.dra {
            problems.push(format!(
                "{at}: rendered in device-plugin mode, which uses no API"
            ));
        }
        if o.value.get("aggregationRule").is_some_and(|a| !a.is_null()) {
            problems.push(format!(
                "{at}: has an aggregationRule: its rules would come from other roles"
            ));
        }
        let labels = o
            .value
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        for key in labels.into_iter().flatten().map(|(k, _)| k) {
            if key.starts_with("rbac.authorization.k8s.io/aggregate-to-") {
                problems.push(format!(
                    "{at}: label {key} adds the daemon's permissions to a built-in role"
                ));
            }
        }
    }
    (roles, problems)
}

/// One ClusterRoleBinding or RoleBinding: rendered only in DRA mode, binding only the
/// daemon's account, to a rendered role whose rules grant only what the daemon uses. The
/// role bound is added to `bound`, what it grants to `grants`; returns the problems.
fn check_binding<'o>(
    b: &'o Object,
    roles: &Roles<'o>,
    daemon: &Daemon,
    grants: &mut Vec<Grant>,
    bound: &mut BTreeSet<(&'o str, &'o str, &'o str)>,
) -> Vec<String> {
    let at = format!("{}: {}", b.source, b.id);
    let mut problems = Vec::new();
    if !daemon.dra {
        problems.push(format!(
            "{at}: rendered in device-plugin mode, which uses no API"
        ));
    }
    let (scope, ns) = if b.kind == "RoleBinding" {
        let ns = b
            .value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        (Scope::Namespace(ns.to_string()), ns)
    } else {
        (Scope::Cluster, "")
    };
    problems.extend(check_subjects(b, &at, &daemon.sa));
    let role = match bound_role(b, ns, &at, roles) {
        Ok((key, role)) => {
            bound.insert(key);
            role
        }
        Err(problem) => {
            problems.push(problem);
            return problems;
        }
    };
    let role_at = format!("{}: {}", role.source, role.id);
    for (i, rule) in role
        .value
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let rule_at = format!("{role_at}: rules[{i}]");
        problems.extend(check_rule(rule, &rule_at, &scope, b, daemon, grants));
    }
    problems
}

/// The binding's subjects: the daemon's ServiceAccount `sa`, and nobody else; returns the
/// problems.
fn check_subjects(b: &Object, at: &str, sa: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut binds_daemon = false;
    for s in b
        .value
        .get("subjects")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let field = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or_default();
        if field("kind") == "ServiceAccount"
            && field("name") == sa
            && field("namespace") == NAMESPACE
        {
            binds_daemon = true;
        } else {
            problems.push(format!(
                "{at}: also binds {} {}/{}, not only the daemon's ServiceAccount",
                field("kind"),
                field("namespace"),
                field("name")
            ));
        }
    }
    if !binds_daemon {
        problems.push(format!(
            "{at}: does not bind ServiceAccount {NAMESPACE}/{sa}, which the DaemonSet runs as"
        ));
    }
    problems
}

/// The rendered role the binding's roleRef names (a Role only from a RoleBinding in namespace
/// `ns`), with its key; or the problem.
fn bound_role<'o>(
    b: &'o Object,
    ns: &'o str,
    at: &str,
    roles: &Roles<'o>,
) -> Result<((&'o str, &'o str, &'o str), &'o Object), String> {
    let ref_kind = b
        .value
        .pointer("/roleRef/kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let ref_name = b
        .value
        .pointer("/roleRef/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let key = match ref_kind {
        "ClusterRole" => ("ClusterRole", "", ref_name),
        "Role" if b.kind == "RoleBinding" => ("Role", ns, ref_name),
        other => return Err(format!("{at}: refers to a {other:?}, which it cannot bind")),
    };
    roles
        .get_key_value(&key)
        .map(|(&key, &role)| (key, role))
        .ok_or_else(|| format!("{at}: binds {ref_kind} {ref_name:?}, which is not rendered"))
}

/// One rule of a bound role (binding `b`, in `scope`): no non-resource URL, no wildcard, and
/// each verb on each resource one the daemon uses; what it grants is added to `grants`;
/// returns the problems.
fn check_rule(
    rule: &Value,
    rule_at: &str,
    scope: &Scope,
    b: &Object,
    daemon: &Daemon,
    grants: &mut Vec<Grant>,
) -> Vec<String> {
    let mut problems = Vec::new();
    if !strings(rule, "nonResourceURLs").is_empty() {
        problems.push(format!(
            "{rule_at}: grants non-resource URLs, which the daemon does not use"
        ));
    }
    let (groups, resources, verbs, names) = (
        strings(rule, "apiGroups"),
        strings(rule, "resources"),
        strings(rule, "verbs"),
        strings(rule, "resourceNames"),
    );
    let mut wildcard = false;
    for (field, values) in [
        ("apiGroups", &groups),
        ("resources", &resources),
        ("verbs", &verbs),
        ("resourceNames", &names),
    ] {
        if let Some(w) = values.iter().find(|v| v.contains('*')) {
            wildcard = true;
            problems.push(format!(
                "{rule_at}: {field} holds the wildcard {w:?}; name exactly what the \
                 daemon uses"
            ));
        }
    }
    if wildcard {
        return problems;
    }
    let names: Option<BTreeSet<String>> =
        (!names.is_empty()).then(|| names.iter().map(|n| (*n).to_string()).collect());
    for g in &groups {
        for r in &resources {
            for v in &verbs {
                if let Err(why) = judge(
                    scope,
                    g,
                    r,
                    v,
                    names.as_ref(),
                    &daemon.classes,
                    &daemon.driver,
                ) {
                    problems.push(format!(
                        "{rule_at}: grants {v} on {} {scope} (bound by {}): {why}",
                        resource_name(g, r),
                        b.id
                    ));
                }
                grants.push(Grant {
                    scope: scope.clone(),
                    group: (*g).to_string(),
                    resource: (*r).to_string(),
                    verb: (*v).to_string(),
                    names: names.clone(),
                });
            }
        }
    }
    problems
}

/// What the daemon needs in DRA mode must all be granted, in the scope it needs it: every
/// required use, and the DeviceClass verbs on each class it applies; returns the problems.
fn check_required(daemon: &Daemon, grants: &[Grant]) -> Vec<String> {
    let ds_at = &daemon.ds_at;
    let mut problems = Vec::new();
    let granted = |scope: &Scope, group: &str, resource: &str, verb: &str, name: Option<&str>| {
        grants.iter().any(|g| {
            &g.scope == scope
                && g.group == group
                && g.resource == resource
                && g.verb == verb
                && match (&g.names, name) {
                    (None, _) => true,
                    (Some(names), Some(n)) => names.contains(n),
                    (Some(_), None) => false,
                }
        })
    };
    for u in DAEMON_USES.iter().filter(|u| u.required) {
        let scope = match u.namespace {
            None => Scope::Cluster,
            Some(ns) => Scope::Namespace(ns.to_string()),
        };
        for v in u.verbs {
            if !granted(&scope, u.group, u.resource, v, None) {
                problems.push(format!(
                    "{ds_at}: the daemon's account is not allowed to {v} {} {scope}, which DRA \
                     mode does",
                    resource_name(u.group, u.resource)
                ));
            }
        }
    }
    for class in &daemon.classes {
        for v in DEVICE_CLASS_VERBS {
            if !granted(
                &Scope::Cluster,
                "resource.k8s.io",
                "deviceclasses",
                v,
                Some(class),
            ) {
                problems.push(format!(
                    "{ds_at}: the daemon applies DeviceClass {class} (dra.deviceClasses) but may \
                     not {v} it"
                ));
            }
        }
    }
    problems
}
