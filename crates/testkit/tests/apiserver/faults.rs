//! Fault injection: scripted failures, latency and request counts.

use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kubedev_testkit::apiserver::{ApiServer, Fault, Resource, Verb};

use super::{DRIVER, api_error, device, slice};

#[tokio::test]
async fn fault_injection_failures_latency_and_counts() {
    let server = ApiServer::start().await.expect("start");
    let slices: Api<ResourceSlice> = Api::all(server.client().expect("client"));

    server.fail_next(
        Verb::Create,
        Resource::ResourceSlices,
        1,
        Fault::InternalError,
    );
    let err = api_error(
        slices
            .create(
                &PostParams::default(),
                &slice("node-1", DRIVER, vec![device(0, false)]),
            )
            .await,
    );
    assert_eq!((err.code, err.reason.as_str()), (500, "InternalError"));
    assert!(server.objects(Resource::ResourceSlices).is_empty());
    let created = slices
        .create(
            &PostParams::default(),
            &slice("node-1", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("next create works");
    assert_eq!(
        server.request_count(Verb::Create, Resource::ResourceSlices),
        2
    );

    server.fail_next(Verb::Update, Resource::ResourceSlices, 2, Fault::Conflict);
    for _ in 0..2 {
        let err = api_error(
            slices
                .replace(&created.name_any(), &PostParams::default(), &created)
                .await,
        );
        assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    }
    slices
        .replace(&created.name_any(), &PostParams::default(), &created)
        .await
        .expect("third update works");
    // Faults match their verb and resource only.
    server.fail_next(Verb::Delete, Resource::Nodes, 1, Fault::InternalError);
    slices.get(&created.name_any()).await.expect("unaffected");
    server.clear_faults();

    server.set_latency(Duration::from_millis(300));
    let started = Instant::now();
    slices.get(&created.name_any()).await.expect("get");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "latency applies: {:?}",
        started.elapsed()
    );
    server.set_latency(Duration::ZERO);

    let counts = server.request_counts();
    assert_eq!(
        counts.get(&(Verb::Update, Resource::ResourceSlices)),
        Some(&3)
    );
    assert_eq!(counts.get(&(Verb::Get, Resource::ResourceSlices)), Some(&2));
    server.reset_request_counts();
    assert_eq!(server.request_count(Verb::Get, Resource::ResourceSlices), 0);
    server.shutdown().await;
}
