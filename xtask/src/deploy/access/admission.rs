//! Admission: in DRA mode a ValidatingAdmissionPolicy, bound with `Deny`, matches every
//! ResourceSlice create, update and delete, fails closed, and, evaluated with the `cel` crate on
//! the requests the daemon makes and on those it must never make, lets the daemon's account
//! write only slices of its own node and driver, while leaving other accounts alone.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::super::Object;
use super::{NODE_NAME_KEY, daemon_user, strings};

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
pub(super) fn check_admission(objects: &[Object], config: &Value, pod: &Value) -> Vec<String> {
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
