//! Validation seen from a client: oversized slices refused, naming the field.

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, PostParams};
use kubedev_testkit::apiserver::{ApiServer, Resource};

use super::{DRIVER, api_error, device, slice};

#[tokio::test]
async fn validation_rejects_oversized_slices_naming_the_field() {
    let server = ApiServer::start().await.expect("start");
    let slices: Api<ResourceSlice> = Api::all(server.client().expect("client"));

    let full = slice(
        "node-1",
        DRIVER,
        (0..128).map(|i| device(i, false)).collect(),
    );
    slices
        .create(&PostParams::default(), &full)
        .await
        .expect("128 devices fit");
    let too_many = slice(
        "node-1",
        DRIVER,
        (0..129).map(|i| device(i, false)).collect(),
    );
    let err = api_error(slices.create(&PostParams::default(), &too_many).await);
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert!(
        err.message
            .contains("spec.devices: Too many: 129: must have at most 128 items"),
        "{}",
        err.message
    );
    let details = err.details.as_ref().expect("details");
    assert_eq!(details.causes[0].field, "spec.devices");
    assert_eq!(details.kind, "ResourceSlice");

    let tainted_ok = slice("node-2", DRIVER, (0..64).map(|i| device(i, true)).collect());
    slices
        .create(&PostParams::default(), &tainted_ok)
        .await
        .expect("64 tainted devices fit");
    let mut tainted = slice(
        "node-2",
        DRIVER,
        (0..64).map(|i| device(i, false)).collect(),
    );
    tainted
        .spec
        .devices
        .as_mut()
        .expect("devices")
        .push(device(64, true));
    let err = api_error(slices.create(&PostParams::default(), &tainted).await);
    assert_eq!(err.code, 422);
    assert!(
        err.message
            .contains("spec.devices: Too many: 65: must have at most 64 items"),
        "{}",
        err.message
    );

    let mut bad = slice(
        "node-3",
        "Bad_Driver",
        vec![device(0, false), device(0, false)],
    );
    bad.spec.all_nodes = Some(true);
    let err = api_error(slices.create(&PostParams::default(), &bad).await);
    for needle in [
        "spec.driver: Invalid value: \"Bad_Driver\"",
        "spec: Invalid value",
        "spec.devices[1]: Duplicate value: \"gpu-0\"",
    ] {
        assert!(
            err.message.contains(needle),
            "{needle} missing from {}",
            err.message
        );
    }
    assert_eq!(
        server.objects(Resource::ResourceSlices).len(),
        2,
        "rejected slices are not stored"
    );
    server.shutdown().await;
}
