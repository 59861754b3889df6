//! Tests of reading dumps and explaining a cluster.

use super::*;

#[test]
fn fields_of_newer_releases_are_ignored_and_real_errors_named() {
    let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: s1, resourceVersion: "7", managedFields: [{manager: x}]}
  spec:
    driver: d
    nodeName: n1
    pool: {name: p, generation: 1, resourceSliceCount: 1}
    someFutureField: {a: 1}
    devices:
    - name: g0
      futureDeviceField: true
      attributes: {model: {string: m}}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: ignored}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns}
spec:
  resourceClaims: [{name: gpus, resourceClaimTemplateName: t}]
"#;
    let c = read_cluster(text, "dump.yaml").unwrap();
    assert_eq!(c.slices.len(), 1);
    assert_eq!(c.slices[0].spec.devices[0].name, "g0");
    let e = c.explain(&Subject::Pod("ns/p".into())).unwrap_err();
    assert!(e.contains("is not created yet"), "{e}");

    let bad = "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s2}\nspec: {driver: d, pool: {name: p, generation: x}}\n";
    let e = read_cluster(bad, "dump.yaml").unwrap_err().to_string();
    assert!(
        e.starts_with("dump.yaml: ResourceSlice s2: spec.pool.generation"),
        "{e}"
    );
}

/// A YAML document: node `node`'s slice of driver nic.example.com with `devices` (YAML
/// list items, indented for the slice's `devices:`).
fn nic_slice(node: &str, devices: &str) -> String {
    format!(
        "---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: {node}-nics}}
spec:
  driver: nic.example.com
  nodeName: {node}
  pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}
  devices:
{devices}"
    )
}

/// The fitting of every node, in the answer's order.
fn fits(answer: &ClusterAnswer) -> Vec<(&str, bool)> {
    answer
        .nodes
        .iter()
        .map(|n| (n.node.as_str(), n.fits))
        .collect()
}

fn shared_nic_cluster(taken: &str) -> String {
    let mut text = String::new();
    for n in ["n1", "n2"] {
        text.push_str(&nic_slice(
            n,
            "  - name: nic0
    allowMultipleAllocations: true
    capacity: {bandwidth: {value: 10G}}
",
        ));
    }
    text.push_str(&format!(
        "---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: nic}}
spec: {{selectors: [{{cel: {{expression: 'device.driver == \"nic.example.com\"'}}}}]}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: other, namespace: default}}
spec:
  devices:
    requests: [{{name: net, exactly: {{deviceClassName: nic, capacity: {{requests: {{bandwidth: {taken}}}}}}}}}]
status:
  allocation:
    devices:
      results:
      - {{request: net, driver: nic.example.com, pool: n1, device: nic0, shareID: 1a2b, consumedCapacity: {{bandwidth: {taken}}}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: mine, namespace: default}}
spec:
  devices:
    requests: [{{name: net, exactly: {{deviceClassName: nic, capacity: {{requests: {{bandwidth: 4G}}}}}}}}]
"
    ));
    text
}

/// Capacity other claims consumed from a shared device counts against new requests.
#[test]
fn capacity_consumed_by_other_claims_is_taken() {
    let mine = Subject::Claim("default/mine".into());
    let c = read_cluster(&shared_nic_cluster("8G"), "dump.yaml").unwrap();
    assert_eq!(c.consumed.len(), 1);
    let answer = c.explain(&mine).unwrap();
    assert_eq!(fits(&answer), [("n2", true), ("n1", false)], "{answer:?}");

    // With less taken, the shared device still has room on n1.
    let c = read_cluster(&shared_nic_cluster("6G"), "dump.yaml").unwrap();
    let answer = c.explain(&mine).unwrap();
    assert!(answer.nodes.iter().all(|n| n.fits), "{answer:?}");

    let e = read_cluster(&shared_nic_cluster("lots"), "dump.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ResourceClaim default/other: status.allocation.devices.results[0].consumedCapacity.bandwidth"),
        "{e}"
    );
}

/// A cluster where claim `other` holds `n1`'s nic0 through `result` (a YAML flow mapping's
/// extra fields), and claim `mine` asks for one whole nic.
fn held_nic_cluster(nic0: &str, result: &str) -> String {
    let mut text = String::new();
    for n in ["n1", "n2"] {
        text.push_str(&nic_slice(n, &format!("  - name: nic0\n{nic0}")));
    }
    text.push_str(&format!(
        "---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: nic}}
spec: {{selectors: [{{cel: {{expression: 'device.driver == \"nic.example.com\"'}}}}]}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: other, namespace: default}}
spec:
  devices:
    requests: [{{name: net, exactly: {{deviceClassName: nic}}}}]
status:
  allocation:
    devices:
      results:
      - {{request: net, driver: nic.example.com, pool: n1, device: nic0{result}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: mine, namespace: default}}
spec:
  devices:
    requests: [{{name: net, exactly: {{deviceClassName: nic}}}}]
"
    ));
    text
}

/// Devices other claims hold count as the scheduler counts them: a result with admin access
/// leaves its device to others, an exclusive result does not, and a share of a device that no
/// longer allows multiple allocations keeps it from being taken whole.
#[test]
fn held_devices_count_as_the_scheduler_counts_them() {
    let mine = Subject::Claim("default/mine".into());
    let answer = |nic0: &str, result: &str| {
        let c = read_cluster(&held_nic_cluster(nic0, result), "dump.yaml").unwrap();
        let a = c.explain(&mine).unwrap();
        (c, a)
    };
    let (c, a) = answer("", "");
    assert_eq!(c.in_use, ["nic.example.com/n1/nic0"]);
    assert_eq!(fits(&a), [("n2", true), ("n1", false)], "{a:?}");

    let (c, a) = answer("", ", adminAccess: true");
    assert!(c.in_use.is_empty() && c.consumed.is_empty(), "{c:?}");
    assert!(a.nodes.iter().all(|n| n.fits), "{a:?}");

    // A share with no consumed capacity is still a share: a further one fits, the whole
    // device does not once it no longer allows multiple allocations.
    let (c, a) = answer("    allowMultipleAllocations: true\n", ", shareID: 1a2b");
    assert!(c.in_use.is_empty(), "{c:?}");
    assert_eq!(c.consumed.len(), 1);
    assert!(c.consumed[0].capacity.is_empty());
    assert!(a.nodes.iter().all(|n| n.fits), "{a:?}");
    let (_, a) = answer("", ", shareID: 1a2b");
    assert_eq!(fits(&a), [("n2", true), ("n1", false)], "{a:?}");
}

/// A DeviceTaintRule taints the devices it selects as the scheduler sees them: the node
/// whose pool it selects no longer fits a claim without a toleration, and the explanation
/// names the taint.
#[test]
fn device_taint_rules_taint_the_devices_they_select() {
    let mine = Subject::Claim("default/mine".into());
    let rule = "---
apiVersion: resource.k8s.io/v1
kind: DeviceTaintRule
metadata: {name: n1-maintenance}
spec:
  deviceSelector: {driver: nic.example.com, pool: n1}
  taint: {key: maintenance, value: planned, effect: NoSchedule}
";
    let c = read_cluster(
        &(held_nic_cluster("", ", adminAccess: true") + rule),
        "dump.yaml",
    )
    .unwrap();
    assert_eq!(c.taint_rules.len(), 1);
    let a = c.explain(&mine).unwrap();
    assert_eq!(fits(&a), [("n2", true), ("n1", false)], "{a:?}");
    let n1 = format!("{:?}", a.nodes[1]);
    assert!(n1.contains("1 tainted"), "{n1}");
}

/// A JSON List dump is read straight into the allocator's types, and gives exactly what
/// the lenient path gives; objects the strict types refuse still go the lenient way.
#[test]
fn json_dumps_read_as_the_lenient_path_reads_them() {
    let yaml = shared_nic_cluster("8G")
        + "---
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {zone: a}, resourceVersion: '3'}
status: {conditions: [{type: Ready, status: 'True'}]}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: future}
spec:
  driver: nic.example.com
  nodeName: n3
  pool: {name: n3, generation: 1, resourceSliceCount: 1}
  someFutureField: 1
  devices: [{name: nic0}]
---
apiVersion: resource.k8s.io/v1
kind: DeviceTaintRule
metadata: {name: n3-maintenance}
spec:
  deviceSelector: {driver: nic.example.com, pool: n3}
  taint: {key: maintenance, effect: NoSchedule, timeAdded: '2026-12-01T10:00:00Z'}
status: {conditions: []}
";
    let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
    let json = read_cluster(&list.to_string(), "dump.json").unwrap();
    let lenient = read_cluster(&yaml, "dump.yaml").unwrap();
    assert_eq!(format!("{json:?}"), format!("{lenient:?}"));
    assert_eq!(json.slices.len(), 3);
    assert_eq!(json.nodes[0].labels["zone"], "a");
    assert_eq!(json.consumed[0].device, "nic.example.com/n1/nic0");
    assert_eq!(json.taint_rules.len(), 1);

    // A real error in JSON is named as in YAML.
    let bad = serde_json::json!({"kind": "List", "items": [{"apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice", "metadata": {"name": "s2"},
        "spec": {"driver": "d", "pool": {"name": "p", "generation": "x"}}}]});
    let e = read_cluster(&bad.to_string(), "dump.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("dump.json: ResourceSlice s2: spec.pool.generation"),
        "{e}"
    );
}

/// A dump whose slices carry list-type attributes comes from a server with
/// DRAListTypeAttributes on, so explain compares them as sets.
#[test]
fn list_type_attributes_in_a_dump_are_compared_as_sets() {
    let mut text = String::new();
    for (node, a, b) in [("n1", "[v1, v2]", "[v3]"), ("n2", "[v1, v2]", "[v2, v3]")] {
        text.push_str(&nic_slice(
            node,
            &format!(
                "  - {{name: nic0, attributes: {{networks: {{strings: {a}}}}}}}
  - {{name: nic1, attributes: {{networks: {{strings: {b}}}}}}}
"
            ),
        ));
    }
    text.push_str(
        "---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: nic}
spec: {selectors: [{cel: {expression: 'device.attributes[\"nic.example.com\"].networks.includes(\"v2\") || device.attributes[\"nic.example.com\"].networks.includes(\"v3\")'}}]}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: pair, namespace: default}
spec:
  devices:
    requests: [{name: nics, exactly: {deviceClassName: nic, count: 2}}]
    constraints: [{matchAttribute: nic.example.com/networks}]
",
    );
    let c = read_cluster(&text, "dump.yaml").unwrap();
    let answer = c.explain(&Subject::Claim("default/pair".into())).unwrap();
    assert_eq!(fits(&answer), [("n2", true), ("n1", false)], "{answer:?}");
}

/// A dump whose slices skip node operations comes from a server with
/// DRAOptionalNodeOperations on: their devices fit only nodes that declare the feature, and
/// the others say why.
#[test]
fn devices_that_skip_node_operations_fit_nodes_that_declare_it() {
    let mut text = String::new();
    for (node, declared) in [("n1", "[]"), ("n2", "[DRAOptionalNodeOperations]")] {
        text.push_str(&format!(
            "---
apiVersion: v1
kind: Node
metadata: {{name: {node}}}
status: {{declaredFeatures: {declared}}}
"
        ));
        text.push_str(
            &nic_slice(node, "  - {name: nic0}\n")
                .replace("  devices:", "  skipNodeOperations: ['*']\n  devices:"),
        );
    }
    text.push_str(
        "---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: nic}
spec: {}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: one, namespace: default}
spec:
  devices:
    requests: [{name: nic, exactly: {deviceClassName: nic}}]
",
    );
    let c = read_cluster(&text, "dump.yaml").unwrap();
    let answer = c.explain(&Subject::Claim("default/one".into())).unwrap();
    assert_eq!(fits(&answer), [("n2", true), ("n1", false)], "{answer:?}");
    let n1 = answer.nodes.iter().find(|n| n.node == "n1").unwrap();
    assert!(
        n1.reasons
            .iter()
            .any(|r| r.contains("skips node operations the node does not")),
        "{:?}",
        n1.reasons
    );
}

/// kubectl prints a List's keys sorted, `items` before `kind`: the items are read one by one,
/// a bad item is named as before, and a document that has `items` without being a List is
/// read as the object it is.
#[test]
fn a_yaml_list_in_kubectl_order_is_read_item_by_item() {
    let text = "apiVersion: v1
items:
- apiVersion: v1
  kind: Node
  metadata: {name: n1, labels: {zone: a}, uid: u1}
  status: {capacity: {cpu: '8'}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: s1, resourceVersion: '9'}
  spec: {driver: d, nodeName: n1, pool: {name: p, generation: 1, resourceSliceCount: 1}, devices: [{name: g0}]}
kind: List
metadata: {resourceVersion: ''}
";
    let c = read_cluster(text, "dump.yaml").unwrap();
    assert_eq!(c.nodes[0].name, "n1");
    assert_eq!(c.nodes[0].labels["zone"], "a");
    assert_eq!(c.slices[0].spec.devices[0].name, "g0");

    let bad = text.replace("generation: 1", "generation: x");
    let e = read_cluster(&bad, "dump.yaml").unwrap_err().to_string();
    assert!(
        e.starts_with("dump.yaml: ResourceSlice s1: spec.pool.generation"),
        "{e}"
    );

    let odd = "kind: Node\nmetadata: {name: n2}\nitems: [1]\n---\nitems: []\nkind: Node\nmetadata: {name: n3}\n";
    let c = read_cluster(odd, "dump.yaml").unwrap();
    let names: Vec<&str> = c.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["n2", "n3"]);
}

/// The items of a JSON List (as JSON texts) with `nodes` nodes and a one-GPU slice each, the
/// GPUs of the even nodes held by claims, a class and a pending claim `default/want` for one
/// GPU. Every seventh slice names its kind last, and every eleventh carries a field of a newer
/// release, as objects the one-pass and strict readings leave to the others.
fn large_list_items(nodes: usize) -> Vec<String> {
    let mut items = Vec::new();
    for i in 0..nodes {
        items.push(format!(
            r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"n{i}","labels":{{"zone":"z{}"}}}},"status":{{"capacity":{{"cpu":"8"}}}}}}"#,
            i % 3
        ));
    }
    for i in 0..nodes {
        let spec = format!(
            r#"{{"driver":"gpu.example.com","nodeName":"n{i}","pool":{{"name":"n{i}","generation":1,"resourceSliceCount":1}},"devices":[{{"name":"gpu0","attributes":{{"index":{{"int":{i}}}}}}}]{}}}"#,
            if i % 11 == 0 {
                r#","futureField":1"#
            } else {
                ""
            }
        );
        let meta = format!(r#"{{"name":"s{i}","uid":"u{i}"}}"#);
        items.push(if i % 7 == 0 {
            format!(r#"{{"metadata":{meta},"spec":{spec},"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice"}}"#)
        } else {
            format!(r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{meta},"spec":{spec}}}"#)
        });
    }
    items.push(r#"{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"gpu"},"spec":{"selectors":[{"cel":{"expression":"device.driver == \"gpu.example.com\""}}]}}"#.to_string());
    for i in (0..nodes).step_by(2) {
        items.push(format!(
            r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{{"name":"held-{i}","namespace":"default"}},"spec":{{"devices":{{"requests":[{{"name":"gpu","exactly":{{"deviceClassName":"gpu"}}}}]}}}},"status":{{"allocation":{{"devices":{{"results":[{{"request":"gpu","driver":"gpu.example.com","pool":"n{i}","device":"gpu0"}}]}}}}}}}}"#
        ));
    }
    items.push(r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"want","namespace":"default"},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu"}}]}}}"#.to_string());
    items
}

fn json_list(items: &[String]) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
        items.join(",")
    )
}

/// A large List, read a block of items at a time on every core (found as the text is read,
/// for a List of a megabyte or more), gives the objects in the dump's order, exactly as
/// reading its items one at a time does, and every node's answer in the nodes' order (those
/// that fit first).
#[test]
fn a_large_list_reads_and_answers_as_its_items_one_by_one() {
    for nodes in [300, 2_500] {
        let items = large_list_items(nodes);
        let c = read_cluster(&json_list(&items), "dump.json").unwrap();
        let mut one_by_one = Cluster::default();
        for item in &items {
            one_by_one.add_text(item, "item.json").unwrap();
        }
        assert_eq!(format!("{c:?}"), format!("{one_by_one:?}"));
        assert_eq!(c.nodes.len(), nodes);
        assert_eq!(c.slices[7].metadata.name, "s7");
        assert_eq!(c.claims.len(), nodes / 2 + 1);

        let answer = c.explain(&Subject::Claim("default/want".into())).unwrap();
        let expected: Vec<(String, bool)> = (1..nodes)
            .step_by(2)
            .map(|i| (format!("n{i}"), true))
            .chain((0..nodes).step_by(2).map(|i| (format!("n{i}"), false)))
            .collect();
        let got: Vec<(String, bool)> = fits(&answer)
            .into_iter()
            .map(|(n, f)| (n.to_string(), f))
            .collect();
        assert_eq!(got, expected);
        assert_eq!(
            answer.nodes[nodes / 2].reasons,
            [
                "claim default/want request gpu: 1 devices, 1 in use, 0 usable, 1 wanted; needs 1 devices, 0 usable"
            ]
        );
    }
}

/// In a large List with several bad objects, the error names the first of them, as when the
/// items are read one after the other.
#[test]
fn the_first_bad_object_of_a_large_list_is_the_error() {
    for nodes in [300, 2_500] {
        let mut items = large_list_items(nodes);
        for at in [nodes + 120, nodes + 10, nodes + 290] {
            items[at] = items[at].replace(r#""generation":1"#, r#""generation":"x""#);
        }
        let e = read_cluster(&json_list(&items), "dump.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("dump.json: ResourceSlice s10: spec.pool.generation"),
            "{e}"
        );
    }
}
