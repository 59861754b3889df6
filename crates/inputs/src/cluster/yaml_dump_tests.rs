//! Tests of reading YAML dumps through their rewriting as JSON: the clusters read, and the
//! errors, are those the YAML reader gives.

use serde_json::Value;

use super::block_yaml_tests::rewritten;
use super::*;

/// A dump as `kubectl get resourceslices,deviceclasses,resourceclaims,nodes,pods -o yaml`
/// prints it: sequences at their key's column, `|` annotations, quoted quantities.
const KUBECTL_DUMP: &str = r#"apiVersion: v1
items:
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata:
    creationTimestamp: "2026-11-20T10:00:00Z"
    generation: 1
    managedFields:
    - apiVersion: resource.k8s.io/v1
      fieldsType: FieldsV1
      fieldsV1:
        f:spec:
          f:devices: {}
          f:driver: {}
      manager: kubedev
      operation: Apply
      time: "2026-11-20T10:00:00Z"
    name: node-1-gpus
    resourceVersion: "12345"
    uid: 0b0d6a3e-58c2-4a1f-9d0e-7c3b2f1e6a90
  spec:
    devices:
    - attributes:
        driverVersion:
          version: 1.2.3
        model:
          string: H200
        numa:
          int: 0
        virtual:
          bool: false
      capacity:
        memory:
          value: 141Gi
        cores:
          value: "132"
      name: gpu-0
    - attributes:
        model:
          string: 'H200 # 2'
      capacity:
        memory:
          value: 141Gi
      name: gpu-1
    driver: gpu.example.com
    nodeName: node-1
    pool:
      generation: 1
      name: node-1
      resourceSliceCount: 1
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata:
    annotations:
      kubectl.kubernetes.io/last-applied-configuration: |
        {"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"annotations":{},"name":"gpu"},"spec":{"selectors":[{"cel":{"expression":"device.driver == \"gpu.example.com\""}}]}}
    name: gpu
  spec:
    selectors:
    - cel:
        expression: device.driver == "gpu.example.com"
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaim
  metadata:
    name: trainer-gpus
    namespace: default
  spec:
    devices:
      requests:
      - exactly:
          count: 1
          deviceClassName: gpu
        name: gpus
  status:
    allocation:
      devices:
        results:
        - device: gpu-0
          driver: gpu.example.com
          pool: node-1
          request: gpus
- apiVersion: v1
  kind: Node
  metadata:
    labels:
      kubernetes.io/hostname: node-1
      topology.kubernetes.io/zone: zone-a
    annotations:
      node.alpha.kubernetes.io/ttl: "0"
    name: node-1
  status:
    capacity:
      cpu: "64"
      memory: 512Gi
    conditions:
    - message: kubelet is posting ready status
      reason: KubeletReady
      status: "True"
      type: Ready
- apiVersion: v1
  kind: Pod
  metadata:
    name: trainer
    namespace: default
  spec:
    containers:
    - args:
      - --epochs=3
      - "--name=a b"
      command: []
      image: trainer:v1
      name: main
      resources:
        claims:
        - name: gpus
    resourceClaims:
    - name: gpus
      resourceClaimTemplateName: trainer-gpus
kind: List
metadata:
  resourceVersion: ""
"#;

/// Reads `text` rewritten as JSON (which must be how it is read) and with the YAML reader:
/// the clusters read, or the errors, as text.
fn read_both(text: &str) -> (String, String) {
    assert!(read::fast_yaml(text).is_some(), "not rewritten:\n{text}");
    let mut c = Cluster::default();
    let fast = match c.add_text(text, "dump.yaml") {
        Ok(()) => format!("{c:?}"),
        Err(e) => e.to_string(),
    };
    let mut c = Cluster::default();
    let yaml = match c.add_yaml(text) {
        Ok(()) => format!("{c:?}"),
        Err(e) => format!("dump.yaml: {e}"),
    };
    (fast, yaml)
}

#[test]
fn a_kubectl_dump_is_rewritten_and_read_as_the_yaml_reader_reads_it() {
    rewritten(KUBECTL_DUMP);
    let (fast, yaml) = read_both(KUBECTL_DUMP);
    assert_eq!(fast, yaml);
    let c = read_cluster(KUBECTL_DUMP, "dump.yaml").unwrap();
    assert_eq!(c.slices[0].spec.devices.len(), 2);
    assert_eq!(c.classes[0].metadata.name, "gpu");
    assert_eq!(c.claims[0].1, ["gpu.example.com/node-1/gpu-0"]);
    assert_eq!(c.nodes[0].labels["topology.kubernetes.io/zone"], "zone-a");
    assert_eq!(c.pods.len(), 1);

    // The same objects as separate documents.
    let docs: Vec<Value> = serde_saphyr::from_str::<Value>(KUBECTL_DUMP).unwrap()["items"]
        .as_array()
        .unwrap()
        .clone();
    let separate: String = docs
        .iter()
        .map(|d| format!("---\n{}", serde_saphyr::to_string(d).unwrap()))
        .collect();
    rewritten(&separate);
    let (fast, yaml) = read_both(&separate);
    assert_eq!(fast, yaml);
}

#[test]
fn errors_in_a_rewritten_dump_are_worded_as_the_yaml_reader_words_them() {
    for (from, to) in [
        (
            "generation: 1\n      name: node-1",
            "generation: x\n      name: node-1",
        ),
        ("value: 141Gi\n        cores", "value: lots\n        cores"),
        ("count: 1", "count: -1"),
        ("- device: gpu-0", "- device: [gpu-0]"),
    ] {
        assert!(KUBECTL_DUMP.contains(from), "{from}");
        let bad = KUBECTL_DUMP.replacen(from, to, 1);
        if read::fast_yaml(&bad).is_none() {
            continue;
        }
        let (fast, yaml) = read_both(&bad);
        assert_eq!(fast, yaml);
    }
    let bad = KUBECTL_DUMP.replacen("generation: 1\n      name", "generation: x\n      name", 1);
    let e = read_cluster(&bad, "dump.yaml").unwrap_err().to_string();
    assert!(
        e.starts_with("dump.yaml: ResourceSlice node-1-gpus: spec.pool.generation"),
        "{e}"
    );
    // A key given twice is left to the YAML reader, which names it with its line.
    let twice = KUBECTL_DUMP.replacen(
        "    driver: gpu.example.com\n",
        "    driver: a\n    driver: b\n",
        1,
    );
    let e = read_cluster(&twice, "dump.yaml").unwrap_err().to_string();
    assert!(
        e.contains("line ") && e.contains("`driver` appears twice"),
        "{e}"
    );
}

#[test]
fn documents_of_unusual_shapes_are_read_as_the_yaml_reader_reads_them() {
    for text in [
        "kind: List\nitems: null\n",
        "kind: List\n",
        "kind: Node\nmetadata:\n  name: n2\nitems:\n- 1\n---\nitems: []\nkind: Node\nmetadata:\n  name: n3\n",
        "kind: ResourceSliceList\nitems:\n- kind: Node\n  metadata:\n    name: n1\n- null\n- 3\n",
        "kind: ~\nmetadata:\n  name: x\n",
    ] {
        let (fast, yaml) = read_both(text);
        assert_eq!(fast, yaml, "{text}");
    }
    // Shapes the JSON reading would read otherwise are left to the YAML reader.
    for text in ["kind: 5\n", "kind: List\nitems: 3\n", "- kind: Node\n"] {
        assert!(read::fast_yaml(text).is_none(), "{text}");
        assert!(read_cluster(text, "dump.yaml").is_ok(), "{text}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// A dump with a few characters inserted or removed anywhere: where it is still
    /// rewritten, it reads as the YAML reader reads it, and what the YAML reader refuses is
    /// never rewritten.
    #[test]
    fn damaged_dumps_are_rewritten_only_as_the_yaml_reader_reads_them(
        edits in proptest::collection::vec(
            (
                0..KUBECTL_DUMP.len(),
                0usize..3,
                proptest::sample::select(vec![
                    "", " ", "  ", "\n", "\n\n", "-", "- ", ":", ": ", "#", " #", "'", "\"",
                    "|", ">", "|-", "{", "}", "[", "]", "&a ", "*a", "!", "? ", "%", "...",
                    "---", "\t", "\\", "x", "0", "~", ",",
                ]),
            ),
            1..4,
        ),
    ) {
        let mut text = KUBECTL_DUMP.to_string();
        for (at, remove, insert) in edits {
            let at = at.min(text.len());
            let end = (at + remove).min(text.len());
            text.replace_range(at..end, insert);
        }
        super::block_yaml_tests::same_as_yaml_reader(&text);
    }
}
