//! The pod resources client against the kubelet emulator's pod resources service.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use kubedev_kubelet_grpc::pod_resources::{Holding, PodResourcesClient, device_uses};
use kubedev_testkit::kubelet::PodResourcesEmulator;

#[tokio::test]
async fn list_get_and_allocatable_over_a_real_socket() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = PodResourcesEmulator::start(&dir.path().join("kubelet.sock")).unwrap();
    kubelet.assign_devices(
        "ml",
        "trainer",
        "main",
        "nvidia.com/gpu",
        &["gpu-0", "gpu-1"],
    );
    kubelet.assign_claim(
        "ml",
        "trainer",
        "sidecar",
        "nic",
        "net.example.com",
        &[("node-a", "vf-3")],
    );
    kubelet.add_pod("kube-system", "coredns", "coredns");
    kubelet.set_allocatable("nvidia.com/gpu", &["gpu-0", "gpu-1", "gpu-2"]);

    let mut client = PodResourcesClient::connect(kubelet.path(), Duration::from_secs(5))
        .await
        .unwrap();
    let pods = client.list().await.unwrap();
    assert_eq!(pods.len(), 2, "every pod is listed, with devices or not");
    let rows = device_uses(&pods);
    assert_eq!(rows.len(), 3);
    assert_eq!(
        (rows[0].pod.as_str(), rows[0].container.as_str()),
        ("trainer", "main")
    );
    assert!(matches!(
        &rows[2].holding,
        Holding::Dra { claim_name, driver, device, .. }
            if claim_name == "nic" && driver == "net.example.com" && device == "vf-3"
    ));

    let one = client.get("ml", "trainer").await.unwrap().unwrap();
    assert_eq!(one.containers.len(), 2);
    assert_eq!(client.get("ml", "nobody").await.unwrap(), None);

    let alloc = client.allocatable().await.unwrap();
    assert_eq!(alloc[0].device_ids, ["gpu-0", "gpu-1", "gpu-2"]);
    kubelet.stop().await;
}

#[tokio::test]
async fn a_missing_socket_is_an_error_naming_it() {
    let err = PodResourcesClient::connect(
        std::path::Path::new("/nonexistent/pod-resources/kubelet.sock"),
        Duration::from_millis(200),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("/nonexistent/pod-resources/kubelet.sock"),
        "{err}"
    );
}
