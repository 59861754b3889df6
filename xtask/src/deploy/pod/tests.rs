use super::host_paths::host_path_of;
use super::*;
use serde_json::json;

#[test]
fn image_references_name_a_registry_and_a_valid_digest() {
    let digest = format!("sha256:{}", "0a".repeat(32));
    for good in [
        "ghcr.io/kubedev/kubedev:0.1.0".to_string(),
        format!("ghcr.io/kubedev/kubedev@{digest}"),
        "localhost:5000/kubedev:dev".to_string(),
        "localhost/kubedev:dev".to_string(),
    ] {
        assert_eq!(image_problems(&good), Vec::<String>::new(), "{good}");
    }
    for bad in [
        "kubedev/kubedev:0.1.0".to_string(),
        "kubedev:0.1.0".to_string(),
        "ghcr.io/kubedev/kubedev".to_string(),
        "ghcr.io/kubedev/kubedev@sha256:abc".to_string(),
        format!("ghcr.io/kubedev/kubedev@{}", digest.to_uppercase()),
    ] {
        assert_eq!(image_problems(&bad).len(), 1, "{bad}");
    }
}

#[test]
fn host_paths_are_followed_through_the_deepest_mount() {
    let pod = json!({
        "containers": [{"volumeMounts": [
            {"name": "root", "mountPath": "/host", "readOnly": true},
            {"name": "sys", "mountPath": "/host/sys"},
            {"name": "tmp", "mountPath": "/tmp"},
        ]}],
        "volumes": [
            {"name": "root", "hostPath": {"path": "/"}},
            {"name": "sys", "hostPath": {"path": "/sys/"}},
            {"name": "tmp", "emptyDir": {}},
        ],
    });
    assert_eq!(
        host_path_of(&pod, "/host/sys/bus/pci"),
        Some(("/sys/bus/pci".into(), true))
    );
    assert_eq!(
        host_path_of(&pod, "/host/dev"),
        Some(("/dev".into(), false))
    );
    assert_eq!(host_path_of(&pod, "/host"), Some(("/".into(), false)));
    assert_eq!(host_path_of(&pod, "/hostile"), None);
    assert_eq!(host_path_of(&pod, "/tmp/x"), None);
}
