//! The API-server emulator driven through kube-rs, as kubedev's publisher and claim reader use it.
//!
//! The helpers that build slices and clients are here; the tests are grouped by topic in the
//! modules below.

mod claims;
mod crud;
mod faults;
mod patch;
mod validation;
mod watch;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kubedev_testkit::apiserver::ApiServer;

const DRIVER: &str = "gpu.kubedev.example.com";
const WAIT: Duration = Duration::from_secs(10);

fn device(i: usize, tainted: bool) -> Device {
    let mut attributes = BTreeMap::new();
    attributes.insert(
        "model".to_owned(),
        DeviceAttribute {
            string: Some("A100".to_owned()),
            ..Default::default()
        },
    );
    attributes.insert(
        "index".to_owned(),
        DeviceAttribute {
            int: Some(i as i64),
            ..Default::default()
        },
    );
    Device {
        name: format!("gpu-{i}"),
        attributes: Some(attributes),
        taints: tainted.then(|| {
            vec![DeviceTaint {
                key: "kubedev.example.com/unhealthy".to_owned(),
                effect: "NoSchedule".to_owned(),
                ..Default::default()
            }]
        }),
        ..Default::default()
    }
}

fn slice(node: &str, driver: &str, devices: Vec<Device>) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{node}-{driver}-")),
            labels: Some(BTreeMap::from([(
                "kubedev.example.com/node".to_owned(),
                node.to_owned(),
            )])),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.to_owned(),
            node_name: Some(node.to_owned()),
            pool: ResourcePool {
                name: node.to_owned(),
                generation: 0,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> Box<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn client_from_kubeconfig(server: &ApiServer) -> Client {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).expect("write kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("kubeconfig is usable");
    assert_eq!(config.default_namespace, "default");
    Client::try_from(config).expect("client")
}
