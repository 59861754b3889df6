//! The ResourceSlice writes every admission policy is tried on: what the daemon's account on
//! node-a does, what it must never do, and another account's write.

use serde_json::{Value, json};

/// A request to the admission policy: who writes which ResourceSlice how.
pub(super) struct Request {
    /// What it tries, for messages: "create a slice of its own node".
    pub(super) what: String,
    pub(super) operation: &'static str,
    pub(super) user: String,
    /// The node in the user's credentials.
    pub(super) node: Option<&'static str>,
    pub(super) object: Value,
    pub(super) old: Value,
    /// Whether the policy must let it through.
    pub(super) allowed: bool,
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

/// Which slice a request writes, or wrote before it.
#[derive(Clone, Copy)]
enum SliceOf {
    /// None: the object of a delete, the old object of a create.
    Nothing,
    /// A slice of the daemon's driver on node-a, the daemon's node.
    OwnNode,
    /// A slice of the daemon's driver on node-b.
    OtherNode,
    /// A slice of the daemon's driver for all nodes.
    AllNodes,
}

impl SliceOf {
    fn slice(self, driver: &str) -> Value {
        match self {
            SliceOf::Nothing => Value::Null,
            SliceOf::OwnNode => slice(driver, Some("node-a")),
            SliceOf::OtherNode => slice(driver, Some("node-b")),
            SliceOf::AllNodes => slice(driver, None),
        }
    }
}

/// The daemon's account's requests with credentials of node-a, as (what it tries, operation,
/// new slice, old slice, whether the policy must let it through).
#[rustfmt::skip]
const DAEMON_REQUESTS: &[(&str, &str, SliceOf, SliceOf, bool)] = {
    use SliceOf::{AllNodes, Nothing, OtherNode, OwnNode};
    &[
        ("create a slice of its node",         "CREATE", OwnNode,   Nothing,   true),
        ("update a slice of its node",         "UPDATE", OwnNode,   OwnNode,   true),
        ("delete a slice of its node",         "DELETE", Nothing,   OwnNode,   true),
        ("create a slice of node-b",           "CREATE", OtherNode, Nothing,   false),
        ("update a slice of node-b",           "UPDATE", OtherNode, OtherNode, false),
        ("delete a slice of node-b",           "DELETE", Nothing,   OtherNode, false),
        ("move a slice of node-b to its node", "UPDATE", OwnNode,   OtherNode, false),
        ("move a slice of its node to node-b", "UPDATE", OtherNode, OwnNode,   false),
        ("create a slice for all nodes",       "CREATE", AllNodes,  Nothing,   false),
    ]
};

/// The requests every policy is tried on: what the daemon's account (`user`) on node-a does,
/// what it must not do, and another account's write.
pub(super) fn requests(user: &str, driver: &str) -> Vec<Request> {
    let own = || slice(driver, Some("node-a"));
    let other_driver = format!("x{driver}");
    let mut requests: Vec<Request> = DAEMON_REQUESTS
        .iter()
        .map(|&(what, operation, object, old, allowed)| Request {
            what: what.into(),
            operation,
            user: user.into(),
            node: Some("node-a"),
            object: object.slice(driver),
            old: old.slice(driver),
            allowed,
        })
        .collect();
    requests.extend([
        Request {
            what: format!("create a slice of driver {other_driver} on its node"),
            operation: "CREATE",
            user: user.into(),
            node: Some("node-a"),
            object: slice(&other_driver, Some("node-a")),
            old: Value::Null,
            allowed: false,
        },
        Request {
            what: "create a slice of its node with credentials that name no node".into(),
            operation: "CREATE",
            user: user.into(),
            node: None,
            object: own(),
            old: Value::Null,
            allowed: false,
        },
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
    ]);
    requests
}
