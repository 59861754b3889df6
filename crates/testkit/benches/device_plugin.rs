//! Device-plugin latencies over real Unix sockets, kubedev-kubelet-grpc's plugin against the kubelet
//! emulator: Allocate, and a health change until the emulator sees it.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use kubedev_core::{ContainerEdits, DeviceNode, ExtendedResourceName, Health, PrepareError};
use kubedev_kubelet_grpc::device_plugin::{
    Allocation, DevicePlugin, DevicePluginConfig, DevicePluginHandler, PluginDevice,
};
use kubedev_kubelet_grpc::pb::deviceplugin::v1beta1 as api;
use kubedev_testkit::kubelet::KubeletEmulator;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const RESOURCE: &str = "example.com/dev";

struct Handler;

#[async_trait]
impl DevicePluginHandler for Handler {
    async fn allocate(&self, devices: &[PluginDevice]) -> Result<Allocation, PrepareError> {
        let mut edits = ContainerEdits::default();
        for d in devices {
            edits
                .device_nodes
                .push(DeviceNode::new(format!("/dev/{}", d.id), "rw"));
        }
        edits.env.insert("DEVS".into(), devices.len().to_string());
        Ok(Allocation {
            edits,
            cdi_devices: vec![],
        })
    }
}

/// The inventory device `name` of the pool `node-a`.
fn device_ref(name: &str) -> kubedev_core::DeviceRef {
    kubedev_core::DeviceRef::new(
        kubedev_core::PoolName::new("node-a").unwrap(),
        kubedev_core::DeviceName::new(name).unwrap(),
    )
}

fn devices(n: usize) -> Vec<PluginDevice> {
    (0..n)
        .map(|i| {
            PluginDevice::new(format!("dev-{i}"), device_ref(&format!("dev-{i}")))
                .with_numa_node(Some((i % 2) as i64))
        })
        .collect()
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (kubelet, tx, plugin) = rt.block_on(async {
        let kubelet = KubeletEmulator::start(dir.path()).await.unwrap();
        let (tx, rx) = watch::channel(devices(8));
        let cfg = DevicePluginConfig::new(ExtendedResourceName::new(RESOURCE).unwrap())
            .plugin_dir(dir.path());
        let plugin =
            DevicePlugin::start(cfg, Arc::new(Handler), rx, CancellationToken::new()).unwrap();
        assert!(plugin.wait_registered(Duration::from_secs(10)).await);
        kubelet
            .wait_for(RESOURCE, Duration::from_secs(10), |r| r.connected)
            .await
            .unwrap();
        (kubelet, tx, plugin)
    });
    let mut client = rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!(
            "unix://{}",
            plugin.socket_path().display()
        ))
        .unwrap()
        .connect()
        .await
        .unwrap();
        api::device_plugin_client::DevicePluginClient::new(ch)
    });

    let mut g = c.benchmark_group("device_plugin");
    g.bench_function("allocate_2_devices", |b| {
        b.iter(|| {
            rt.block_on(async {
                let req = api::AllocateRequest {
                    container_requests: vec![api::ContainerAllocateRequest {
                        devices_ids: vec!["dev-1".into(), "dev-3".into()],
                    }],
                };
                client.allocate(req).await.unwrap()
            })
        })
    });
    g.bench_function("health_change_seen_by_kubelet", |b| {
        let mut healthy = true;
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                healthy = !healthy;
                let want = if healthy { 8 } else { 7 };
                let t = Instant::now();
                tx.send_modify(|d| {
                    d[5].health = if healthy {
                        Health::healthy()
                    } else {
                        Health::unhealthy("bench")
                    }
                });
                rt.block_on(
                    kubelet.wait_for(RESOURCE, Duration::from_secs(5), |r| r.allocatable == want),
                )
                .unwrap();
                total += t.elapsed();
            }
            total
        })
    });
    g.finish();
    rt.block_on(plugin.stop());
}

criterion_group! {
    name = device_plugin;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = benches
}
criterion_main!(device_plugin);
