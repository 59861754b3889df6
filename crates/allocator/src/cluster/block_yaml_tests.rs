//! Tests of the block-style YAML rewriting: whatever it rewrites reads as the YAML reader
//! reads it, and what it cannot rewrite exactly is left to that reader.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::block_yaml::to_json;
use super::*;

/// The documents of `text` as the rewriting reads them, `None` where it leaves the text to
/// the YAML reader.
fn fast(text: &str) -> Option<Vec<Value>> {
    let docs = to_json(text)?;
    Some(
        docs.iter()
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
            .collect(),
    )
}

/// Whether the rewriting reads `text`; where it does, its documents are those the YAML
/// reader reads.
fn same_as_yaml_reader(text: &str) -> bool {
    let Some(docs) = fast(text) else {
        return false;
    };
    let expected: Vec<Value> = serde_saphyr::from_multiple(text)
        .unwrap_or_else(|e| panic!("rewritten, but the YAML reader refuses it: {e}\n{text}"));
    assert_eq!(docs, expected, "{text}");
    true
}

/// `text` is rewritten, as the YAML reader reads it.
fn rewritten(text: &str) {
    assert!(
        same_as_yaml_reader(text),
        "left to the YAML reader:\n{text}"
    );
}

/// `text` is left to the YAML reader.
fn left(text: &str) {
    assert!(fast(text).is_none(), "rewritten: {:?}\n{text}", fast(text));
}

#[test]
fn plain_values_are_typed_as_the_yaml_reader_types_them() {
    let certain = [
        "true",
        "false",
        "True",
        "FALSE",
        "yes",
        "No",
        "on",
        "OFF",
        "y",
        "N",
        "null",
        "Null",
        "NULL",
        "~",
        "0",
        "-0",
        "+0",
        "-1",
        "12",
        "+1",
        "1.5",
        "-0.5",
        "+2.5",
        "1e3",
        "1E3",
        "1e+3",
        "2.5e-3",
        "007",
        "-007",
        "00",
        ".5",
        "5.",
        "-.5",
        "18446744073709551615",
        "-9223372036854775808",
        "2026-11-28",
        "2026-11-28T10:00:00Z",
        "10Gi",
        "100m",
        "1.2.3",
        "1:30",
        "a:b",
        "x y",
        "value-1",
        "-foo",
        "+",
        "-a-",
        "inf",
        "nan",
        "Infinity",
        "1e",
        "e3",
        ".",
        "a#b",
        "http://x.example/a?b=c",
        "0.0",
        "yesno",
        "nulls",
        "ñ",
        "64",
        "512Gi",
        "v1.36.0",
        "kind://docker/kind/node-1",
        "0b0d6a3e-58c2",
        "0xgg",
        "--epochs=3",
        "-+x",
        "+-",
        "1_a",
        "123e4567-e89b-12d3",
    ];
    for v in certain {
        rewritten(&format!("k: {v}\n"));
        rewritten(&format!("- {v}\n- {v} # comment\n"));
    }
    let uncertain = [
        "1_000",
        "1_",
        "0x1F",
        "0o17",
        "0b11",
        ".inf",
        "-.inf",
        ".nan",
        ".NaN",
        "+.INF",
        "18446744073709551616",
        "-9223372036854775809",
        "1e999",
        "-+5",
        "--5",
        "+-1",
    ];
    for v in uncertain {
        left(&format!("k: {v}\n"));
    }
    assert_eq!(fast("k: 007\n").unwrap(), [json!({"k": 7.0})]);
    assert_eq!(fast("k: '007'\n").unwrap(), [json!({"k": "007"})]);
}

#[test]
fn quoted_values_and_keys_are_strings() {
    for text in [
        "k: '1.0'\n",
        "k: \"1.0\"\n",
        "k: 'it''s'\n",
        "k: ''\n",
        "k: \"\"\n",
        "k: \"a\\\"b\\\\c\\n\\td\\/e\\u00e9\\x41\\U0001F600\"\n",
        "k: \"true\" # quoted\n",
        "'quoted key': 1\n\"a: b\": 2\n'': empty\n",
        "\"escaped\\tkey\": v\n",
        "k: 'a # not a comment'\n",
        "k: \"#x\"\n",
    ] {
        rewritten(text);
    }
}

#[test]
fn block_collections_in_every_indentation_are_rewritten() {
    for text in [
        "a:\n  b:\n    c: 1\n  d: x\ne: y\n",
        "a:\n    b: 1\n    c:\n      - 1\n      - 2\n",
        "a:\n- 1\n- x\nb: 2\n",
        "a:\n  - b: 1\n    c: 2\n  - d: 3\n",
        "a:\n- b: 1\n  c:\n  - x\n  - y\n  e: 2\n- {}\n- []\n",
        "-   a: 1\n    b: 2\n-   c\n",
        "- - a\n  - - b\n    - c\n- -   d: 1\n      e: 2\n  - f\n",
        "- \n- ~\n-\n  - 1\n",
        "a:\nb: {}\nc: []\nd:\n",
        "  a: 1\n  b: 2\n",
        "- a\n- b\n",
        "a: {} # empty\nb: [] # empty\n",
        "a:\n  # a comment\n  b: 1 # after\n# at the start\n\n  c: 2\n",
        "key with spaces: v\nk.io/x-y_z: w\nf:spec: {}\n",
    ] {
        rewritten(text);
    }
}

#[test]
fn literal_block_scalars_are_rewritten_with_their_chomping() {
    for text in [
        "a: |\n  line 1\n  line 2\nb: 1\n",
        "a: |-\n  line 1\n\n  line 3\n\n\nb: 1\n",
        "a: |+\n  line 1\n\n\nb: 1\n",
        "a: |\n    indented\n      more\n    # not a comment\nb: 1\n",
        "a: |\n\n  after a blank line\n",
        "a: |\nb: 1\n",
        "a: |-\n",
        "a: |+\nb: 1\n",
        "a: |2\n   x\n  y\n",
        "a: |-1\n  x\n",
        "a:\n  b: |4+\n        x\n",
        "- |2\n    x\n- |1-\n  y\n",
        "- a: |2\n     x\n",
        "a: |+\n\n\n",
        "- |+\n\n  \n- x\n",
        "- |\n  x\n- |-\n  y\n",
        "a:\n- b: |\n    {\"json\": true}\n  c: 1\n",
        "a: | # comment\n  x\n  \n  y\n",
        "a: |\n  x\n     \n  y\n",
        "a: |\n  tab\there\n",
    ] {
        rewritten(text);
    }
}

#[test]
fn documents_are_rewritten_in_order() {
    for text in [
        "a: 1\n---\nb: 2\n",
        "---\na: 1\n---\nb: 2\n...\n",
        "--- # first\na: 1\n...\n---\nb: 2\n",
        "---\n---\na: 1\n",
        "---\na: 1\n---\n",
        "# only a comment\n",
        "",
        "---\n",
        "a: 1\n...\n",
    ] {
        rewritten(text);
    }
}

#[test]
fn text_outside_the_subset_is_left_to_the_yaml_reader() {
    for text in [
        "a: &x 1\nb: *x\n",
        "a: !!str 1\n",
        "a: {b: 1}\n",
        "a: [1, 2]\n",
        "a: >\n  folded\n",
        "a: plain\n  continued\n",
        "a: 'quoted\n  continued'\n",
        "a: \"quoted\n  continued\"\n",
        "a: 1\na: 2\n",
        "a: 1\n\"a\": 2\n",
        "? a\n: 1\n",
        "%YAML 1.2\n---\na: 1\n",
        "a:\n\tb: 1\n",
        "a: 1\r\n",
        "just a scalar\n",
        "<<: {}\n",
        "1: a\n",
        "true: a\n",
        "a: b: c\n",
        "a: \"\\q\"\n",
        "a:\n  b\n",
        "a:\n  - 1\n  b: 2\n",
        "a: 1\n...\nb: 2\n",
        "--- a: 1\n",
        "a: @x\n",
        "a: `x`\n",
        "a: |\n\n\n   \n  x\n",
    ] {
        left(text);
    }
    // A key repeated after many others is found too.
    let many: String = (0..100).map(|i| format!("k{i}: {i}\n")).collect();
    rewritten(&many);
    left(&format!("{many}k7: again\n"));
}

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

/// Whether the JSON reader reads `f` back exactly from its JSON text.
fn exact(f: &f64) -> bool {
    serde_json::from_str::<f64>(&Value::from(*f).to_string()).ok() == Some(*f)
}

/// Any JSON value: null, booleans, numbers, strings, lists and mappings.
fn any_value() -> impl Strategy<Value = Value> {
    let text = "[a-zA-Z0-9 :#'\"\\\\_./\\-\n\t{}\\[\\],&*!|>%@`?~é]{0,12}";
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Floats the JSON reader reads back exactly (others are left to the YAML reader).
        (-1e6..1e6f64)
            .prop_filter("read back exactly", exact)
            .prop_map(Value::from),
        any::<f64>()
            .prop_filter("read back exactly", exact)
            .prop_map(Value::from),
        text.prop_map(Value::from),
        prop::sample::select(vec![
            "true", "no", "null", "~", "", "007", "1e3", "1_000", "0x1F", ".inf", "1.5", "-0",
            "- a", "a: b", " x", "x ", "#c", "|", "---", "...", "a\n\nb\n", "\n",
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(text, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// What the YAML serializer prints for any mapping is rewritten, and reads back as the
    /// value printed.
    #[test]
    fn serialized_mappings_are_rewritten_as_printed(
        fields in prop::collection::btree_map("[a-z]{1,8}", any_value(), 1..6),
    ) {
        let value = Value::Object(fields.into_iter().collect());
        let text = serde_saphyr::to_string(&value).unwrap();
        let read_back: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        prop_assume!(read_back == [value.clone()]);
        prop_assert_eq!(fast(&text), Some(vec![value]), "{}", text);
    }
}
