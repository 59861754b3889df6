//! Admission: in DRA mode a ValidatingAdmissionPolicy, bound with `Deny`, matches every
//! ResourceSlice create, update and delete of every version, fails closed, and no slice or
//! binding narrows it. What its CEL lets through is judged by the real API server (the
//! cluster tests send the daemon's writes, and those it must never make, as its account).

use serde_json::Value;

use super::super::Object;
use super::strings;

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
pub(super) fn check_admission(objects: &[Object], config: &Value) -> Vec<String> {
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
    for p in &policies {
        let at = format!("{}: {}", p.source, p.id);
        let spec = p.value.get("spec").unwrap_or(&Value::Null);
        let mut bad = check_policy_spec(spec);
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
            problems.extend(check_binding(b));
        }
        problems.extend(bad.into_iter().map(|b| format!("{at}: {b}")));
    }
    problems
}

/// A policy's own settings: no parameters, failing closed, matching every create, update and
/// delete of every version of ResourceSlices, no slice exempt by its labels.
fn check_policy_spec(spec: &Value) -> Vec<String> {
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
    bad
}

/// A binding of the policy: it denies, takes no parameters, and narrows nothing.
fn check_binding(b: &Object) -> Vec<String> {
    let mut problems = Vec::new();
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
    problems
}
