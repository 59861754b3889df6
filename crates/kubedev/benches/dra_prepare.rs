//! DRA NodePrepareResources through the real kubelet plugin socket: a 1-device claim (checkpoint
//! twice, CDI spec, fsyncs) on tmpfs and on disk, and 1000 claims in one call.
#![allow(clippy::unwrap_used, missing_docs)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use kubedev::config::Config;
use kubedev::dra_driver::ClaimSource;
use kubedev::runtime::{ClusterServices, run};
use kubedev_core::{
    AllocatedDevice, ClaimRef, DeviceName, DeviceRef, Inventory, PoolName, PublishError, Publisher,
};
use kubedev_kubelet_grpc::pb::dra::v1 as api;
use kubedev_testkit::kubelet::DraKubelet;
use tokio_util::sync::CancellationToken;

const DRIVER: &str = "gpu.example.com";

/// How many devices the node has: enough for the 1000 claims of one call to get one each (a
/// device that does not allow multiple allocations is prepared for one claim at a time).
const DEVICES: usize = 1024;

/// Every claim gets device `gpu-<n % DEVICES>`.
struct Claims;

#[async_trait]
impl ClaimSource for Claims {
    async fn allocated_devices(
        &self,
        claim: &ClaimRef,
    ) -> Result<Vec<AllocatedDevice>, kubedev_kubelet_grpc::dra::ClaimError> {
        let n: usize = claim.name.trim_start_matches('c').parse().unwrap_or(0);
        Ok(vec![
            AllocatedDevice::new(DeviceRef::new(
                PoolName::new("node-a").unwrap(),
                DeviceName::new(format!("gpu-{}", n % DEVICES)).unwrap(),
            ))
            .with_request("gpu"),
        ])
    }
}

struct NoSlices;

#[async_trait]
impl Publisher for NoSlices {
    async fn publish(&self, _: &Inventory) -> Result<(), PublishError> {
        Ok(())
    }
}

struct Setup {
    _root: tempfile::TempDir,
    cancel: CancellationToken,
    client: api::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
}

async fn setup(base: &Path) -> Setup {
    let root = tempfile::tempdir_in(base).unwrap();
    let r = root.path();
    std::fs::write(r.join("boot_id"), "0d3a-bench\n").unwrap();
    let devices: String = (0..DEVICES)
        .map(|i| format!("      - name: gpu-{i}\n        deviceNodes: [\"/dev/null\"]\n"))
        .collect();
    let path = r.join("kubedev.yaml");
    std::fs::write(
        &path,
        format!(
            "nodeName: node-a\ndra:\n  enabled: true\n  driverName: {DRIVER}\n  health: false\n  pluginDir: {r}/plugins\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  bootIdPath: {r}/boot_id\nbackends:\n  static:\n    pool: node-a\n    devices:\n{devices}",
            r = r.display()
        ),
    )
    .unwrap();
    let cfg = Config::load(&path).unwrap();
    let kubelet = DraKubelet::start(r.join("registry")).unwrap();
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let cluster = ClusterServices {
        claims: Arc::new(Claims),
        slices: Arc::new(NoSlices),
        events: None,
        api: None,
    };
    tokio::spawn(async move { run(cfg, &path, Some(cluster), c).await.unwrap() });
    assert!(
        kubelet
            .wait_until(Duration::from_secs(10), |k| k
                .drivers()
                .contains_key(DRIVER))
            .await
    );
    let endpoint = kubelet.drivers()[DRIVER].endpoint.clone();
    kubelet.stop().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{endpoint}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Setup {
        _root: root,
        cancel,
        client: api::dra_plugin_client::DraPluginClient::new(channel),
    }
}

fn claim(n: usize) -> api::Claim {
    api::Claim {
        namespace: "bench".into(),
        uid: format!("uid-{n}"),
        name: format!("c{n}"),
    }
}

async fn prepare_unprepare(s: &mut Setup, n: usize) -> Duration {
    let t = Instant::now();
    let r = s
        .client
        .node_prepare_resources(api::NodePrepareResourcesRequest {
            claims: vec![claim(n)],
        })
        .await
        .unwrap()
        .into_inner();
    let took = t.elapsed();
    assert!(r.claims[&format!("uid-{n}")].error.is_empty());
    s.client
        .node_unprepare_resources(api::NodeUnprepareResourcesRequest {
            claims: vec![claim(n)],
        })
        .await
        .unwrap();
    took
}

fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("dra");
    g.sample_size(30);
    for (label, base) in [("tmpfs", "/dev/shm"), ("disk", env!("CARGO_TARGET_TMPDIR"))] {
        if !Path::new(base).is_dir() {
            continue;
        }
        let mut s = rt.block_on(setup(Path::new(base)));
        // p50 / p99 over a fixed number of calls, printed for the record.
        let samples: Vec<Duration> = (0..300)
            .map(|n| rt.block_on(prepare_unprepare(&mut s, n)))
            .collect();
        eprintln!(
            "dra/prepare_1_device_{label}: p50 {:?}, p99 {:?} over {} calls",
            percentile(samples.clone(), 0.5),
            percentile(samples, 0.99),
            300
        );
        let mut n = 1000;
        g.bench_function(format!("prepare_1_device_{label}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    n += 1;
                    total += rt.block_on(prepare_unprepare(&mut s, n));
                }
                total
            })
        });
        s.cancel.cancel();
    }
    // 1000 claims in one call, prepared concurrently (claims/s = 1000 / time).
    let mut s = rt.block_on(setup(Path::new(env!("CARGO_TARGET_TMPDIR"))));
    let mut round = 0usize;
    g.sample_size(10);
    g.bench_function("prepare_1000_claims_disk", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                round += 1;
                let claims: Vec<_> = (0..1000).map(|i| claim(round * 10_000 + i)).collect();
                let t = Instant::now();
                let r =
                    rt.block_on(s.client.node_prepare_resources(
                        api::NodePrepareResourcesRequest {
                            claims: claims.clone(),
                        },
                    ))
                    .unwrap()
                    .into_inner();
                total += t.elapsed();
                assert_eq!(r.claims.len(), 1000);
                assert!(r.claims.values().all(|c| c.error.is_empty()));
                rt.block_on(
                    s.client
                        .node_unprepare_resources(api::NodeUnprepareResourcesRequest { claims }),
                )
                .unwrap();
            }
            total
        })
    });
    s.cancel.cancel();
    g.finish();
}

criterion_group! {
    name = dra;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    targets = benches
}
criterion_main!(dra);
