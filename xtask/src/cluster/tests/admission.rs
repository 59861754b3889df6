//! The chart's ValidatingAdmissionPolicy and RBAC judged by the real API server: the
//! ResourceSlice writes the daemon's account makes, those it must never make, and another
//! account's write, each sent (server-side dry run) as that account with the node name its
//! projected token carries (`--as`, `--as-user-extra`). The daemon's account must be let
//! through exactly where it writes slices of its own node and driver. Then the policy's binding
//! is taken away, and the same requests must show the daemon's account getting through (the
//! check finds what it exists to find), and it is put back. RBAC is asked too (`kubectl auth
//! can-i` as the daemon's account): every use the daemon makes is granted, by the real
//! authorizer, and what it must never do is not; with the built-in `edit` role bound to the
//! account as well, the check must find it may read secrets.

use std::io::Write as _;

use serde_json::json;

use super::*;

/// The user-info extra a pod's projected service-account token carries its node in.
const NODE_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The two nodes the requests are about (names only: the policy compares names, and slices
/// of nodes that do not exist keep the daemon, which manages its own node's, out of the way).
const OWN_NODE: &str = "kubedev-admission-a";
const OTHER_NODE: &str = "kubedev-admission-b";

/// Which slice a request writes, or wrote before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SliceOf {
    /// None: the object of a delete, the old object of a create.
    Nothing,
    /// A slice of kubedev's driver on the daemon's node.
    OwnNode,
    /// A slice of kubedev's driver on another node.
    OtherNode,
    /// A slice of kubedev's driver for all nodes.
    AllNodes,
    /// A slice of another driver on the daemon's node.
    OtherDriver,
}

impl SliceOf {
    /// The slice, named `name`.
    fn slice(self, name: &str) -> Value {
        let (driver, node) = match self {
            SliceOf::Nothing => return Value::Null,
            SliceOf::OwnNode => (DRIVER.to_string(), Some(OWN_NODE)),
            SliceOf::OtherNode => (DRIVER.to_string(), Some(OTHER_NODE)),
            SliceOf::AllNodes => (DRIVER.to_string(), None),
            SliceOf::OtherDriver => (format!("x{DRIVER}"), Some(OWN_NODE)),
        };
        let mut spec = json!({
            "driver": driver,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}],
        });
        match node {
            Some(n) => spec["nodeName"] = json!(n),
            None => spec["allNodes"] = json!(true),
        }
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": spec,
        })
    }
}

/// Who sends a request.
#[derive(Clone, Copy, Debug)]
enum Sender {
    /// The daemon's account, with the daemon's node in its credentials.
    Daemon,
    /// The daemon's account with credentials that name no node.
    DaemonWithoutNode,
    /// Another account, allowed every write by RBAC (`system:masters`), on the other node.
    Other,
}

/// One request: what it tries, the operation, who sends it, the new and old slice, and
/// whether the policy must let it through.
type Request = (&'static str, &'static str, Sender, SliceOf, SliceOf, bool);

#[rustfmt::skip]
const REQUESTS: &[Request] = {
    use SliceOf::{AllNodes, Nothing, OtherDriver, OtherNode, OwnNode};
    use Sender::{Daemon, DaemonWithoutNode, Other};
    &[
        ("create a slice of its node",            "CREATE", Daemon, OwnNode,     Nothing,   true),
        ("update a slice of its node",            "UPDATE", Daemon, OwnNode,     OwnNode,   true),
        ("delete a slice of its node",            "DELETE", Daemon, Nothing,     OwnNode,   true),
        ("create a slice of another node",        "CREATE", Daemon, OtherNode,   Nothing,   false),
        ("update a slice of another node",        "UPDATE", Daemon, OtherNode,   OtherNode, false),
        ("delete a slice of another node",        "DELETE", Daemon, Nothing,     OtherNode, false),
        ("move a slice of another node to its node", "UPDATE", Daemon, OwnNode,  OtherNode, false),
        ("create a slice for all nodes",          "CREATE", Daemon, AllNodes,    Nothing,   false),
        ("create a slice of another driver",      "CREATE", Daemon, OtherDriver, Nothing,   false),
        ("create a slice of its node with credentials that name no node",
                                                  "CREATE", DaemonWithoutNode, OwnNode, Nothing, false),
        ("let another account create a slice of the daemon's node",
                                                  "CREATE", Other,  OwnNode,     Nothing,   true),
    ]
};

pub(super) fn admission_policy(node: &Node, _root: &Path) -> anyhow::Result<()> {
    let account = daemon_account(node)?;
    let result = rbac(node, &account)
        .and_then(|()| judge(node, &account, true))
        .and_then(|wrong| {
            ensure!(
                wrong.is_empty(),
                "the API server, with the chart's admission policy and RBAC, judged the daemon's \
             account ({account}) differently from what it must be allowed:\n{}",
                indent(&wrong.join("\n"))
            );
            without_the_binding(node, &account)
        });
    let _ = node.kubectl_out(&[
        "delete",
        "resourceslices",
        "-l",
        "kubedev.io/admission-test=true",
        "--ignore-not-found",
    ]);
    result
}

/// What the daemon's account must never be allowed, whatever the chart's values: (verb,
/// resource, namespace or all).
const NEVER: &[(&str, &str, Option<&str>)] = &[
    ("get", "secrets", None),
    ("list", "secrets", None),
    ("create", "pods", None),
    ("delete", "pods", None),
    ("patch", "nodes", None),
    ("delete", "nodes", None),
    ("create", "serviceaccounts/token", None),
    ("update", "resourceclaims", None),
    ("delete", "resourceclaims", None),
    ("deletecollection", "resourceslices.resource.k8s.io", None),
    ("delete", "deviceclasses.resource.k8s.io", None),
    ("patch", "clusterroles.rbac.authorization.k8s.io", None),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", None),
    ("impersonate", "users", None),
    (
        "patch",
        "validatingadmissionpolicies.admissionregistration.k8s.io",
        None,
    ),
    ("create", "events.events.k8s.io", Some(KUBEDEV_NAMESPACE)),
];

/// RBAC as the API server's authorizer decides it for the daemon's account (with the groups
/// its token carries): each use the daemon makes (`deploy-check`'s list, with the chart's
/// defaults) granted, each of [`NEVER`] refused.
fn rbac(node: &Node, account: &str) -> anyhow::Result<()> {
    let wrong = rbac_problems(node, account)?;
    eprintln!(
        "  RBAC: the daemon's uses granted, {} things it must never do refused{}",
        NEVER.len(),
        if wrong.is_empty() { "" } else { " (not all)" }
    );
    ensure!(
        wrong.is_empty(),
        "the API server's authorizer, with the chart's RBAC, lets the daemon's account \
         ({account}) do other than it must:\n{}",
        indent(&wrong.join("\n"))
    );
    with_too_much_granted(node, account)
}

/// Binds the built-in `edit` role to the daemon's account as well: the check must then find it
/// may read secrets. Removes the binding and waits until the check is clean again.
fn with_too_much_granted(node: &Node, account: &str) -> anyhow::Result<()> {
    const BINDING: &str = "kubedev-test-too-much";
    let sa = account
        .strip_prefix("system:serviceaccount:")
        .unwrap_or(account);
    node.kubectl_out(&[
        "create",
        "clusterrolebinding",
        BINDING,
        "--clusterrole=edit",
        &format!("--serviceaccount={sa}"),
    ])?;
    let mut found = Vec::new();
    let caught = wait_for(
        "the authorizer to grant the daemon's account the edit role",
        Duration::from_secs(30),
        || {
            found = rbac_problems(node, account)?;
            Ok(found.iter().any(|w| w.starts_with("may get secrets")))
        },
    );
    let removed = node
        .kubectl_out(&["delete", "clusterrolebinding", BINDING])
        .and_then(|_| {
            wait_for(
                "the edit role taken away again",
                Duration::from_secs(30),
                || Ok(rbac_problems(node, account)?.is_empty()),
            )
        });
    caught?;
    eprintln!(
        "  with the edit role bound too, the check finds:\n{}",
        indent(&found.join("\n"))
    );
    removed
}

/// What the authorizer grants the daemon's account wrongly, or refuses it wrongly.
fn rbac_problems(node: &Node, account: &str) -> anyhow::Result<Vec<String>> {
    let namespace = account.split(':').nth(2).unwrap_or_default();
    let can = |verb: &str, resource: &str, ns: Option<&str>| -> anyhow::Result<bool> {
        let (resource, sub) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (resource, None),
        };
        let mut cmd = node.kubectl();
        cmd.args(["auth", "can-i", verb, resource]);
        cmd.arg(format!("--as={account}"));
        for g in [
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".to_string(),
        ] {
            cmd.arg(format!("--as-group={g}"));
        }
        if let Some(s) = sub {
            cmd.arg(format!("--subresource={s}"));
        }
        match ns {
            Some(ns) => cmd.args(["-n", ns]),
            None => cmd.arg("--all-namespaces"),
        };
        let out = cmd.output().context("running kubectl auth can-i")?;
        Ok(String::from_utf8_lossy(&out.stdout).trim() == "yes")
    };
    let mut wrong = Vec::new();
    for u in crate::deploy::access::DAEMON_USES {
        let resource = super::renderings::use_resource(u);
        for verb in u.verbs {
            if !can(verb, &resource, u.namespace)? {
                wrong.push(format!("may not {verb} {resource}, which the daemon does"));
            }
        }
    }
    for verb in crate::deploy::access::DEVICE_CLASS_VERBS {
        // Server-side apply of the classes the chart lists, by name.
        let class = format!("deviceclasses.resource.k8s.io/{EXTENDED_CLASS}");
        let mut cmd = node.kubectl();
        cmd.args(["auth", "can-i", verb, &class, &format!("--as={account}")]);
        let out = cmd.output().context("running kubectl auth can-i")?;
        if String::from_utf8_lossy(&out.stdout).trim() != "yes" {
            wrong.push(format!("may not {verb} {class}, a class the chart lists"));
        }
    }
    for &(verb, resource, ns) in NEVER {
        if can(verb, resource, ns)? {
            wrong.push(format!(
                "may {verb} {resource}{}",
                ns.map_or(String::new(), |n| format!(" in {n}"))
            ));
        }
    }
    Ok(wrong)
}

/// Takes the policy's binding away: the same requests must then let the daemon's account
/// write another node's slices. Puts the binding back and waits until it is in force again.
fn without_the_binding(node: &Node, account: &str) -> anyhow::Result<()> {
    let bindings = get_json(node, &["validatingadmissionpolicybindings"])?;
    let binding = bindings["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| {
            b["spec"]["policyName"]
                .as_str()
                .is_some_and(|p| p.ends_with("-resourceslices"))
        })
        .cloned()
        .context("the chart's ValidatingAdmissionPolicyBinding is not in the cluster")?;
    let name = binding["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut restore = binding.clone();
    if let Some(meta) = restore["metadata"].as_object_mut() {
        for k in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "generation",
        ] {
            meta.remove(k);
        }
    }
    restore.as_object_mut().map(|o| o.remove("status"));
    node.kubectl_out(&["delete", "validatingadmissionpolicybinding", &name])?;
    let mut found = Vec::new();
    let caught = wait_for(
        "the API server to let the daemon's account through without the binding",
        Duration::from_secs(60),
        || {
            found = judge(node, account, false)?;
            Ok(found
                .iter()
                .any(|w| w.contains("create a slice of another node")))
        },
    );
    let restored = apply(node, &restore.to_string()).and_then(|()| {
        wait_for(
            "the binding in force again",
            Duration::from_secs(60),
            || Ok(judge(node, account, false)?.is_empty()),
        )
    });
    caught?;
    eprintln!(
        "  without the binding, the check finds:\n{}",
        indent(&found.join("\n"))
    );
    restored
}

/// Sends every request (printing each verdict with `print`); what was let through or stopped
/// wrongly.
fn judge(node: &Node, account: &str, print: bool) -> anyhow::Result<Vec<String>> {
    let mut wrong = Vec::new();
    for (i, &(what, operation, sender, object, old, allowed)) in REQUESTS.iter().enumerate() {
        let name = format!("kubedev-admission-{i}");
        if old != SliceOf::Nothing {
            // The slice an update or delete finds, created by the admin.
            apply(node, &labelled(old.slice(&name)).to_string())?;
        }
        let outcome = send(
            node,
            account,
            operation,
            sender,
            &labelled(object.slice(&name)),
            &name,
        )?;
        let verdict = match &outcome {
            Ok(()) => "allowed".to_string(),
            Err(why) => format!("denied: {why}"),
        };
        if print {
            eprintln!("  {what}: {verdict}");
        }
        match (allowed, outcome) {
            // Denied by failurePolicy, not by the policy's own rules: a message that helps no
            // one, and a policy that does not say what it means.
            (false, Err(why)) if why.contains("resulted in error") => wrong.push(format!(
                "stops it when it tries to {what} only because the policy's CEL fails: {why}"
            )),
            (true, Err(why)) => wrong.push(format!("stops it when it tries to {what}: {why}")),
            (false, Ok(())) => wrong.push(format!("lets it {what}")),
            _ => {}
        }
    }
    Ok(wrong)
}

/// `slice` with the label the test's clean-up deletes by (nothing for no slice).
fn labelled(mut slice: Value) -> Value {
    if slice.is_object() {
        slice["metadata"]["labels"] = json!({"kubedev.io/admission-test": "true"});
    }
    slice
}

/// Sends one request as `sender` (server-side dry run); `Err` with the server's answer when it
/// was refused.
fn send(
    node: &Node,
    account: &str,
    operation: &str,
    sender: Sender,
    object: &Value,
    name: &str,
) -> anyhow::Result<Result<(), String>> {
    let mut cmd = node.kubectl();
    match operation {
        "CREATE" => cmd.args(["create", "--dry-run=server", "-f", "-"]),
        "UPDATE" => cmd.args(["replace", "--dry-run=server", "-f", "-"]),
        _ => cmd.args(["delete", "--dry-run=server", "resourceslice", name]),
    };
    match sender {
        Sender::Daemon => {
            cmd.arg(format!("--as={account}"));
            cmd.arg(format!("--as-user-extra={NODE_EXTRA}={OWN_NODE}"));
        }
        Sender::DaemonWithoutNode => {
            cmd.arg(format!("--as={account}"));
        }
        Sender::Other => {
            cmd.args([
                "--as=system:serviceaccount:other:writer",
                "--as-group=system:masters",
            ]);
            cmd.arg(format!("--as-user-extra={NODE_EXTRA}={OTHER_NODE}"));
        }
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running kubectl")?;
    if let Some(mut stdin) = child.stdin.take()
        && object.is_object()
    {
        stdin.write_all(object.to_string().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    Ok(if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    })
}

/// The daemon's account as the API server names it.
fn daemon_account(node: &Node) -> anyhow::Result<String> {
    let sa = node.kubectl_out(&[
        "get",
        "daemonsets",
        "-n",
        KUBEDEV_NAMESPACE,
        "-o",
        "jsonpath={.items[0].spec.template.spec.serviceAccountName}",
    ])?;
    let sa = sa.trim();
    ensure!(
        !sa.is_empty(),
        "kubedev's DaemonSet names no service account"
    );
    Ok(format!("system:serviceaccount:{KUBEDEV_NAMESPACE}:{sa}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_and_deletes_find_a_slice_and_creates_and_deletes_send_the_right_one() {
        for &(what, operation, _, object, old, _) in REQUESTS {
            match operation {
                "CREATE" => assert!(
                    object != SliceOf::Nothing && old == SliceOf::Nothing,
                    "{what}"
                ),
                "UPDATE" => assert!(
                    object != SliceOf::Nothing && old != SliceOf::Nothing,
                    "{what}"
                ),
                "DELETE" => assert!(
                    object == SliceOf::Nothing && old != SliceOf::Nothing,
                    "{what}"
                ),
                other => panic!("{what}: {other}"),
            }
        }
        // The daemon's own writes are allowed, and each way out of its node and driver is not.
        let allowed: Vec<&str> = REQUESTS.iter().filter(|r| r.5).map(|r| r.0).collect();
        assert_eq!(allowed.len(), 4, "{allowed:?}");
        let own = SliceOf::OwnNode.slice("s");
        assert_eq!(own["spec"]["nodeName"], OWN_NODE);
        assert_eq!(SliceOf::AllNodes.slice("s")["spec"]["allNodes"], true);
        assert_eq!(SliceOf::Nothing.slice("s"), Value::Null);
    }
}
