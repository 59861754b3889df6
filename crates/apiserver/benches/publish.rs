//! Publishing 1000 devices as ResourceSlices against the API-server emulator (real HTTP on
//! loopback, watches included): the first publish (8 creates), a change to every device (8
//! updates at a new generation) and a publish that changes nothing.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use kubedev_apiserver::SlicePublisher;
use kubedev_core::{
    AttributeValue, Device, DeviceName, DriverName, Inventory, Pool, PoolName, Publisher,
    QualifiedName, Quantity,
};
use kubedev_testkit::apiserver::{ApiServer, Resource};
use serde_json::json;

const DEVICES: usize = 1000;
const WAIT: Duration = Duration::from_secs(60);

fn inventory(firmware: &str) -> Inventory {
    let devices = (0..DEVICES)
        .map(|i| {
            Device::new(DeviceName::new(format!("gpu-{i}")).unwrap())
                .with_attribute(
                    QualifiedName::new("firmware").unwrap(),
                    AttributeValue::string(firmware).unwrap(),
                )
                .with_attribute(
                    QualifiedName::new("index").unwrap(),
                    AttributeValue::Int(i as i64),
                )
                .with_capacity(
                    QualifiedName::new("memory").unwrap(),
                    Quantity::parse("80Gi").unwrap(),
                )
                .with_numa_node((i % 2) as i64)
        })
        .collect();
    Inventory::new(vec![Pool::new(PoolName::new("node-a").unwrap(), devices)])
}

async fn running() -> (ApiServer, SlicePublisher, kubedev_apiserver::PublisherTask) {
    let server = ApiServer::start().await.unwrap();
    server
        .put_raw(
            Resource::Nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
        )
        .unwrap();
    let publisher = SlicePublisher::new(
        server.client().unwrap(),
        DriverName::new("gpu.example.com").unwrap(),
        "node-a",
    )
    .unwrap()
    .with_rate_limit(0.0, 1);
    let task = publisher.start().unwrap();
    (server, publisher, task)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let first = inventory("1.0");
    let second = inventory("1.1");
    let mut group = c.benchmark_group("publish_1000_devices");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));

    group.bench_function("first_publish", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (server, publisher, task) = running().await;
                    let start = Instant::now();
                    publisher.publish(&first).await.unwrap();
                    publisher.wait_synced(WAIT).await.unwrap();
                    total += start.elapsed();
                    task.stop().await;
                    server.shutdown().await;
                }
                total
            })
        })
    });

    let (server, publisher, task) = rt.block_on(running());
    rt.block_on(async {
        publisher.publish(&first).await.unwrap();
        publisher.wait_synced(WAIT).await.unwrap();
    });
    let mut flip = false;
    group.bench_function("change_every_device", |b| {
        b.iter(|| {
            flip = !flip;
            let next = if flip { &second } else { &first };
            rt.block_on(async {
                publisher.publish(next).await.unwrap();
                publisher.wait_synced(WAIT).await.unwrap();
            })
        })
    });
    group.bench_function("unchanged", |b| {
        b.iter(|| {
            rt.block_on(async {
                publisher.publish(&first).await.unwrap();
                publisher.wait_synced(WAIT).await.unwrap();
            })
        })
    });
    group.finish();
    rt.block_on(async {
        task.stop().await;
        server.shutdown().await;
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
