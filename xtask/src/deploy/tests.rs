use super::*;

#[test]
fn a_misspelt_field_is_reported() {
    let cm: Value = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "x", "labelz": {"a": "b"}},
        "data": {"k": "v"},
    });
    let lost = round_trip::<ConfigMap>(&cm).unwrap();
    assert_eq!(lost, vec!["metadata.labelz is not a field of this type"]);
}

#[test]
fn a_wrong_kind_does_not_parse() {
    let v: Value = serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {}});
    assert!(round_trip::<ConfigMap>(&v).is_err());
}

#[test]
fn objects_are_split_and_named() {
    let text = "---\n# Source: c/templates/a.yaml\napiVersion: v1\nkind: ConfigMap\n\
                metadata:\n  name: a\n  namespace: ns\n---\n# Source: c/templates/empty.yaml\n\
                ---\n# Source: c/templates/b.yaml\napiVersion: v1\nkind: ServiceAccount\n\
                metadata:\n  name: b\n";
    let objects = parse_objects(text).unwrap();
    let ids: Vec<_> = objects
        .iter()
        .map(|o| (o.source.as_str(), o.id.as_str()))
        .collect();
    assert_eq!(
        ids,
        vec![
            ("c/templates/a.yaml", "ConfigMap ns/a"),
            ("c/templates/b.yaml", "ServiceAccount b")
        ]
    );
}

/// Asserts that some problem contains `wanted`.
#[track_caller]
pub(super) fn assert_found(problems: &[String], wanted: &str) {
    assert!(
        problems.iter().any(|p| p.contains(wanted)),
        "no problem says {wanted:?}: {problems:#?}"
    );
}
