//! deploy-check's access checks: what the daemon's service account may do with the API server.
//!
//! - RBAC: the roles bound to the daemon's account grant what the daemon does ([`DAEMON_USES`],
//!   and DeviceClasses by the names in `dra.deviceClasses`) and nothing else: no wildcard, no
//!   non-resource URL, no verb, resource or namespace beyond that list, no aggregation into other
//!   roles, no subject but the daemon's account. In DRA mode every required use is granted and the
//!   pod mounts its token; device-plugin mode has no role and no token.
//! - Admission: in DRA mode a ValidatingAdmissionPolicy, bound with `Deny`, matches every
//!   ResourceSlice create, update and delete, fails closed, and, evaluated with the `cel` crate
//!   on the requests the daemon makes and on those it must never make, lets the daemon's account
//!   write only slices of its own node (the token's `authentication.kubernetes.io/node-name`)
//!   and driver, while leaving other accounts alone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{Value, json};

use super::{NAMESPACE, Object};

/// The user-info key the API server puts the node of a pod-bound service-account token in.
pub(super) const NODE_NAME_KEY: &str = "authentication.kubernetes.io/node-name";

/// One thing the daemon does with the API server.
pub(super) struct Use {
    /// `None`: across the cluster; `Some(ns)`: only in that namespace.
    pub namespace: Option<&'static str>,
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// Resource, with `/subresource`.
    pub resource: &'static str,
    /// The verbs it uses.
    pub verbs: &'static [&'static str],
    /// Needed by every DRA deployment (otherwise only with an option of the chart).
    pub required: bool,
}

/// Everything the daemon does with the API server in DRA mode, read from its code
/// (`crates/apiserver/src`, `crates/kubedev/src/cluster.rs`). DeviceClasses are apart: only by
/// the names the configuration lists (see [`check_rbac`]).
pub(super) const DAEMON_USES: &[Use] = &[
    // publisher.rs: a reflector (list, watch) on `spec.driver,spec.nodeName`, `get_opt` after a
    // conflict, create, replace, delete with preconditions.
    Use {
        namespace: None,
        group: "resource.k8s.io",
        resource: "resourceslices",
        verbs: &["get", "list", "watch", "create", "update", "delete"],
        required: true,
    },
    // claim.rs `get`; node_claims.rs lists them to rebuild state after a lost checkpoint.
    Use {
        namespace: None,
        group: "resource.k8s.io",
        resource: "resourceclaims",
        verbs: &["get", "list"],
        required: true,
    },
    // claim.rs `set_device_status`: a merge patch of the status (the chart's rbac.claimStatus).
    Use {
        namespace: None,
        group: "resource.k8s.io",
        resource: "resourceclaims/status",
        verbs: &["patch"],
        required: false,
    },
    // publisher.rs reads its Node for the slices' owner reference; events.rs for the Event's.
    Use {
        namespace: None,
        group: "",
        resource: "nodes",
        verbs: &["get"],
        required: true,
    },
    // events.rs through kube-runtime's Recorder: Events regarding the Node, which has no
    // namespace, so they are created (and patched when repeated) in `default`.
    Use {
        namespace: Some("default"),
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        required: true,
    },
];

/// classes.rs `apply_device_classes`: server-side apply, authorized as `patch`, and as `create`
/// (with the object's name) when the class does not exist yet.
const DEVICE_CLASS_VERBS: &[&str] = &["create", "patch"];

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

/// The strings of the array at `key` of `v`.
fn strings<'a>(v: &'a Value, key: &str) -> Vec<&'a str> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn resource_name(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// The user name of the daemon's service account, from the pod spec.
pub(super) fn daemon_user(pod: &Value) -> (String, String) {
    let sa = pod
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string();
    (format!("system:serviceaccount:{NAMESPACE}:{sa}"), sa)
}

/// Every access check of one rendering; `pod` is the DaemonSet's pod spec, `config` the
/// daemon's parsed configuration.
pub(super) fn check(objects: &[Object], config: &Value, pod: &Value) -> Vec<String> {
    let mut problems = check_rbac(objects, config, pod);
    problems.extend(check_admission(objects, config, pod));
    problems
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
) -> Result<(), String> {
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
        let (_, sa) = daemon_user(pod);
        let ds_at = objects
            .iter()
            .find(|o| o.kind == "DaemonSet")
            .map(|o| format!("{}: {}", o.source, o.id))
            .unwrap_or_else(|| "DaemonSet".into());
        Daemon {
            dra,
            classes,
            sa,
            ds_at,
        }
    }
}

/// Roles by (kind, namespace, name).
type Roles<'o> = BTreeMap<(&'o str, &'o str, &'o str), &'o Object>;

/// The RBAC checks; see the module docs.
fn check_rbac(objects: &[Object], config: &Value, pod: &Value) -> Vec<String> {
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
        problems.extend(check_rule(
            rule,
            &rule_at,
            &scope,
            b,
            &daemon.classes,
            grants,
        ));
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
    classes: &BTreeSet<String>,
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
                if let Err(why) = judge(scope, g, r, v, names.as_ref(), classes) {
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

/// A request to the admission policy: who writes which ResourceSlice how.
struct Request {
    /// What it tries, for messages: "create a slice of its own node".
    what: String,
    operation: &'static str,
    user: String,
    /// The node in the user's credentials.
    node: Option<&'static str>,
    object: Value,
    old: Value,
    /// Whether the policy must let it through.
    allowed: bool,
}

/// A ResourceSlice of `driver` on `node` (`None`: for all nodes).
fn slice(driver: &str, node: Option<&str>) -> Value {
    let mut spec = json!({
        "driver": driver,
        "pool": {"name": node.unwrap_or("shared"), "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "dev-0"}],
    });
    match node {
        Some(n) => spec["nodeName"] = json!(n),
        None => spec["allNodes"] = json!(true),
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("{}-{driver}-x7k2p", node.unwrap_or("shared"))},
        "spec": spec,
    })
}

/// The requests every policy is tried on: what the daemon's account on node-a does, what it
/// must not do, and another account's write.
fn requests(user: &str, driver: &str) -> Vec<Request> {
    let own = || slice(driver, Some("node-a"));
    let other = || slice(driver, Some("node-b"));
    let other_driver = format!("x{driver}");
    let r = |what: &str, operation, node, object, old, allowed| Request {
        what: what.into(),
        operation,
        user: user.into(),
        node,
        object,
        old,
        allowed,
    };
    let a = Some("node-a");
    vec![
        r(
            "create a slice of its node",
            "CREATE",
            a,
            own(),
            Value::Null,
            true,
        ),
        r(
            "update a slice of its node",
            "UPDATE",
            a,
            own(),
            own(),
            true,
        ),
        r(
            "delete a slice of its node",
            "DELETE",
            a,
            Value::Null,
            own(),
            true,
        ),
        r(
            "create a slice of node-b",
            "CREATE",
            a,
            other(),
            Value::Null,
            false,
        ),
        r(
            "update a slice of node-b",
            "UPDATE",
            a,
            other(),
            other(),
            false,
        ),
        r(
            "delete a slice of node-b",
            "DELETE",
            a,
            Value::Null,
            other(),
            false,
        ),
        r(
            "move a slice of node-b to its node",
            "UPDATE",
            a,
            own(),
            other(),
            false,
        ),
        r(
            "move a slice of its node to node-b",
            "UPDATE",
            a,
            other(),
            own(),
            false,
        ),
        r(
            "create a slice for all nodes",
            "CREATE",
            a,
            slice(driver, None),
            Value::Null,
            false,
        ),
        r(
            &format!("create a slice of driver {other_driver} on its node"),
            "CREATE",
            a,
            slice(&other_driver, Some("node-a")),
            Value::Null,
            false,
        ),
        r(
            "create a slice of its node with credentials that name no node",
            "CREATE",
            None,
            own(),
            Value::Null,
            false,
        ),
        Request {
            what: "let another account (system:serviceaccount:other:writer on node-b) create a \
                   slice of node-a"
                .into(),
            operation: "CREATE",
            user: "system:serviceaccount:other:writer".into(),
            node: Some("node-b"),
            object: own(),
            old: Value::Null,
            allowed: true,
        },
    ]
}

/// What the policy says about a request.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// A match condition is false: the policy does not apply.
    NotMatched,
    Allowed,
    Denied(String),
}

fn to_cel(v: &Value) -> cel::Value {
    cel::to_value(v).unwrap_or(cel::Value::Null)
}

/// Evaluates the policy `spec` (match conditions, variables, validations) on `request` as the
/// API server would, with `failurePolicy: Fail`: an expression that fails to evaluate denies.
/// Err: an expression does not compile.
fn evaluate(spec: &Value, request: &Request) -> Result<Verdict, String> {
    let env = Arc::new(cel::Env::stdlib());
    let compile = |e: &str| {
        env.compile(e)
            .map_err(|err| format!("expression {e:?} does not compile: {err}"))
    };
    let mut extra = serde_json::Map::new();
    if let Some(n) = request.node {
        extra.insert(NODE_NAME_KEY.into(), json!([n]));
        extra.insert(
            "authentication.kubernetes.io/pod-name".into(),
            json!(["kubedev-x7k2p"]),
        );
    }
    let namespace = request
        .user
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split(':').next())
        .unwrap_or_default();
    let req = json!({
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceSlice"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"},
        "name": (if request.object.is_null() { &request.old } else { &request.object })
            .pointer("/metadata/name"),
        "operation": request.operation,
        "userInfo": {
            "username": request.user,
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"),
                       "system:authenticated"],
            "extra": extra,
        },
        "dryRun": false,
    });
    // Everything compiles, whether or not this request reaches it.
    let list = |k: &str| -> Vec<&Value> {
        spec.get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .collect()
    };
    let text = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let mut conditions = Vec::new();
    for c in list("matchConditions") {
        let expr = text(c, "expression");
        conditions.push((compile(&expr)?, expr));
    }
    let mut vars = Vec::new();
    for v in list("variables") {
        vars.push((text(v, "name"), compile(&text(v, "expression"))?));
    }
    let mut validations = Vec::new();
    for v in list("validations") {
        if let Some(m) = v.get("messageExpression").and_then(Value::as_str) {
            compile(m)?;
        }
        let expr = text(v, "expression");
        let message = v
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or(&expr)
            .trim()
            .to_string();
        validations.push((compile(&expr)?, expr, message));
    }

    let mut ctx = cel::Context::with_env(env.clone());
    ctx.add_variable_from_value("request", to_cel(&req));
    ctx.add_variable_from_value("object", to_cel(&request.object));
    ctx.add_variable_from_value("oldObject", to_cel(&request.old));
    ctx.add_variable_from_value("variables", HashMap::<String, cel::Value>::new());
    for (program, expr) in &conditions {
        match program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => return Ok(Verdict::NotMatched),
            other => {
                return Ok(Verdict::Denied(format!(
                    "match condition {expr:?} gives {other:?}"
                )));
            }
        }
    }
    // Variables in order, each seeing the ones before; one that fails stays unset, so an
    // expression that reads it fails too (as the API server's lazy variables do).
    let mut variables: HashMap<String, cel::Value> = HashMap::new();
    for (name, program) in &vars {
        if let Ok(value) = program.execute(&ctx) {
            variables.insert(name.clone(), value);
            ctx.add_variable_from_value("variables", variables.clone());
        }
    }
    for (program, expr, message) in &validations {
        match program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => return Ok(Verdict::Denied(message.clone())),
            other => return Ok(Verdict::Denied(format!("{expr:?} gives {other:?}"))),
        }
    }
    Ok(Verdict::Allowed)
}

/// Whether the rules (a policy's `matchConstraints` or `excludeResourceRules`) take
/// `operation` on ResourceSlices of `version`.
fn rules_take(rules: Option<&Value>, version: &str, operation: &str, exact: bool) -> bool {
    rules
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| {
            let has = |k: &str, want: &str| strings(r, k).iter().any(|v| *v == "*" || *v == want);
            let scope = r.get("scope").and_then(Value::as_str).unwrap_or("*");
            has("apiGroups", "resource.k8s.io")
                && has("resources", "resourceslices")
                && has("operations", operation)
                && (scope == "*" || scope == "Cluster")
                // Equivalent (the default) also sends requests of other versions of a matched
                // resource, converted.
                && (has("apiVersions", version) || (!exact && !strings(r, "apiVersions").is_empty()))
        })
}

/// Whether a label selector selects something less than everything.
fn narrows(selector: Option<&Value>) -> bool {
    selector.is_some_and(|s| {
        s.get("matchLabels")
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty())
            || s.get("matchExpressions")
                .and_then(Value::as_array)
                .is_some_and(|m| !m.is_empty())
    })
}

/// The admission checks; see the module docs.
fn check_admission(objects: &[Object], config: &Value, pod: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let dra = config.pointer("/dra/enabled") == Some(&Value::Bool(true));
    let policies: Vec<&Object> = objects
        .iter()
        .filter(|o| o.kind == "ValidatingAdmissionPolicy")
        .collect();
    let bindings: Vec<&Object> = objects
        .iter()
        .filter(|o| o.kind == "ValidatingAdmissionPolicyBinding")
        .collect();
    if !dra {
        for o in policies.iter().chain(&bindings) {
            problems.push(format!(
                "{}: {}: rendered while DRA is off (no ResourceSlices are written)",
                o.source, o.id
            ));
        }
        return problems;
    }
    if policies.is_empty() {
        let cm = objects.iter().find(|o| o.kind == "ConfigMap");
        problems.push(format!(
            "{}: DRA is enabled but no ValidatingAdmissionPolicy is rendered: the daemon's \
             account may write every node's ResourceSlices",
            cm.map(|o| format!("{}: {}", o.source, o.id))
                .unwrap_or_default()
        ));
    }
    let (user, _) = daemon_user(pod);
    let driver = config
        .pointer("/dra/driverName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    for p in &policies {
        let at = format!("{}: {}", p.source, p.id);
        let spec = p.value.get("spec").unwrap_or(&Value::Null);
        let mut bad = Vec::new();
        if spec.get("paramKind").is_some_and(|v| !v.is_null()) {
            bad.push("has a paramKind, but nothing gives it parameters".to_string());
        }
        match spec.get("failurePolicy").and_then(Value::as_str) {
            None | Some("Fail") => {}
            Some(f) => bad.push(format!(
                "failurePolicy {f}: a write the policy cannot evaluate would go through; use Fail"
            )),
        }
        let mc = spec.get("matchConstraints").unwrap_or(&Value::Null);
        let exact = mc.get("matchPolicy").and_then(Value::as_str) == Some("Exact");
        for version in ["v1", "v1beta2", "v1beta1"] {
            for op in ["CREATE", "UPDATE", "DELETE"] {
                let taken = rules_take(mc.get("resourceRules"), version, op, exact)
                    && !rules_take(mc.get("excludeResourceRules"), version, op, exact);
                if !taken {
                    bad.push(format!(
                        "does not match {op} of resource.k8s.io/{version} resourceslices"
                    ));
                }
            }
        }
        if narrows(mc.get("objectSelector")) {
            bad.push("matchConstraints.objectSelector exempts slices by their labels".into());
        }
        let bound: Vec<&&Object> = bindings
            .iter()
            .filter(|b| {
                b.value.pointer("/spec/policyName").and_then(Value::as_str) == Some(&p.name)
            })
            .collect();
        if bound.is_empty() {
            bad.push("no ValidatingAdmissionPolicyBinding binds it, so it does nothing".into());
        }
        for b in bound {
            let b_at = format!("{}: {}", b.source, b.id);
            let bspec = b.value.get("spec").unwrap_or(&Value::Null);
            if !strings(bspec, "validationActions").contains(&"Deny") {
                problems.push(format!(
                    "{b_at}: validationActions {:?} has no Deny: violations would only be \
                     reported",
                    strings(bspec, "validationActions")
                ));
            }
            if bspec.get("paramRef").is_some_and(|v| !v.is_null()) {
                problems.push(format!("{b_at}: has a paramRef, but the policy takes none"));
            }
            if let Some(m) = bspec.get("matchResources").filter(|m| !m.is_null()) {
                let narrowed = narrows(m.get("objectSelector"))
                    || m.get("excludeResourceRules")
                        .and_then(Value::as_array)
                        .is_some_and(|r| !r.is_empty())
                    || m.get("resourceRules").is_some_and(|r| !r.is_null());
                if narrowed {
                    problems.push(format!(
                        "{b_at}: matchResources narrows which slices the policy sees; leave it \
                         out"
                    ));
                }
            }
        }
        for r in requests(&user, driver) {
            let verdict = match evaluate(spec, &r) {
                Ok(v) => v,
                Err(e) => {
                    bad.push(e);
                    break;
                }
            };
            let allowed = !matches!(verdict, Verdict::Denied(_));
            let who = if r.user == user {
                format!("the daemon's account ({})", r.node.unwrap_or("no node"))
            } else {
                "it".to_string()
            };
            match (r.allowed, allowed, verdict) {
                (true, false, Verdict::Denied(why)) => {
                    bad.push(format!("stops {who} when it tries to {}: {why}", r.what));
                }
                (false, true, _) => bad.push(format!("lets {who} {}", r.what)),
                _ => {}
            }
        }
        problems.extend(bad.into_iter().map(|b| format!("{at}: {b}")));
    }
    problems
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn policy() -> Value {
        json!({
            "failurePolicy": "Fail",
            "matchConditions": [{"name": "d", "expression":
                "request.userInfo.username == \"system:serviceaccount:kube-system:kubedev\""}],
            "variables": [
                {"name": "node", "expression":
                    "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"},
                {"name": "slices", "expression":
                    "request.operation == 'CREATE' ? [object] : (request.operation == 'DELETE' ? [oldObject] : [object, oldObject])"},
            ],
            "validations": [
                {"expression": "variables.node != ''"},
                {"expression": "variables.slices.all(s, s.spec.?nodeName.orValue('') == variables.node)"},
                {"expression": "variables.slices.all(s, s.spec.driver == \"d.example.com\")"},
            ],
        })
    }

    #[test]
    fn the_policy_is_evaluated_on_every_request() {
        let user = "system:serviceaccount:kube-system:kubedev";
        for r in requests(user, "d.example.com") {
            let v = evaluate(&policy(), &r).unwrap();
            assert_eq!(
                !matches!(v, Verdict::Denied(_)),
                r.allowed,
                "{}: {v:?}",
                r.what
            );
        }
        // Without the driver test, another driver's slice on its node gets through.
        let mut loose = policy();
        loose["validations"].as_array_mut().unwrap().pop();
        let r = requests(user, "d.example.com")
            .into_iter()
            .find(|r| r.what.contains("of driver"))
            .unwrap();
        assert_eq!(evaluate(&loose, &r).unwrap(), Verdict::Allowed);
        // Another account is not matched at all.
        let other = requests(user, "d.example.com").pop().unwrap();
        assert_eq!(evaluate(&policy(), &other).unwrap(), Verdict::NotMatched);
        // A syntax error is reported, not taken as a denial.
        let mut broken = policy();
        broken["validations"][0]["expression"] = json!("variables.node !=");
        assert!(evaluate(&broken, &other).is_err());
    }
}
