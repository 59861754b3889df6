//! deploy-check's access checks: what the daemon's service account may do with the API server.
//!
//! - RBAC objects (the `rbac` module): no aggregation into or from other roles, no subject but
//!   the daemon's account, no role bound to nobody; in DRA mode the pod mounts its token;
//!   device-plugin mode has no role and no token. What the roles grant ([`DAEMON_USES`], and
//!   DeviceClasses by the names in `dra.deviceClasses`, exactly) is listed by the real
//!   authorizer for every rendering in the real-cluster tests.
//! - Admission (the `admission` module): in DRA mode a ValidatingAdmissionPolicy, bound with
//!   `Deny`, matches every ResourceSlice create, update and delete and fails closed; what its CEL
//!   lets through is judged by the real API server in the real-cluster tests.

mod admission;
mod rbac;

use serde_json::Value;

use super::{NAMESPACE, Object};

/// One thing the daemon does with the API server.
pub(crate) struct Use {
    /// `None`: across the cluster; `Some(ns)`: only in that namespace.
    pub(crate) namespace: Option<&'static str>,
    /// API group (`""` for the core group).
    pub(crate) group: &'static str,
    /// Resource, with `/subresource`.
    pub(crate) resource: &'static str,
    /// The verbs it uses.
    pub(crate) verbs: &'static [&'static str],
    /// Needed by every DRA deployment (otherwise only with an option of the chart).
    pub(crate) required: bool,
}

/// Everything the daemon does with the API server in DRA mode, read from its code
/// (`crates/apiserver/src`, `crates/kubedev/src/cluster.rs`). DeviceClasses are apart: only by
/// the names the configuration lists. The real-cluster tests hold what the authorizer grants
/// the daemon's account to this list.
pub(crate) const DAEMON_USES: &[Use] = &[
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
pub(crate) const DEVICE_CLASS_VERBS: &[&str] = &["create", "patch"];

/// The strings of the array at `key` of `v`.
fn strings<'a>(v: &'a Value, key: &str) -> Vec<&'a str> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
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
    let mut problems = rbac::check_rbac(objects, config, pod);
    problems.extend(admission::check_admission(objects, config));
    problems
}
