//! RBAC objects: no role in device-plugin mode and no service-account token either; in DRA
//! mode the pod mounts its token; no role aggregates or is aggregated; every binding binds the
//! daemon's account and nobody else, to a role the chart renders; no role is bound to nobody.
//!
//! What the bound roles grant is judged by the real API server's authorizer, for every
//! rendering, in the real-cluster tests (`cluster/tests/renderings.rs`): it lists what the
//! daemon's account may do, which must be [`DAEMON_USES`](super::DAEMON_USES) and no more.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::super::{NAMESPACE, Object};
use super::daemon_user;

/// The daemon as the RBAC checks see it: DRA mode or not, the ServiceAccount it runs as, and
/// its DaemonSet (for messages).
struct Daemon {
    dra: bool,
    sa: String,
    ds_at: String,
}

impl Daemon {
    /// Reads the daemon from the rendering, its configuration and its pod spec.
    fn of(objects: &[Object], config: &Value, pod: &Value) -> Daemon {
        let dra = config.pointer("/dra/enabled") == Some(&Value::Bool(true));
        let (_, sa) = daemon_user(pod);
        let ds_at = objects
            .iter()
            .find(|o| o.kind == "DaemonSet")
            .map(|o| format!("{}: {}", o.source, o.id))
            .unwrap_or_else(|| "DaemonSet".into());
        Daemon { dra, sa, ds_at }
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

    let mut bound: BTreeSet<(&str, &str, &str)> = BTreeSet::new();
    for b in objects
        .iter()
        .filter(|o| o.kind == "ClusterRoleBinding" || o.kind == "RoleBinding")
    {
        problems.extend(check_binding(b, &roles, &daemon, &mut bound));
    }
    for (key, role) in &roles {
        if !bound.contains(key) {
            problems.push(format!(
                "{}: {}: bound to nobody: the daemon never gets these permissions",
                role.source, role.id
            ));
        }
    }
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
/// daemon's account, to a rendered role. The role bound is added to `bound`; returns the
/// problems.
fn check_binding<'o>(
    b: &'o Object,
    roles: &Roles<'o>,
    daemon: &Daemon,
    bound: &mut BTreeSet<(&'o str, &'o str, &'o str)>,
) -> Vec<String> {
    let at = format!("{}: {}", b.source, b.id);
    let mut problems = Vec::new();
    if !daemon.dra {
        problems.push(format!(
            "{at}: rendered in device-plugin mode, which uses no API"
        ));
    }
    let ns = if b.kind == "RoleBinding" {
        b.value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
    } else {
        ""
    };
    problems.extend(check_subjects(b, &at, &daemon.sa));
    match bound_role(b, ns, &at, roles) {
        Ok((key, _)) => {
            bound.insert(key);
        }
        Err(problem) => problems.push(problem),
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
