//! Server-side apply and JSON patch, on DeviceClasses and Nodes.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceClassSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kubedev_testkit::apiserver::ApiServer;
use serde_json::json;

#[tokio::test]
async fn apply_json_patch_device_classes_and_nodes() {
    let server = ApiServer::start().await.expect("start");
    let client = server.client().expect("client");
    let classes: Api<DeviceClass> = Api::all(client.clone());

    let class = DeviceClass {
        metadata: ObjectMeta {
            name: Some("gpu.example.com".to_owned()),
            ..Default::default()
        },
        spec: Some(DeviceClassSpec::default()),
    };
    let applied = classes
        .patch(
            "gpu.example.com",
            &PatchParams::apply("kubedev-test"),
            &Patch::Apply(&class),
        )
        .await
        .expect("apply creates");
    assert!(applied.metadata.uid.is_some());
    let labelled = classes
        .patch(
            "gpu.example.com",
            &PatchParams::apply("kubedev-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu.example.com", "labels": {"vendor": "example"}},
            })),
        )
        .await
        .expect("apply updates");
    assert_eq!(
        labelled.labels().get("vendor").map(String::as_str),
        Some("example")
    );

    // kube's `Patch::Json` needs a feature kubedev does not enable; send the JSON patch directly.
    let ops = json!([{"op": "replace", "path": "/metadata/labels/vendor", "value": "other"}]);
    let request = axum::http::Request::builder()
        .method("PATCH")
        .uri("/apis/resource.k8s.io/v1/deviceclasses/gpu.example.com")
        .header("content-type", "application/json-patch+json")
        .body(serde_json::to_vec(&ops).expect("json"))
        .expect("request");
    let patched: DeviceClass = client.request(request).await.expect("json patch");
    assert_eq!(
        patched.labels().get("vendor").map(String::as_str),
        Some("other")
    );
    assert_eq!(
        classes
            .list(&ListParams::default().labels("vendor=other"))
            .await
            .expect("list")
            .items
            .len(),
        1
    );

    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some("node-1".to_owned()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("create node");
    assert!(node.metadata.uid.is_some());
    assert_eq!(
        nodes
            .list(&ListParams::default().fields("metadata.name=node-1"))
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    assert_eq!(client_version(&server).await, "1");
    server.shutdown().await;
}

async fn client_version(server: &ApiServer) -> String {
    server
        .client()
        .expect("client")
        .apiserver_version()
        .await
        .expect("version")
        .major
}
