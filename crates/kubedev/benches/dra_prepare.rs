//! DRA NodePrepareResources through the real kubelet plugin socket: a 1-device claim (checkpoint
//! twice, CDI spec, fsyncs) on tmpfs and on disk, 1000 claims in one call, and 1000 one-claim
//! calls 64 at a time (pods starting together) with each call's latency.
//!
//! "disk" is the deployed layout: the checkpoint in the kubelet's plugin directory on disk, CDI
//! specs in `/var/run/cdi` (tmpfs on systemd hosts, stood in for by `/dev/shm`); "all on disk"
//! puts the CDI specs on disk too. Throughput and latency percentiles go to
//! `target/bench-figures/dra_prepare.md` for `cargo xtask bench`'s report.
#![allow(clippy::unwrap_used, missing_docs)]

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

#[path = "common/figures.rs"]
mod figures;
use figures::percentile;

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
        let n: usize = claim
            .name
            .as_str()
            .trim_start_matches('c')
            .parse()
            .unwrap_or(0);
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
    _root: (tempfile::TempDir, tempfile::TempDir),
    cancel: CancellationToken,
    client: Client,
}

type Client = api::dra_plugin_client::DraPluginClient<tonic::transport::Channel>;

/// Where a daemon keeps its files: the checkpoint (plugin directory) and the CDI specs.
#[derive(Clone, Copy)]
struct Layout {
    label: &'static str,
    state: &'static str,
    cdi: &'static str,
}

const TMPFS: &str = "/dev/shm";
const DISK: &str = env!("CARGO_TARGET_TMPDIR");

const LAYOUTS: [Layout; 3] = [
    Layout {
        label: "tmpfs",
        state: TMPFS,
        cdi: TMPFS,
    },
    Layout {
        label: "disk",
        state: DISK,
        cdi: TMPFS,
    },
    Layout {
        label: "all_on_disk",
        state: DISK,
        cdi: DISK,
    },
];

async fn setup(layout: Layout) -> Setup {
    let root = tempfile::tempdir_in(layout.state).unwrap();
    let cdi = tempfile::tempdir_in(layout.cdi).unwrap();
    let r = root.path();
    std::fs::write(r.join("boot_id"), "0d3a-bench\n").unwrap();
    let devices: String = (0..DEVICES)
        .map(|i| format!("      - name: gpu-{i}\n        deviceNodes: [\"/dev/null\"]\n"))
        .collect();
    let path = r.join("kubedev.yaml");
    std::fs::write(
        &path,
        format!(
            "nodeName: node-a\ndra:\n  enabled: true\n  driverName: {DRIVER}\n  health: false\n  pluginDir: {r}/plugins\n  registryDir: {r}/registry\n  cdiDir: {cdi}\n  bootIdPath: {r}/boot_id\nbackends:\n  static:\n    pool: node-a\n    devices:\n{devices}",
            r = r.display(),
            cdi = cdi.path().display()
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
        _root: (root, cdi),
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

/// Prepares claim `n` alone in one call; returns how long the call took.
async fn prepare_one(client: &mut Client, n: usize) -> Duration {
    let t = Instant::now();
    let r = client
        .node_prepare_resources(api::NodePrepareResourcesRequest {
            claims: vec![claim(n)],
        })
        .await
        .unwrap()
        .into_inner();
    let took = t.elapsed();
    assert!(r.claims[&format!("uid-{n}")].error.is_empty());
    took
}

async fn prepare_unprepare(s: &mut Setup, n: usize) -> Duration {
    let took = prepare_one(&mut s.client, n).await;
    s.client
        .node_unprepare_resources(api::NodeUnprepareResourcesRequest {
            claims: vec![claim(n)],
        })
        .await
        .unwrap();
    took
}

/// `calls` one-claim prepares (claims `first..`), `in_flight` at a time, as pods starting
/// together send them: the wall time of them all and each call's latency. The claims are
/// unprepared afterwards, in one call.
async fn concurrent_prepares(
    s: &Setup,
    first: usize,
    calls: usize,
    in_flight: usize,
) -> (Duration, Vec<Duration>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let started = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for n in first..first + calls {
        let permit = permits.clone().acquire_owned().await.unwrap();
        let mut client = s.client.clone();
        running.spawn(async move {
            let took = prepare_one(&mut client, n).await;
            drop(permit);
            took
        });
    }
    let mut latencies = Vec::with_capacity(calls);
    while let Some(took) = running.join_next().await {
        latencies.push(took.unwrap());
    }
    let wall = started.elapsed();
    s.client
        .clone()
        .node_unprepare_resources(api::NodeUnprepareResourcesRequest {
            claims: (first..first + calls).map(claim).collect(),
        })
        .await
        .unwrap();
    (wall, latencies)
}

/// 1000 claims in one call (claims `first..`): its time; the claims are unprepared afterwards.
async fn one_call_of_1000(s: &mut Setup, first: usize) -> Duration {
    let claims: Vec<_> = (first..first + 1000).map(claim).collect();
    let t = Instant::now();
    let r = s
        .client
        .node_prepare_resources(api::NodePrepareResourcesRequest {
            claims: claims.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let took = t.elapsed();
    assert_eq!(r.claims.len(), 1000);
    assert!(r.claims.values().all(|c| c.error.is_empty()));
    s.client
        .node_unprepare_resources(api::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap();
    took
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut figures = Vec::new();
    let mut g = c.benchmark_group("dra");
    g.sample_size(30);
    let mut next = 0usize;
    for layout in LAYOUTS {
        let label = layout.label;
        let mut s = rt.block_on(setup(layout));
        let samples: Vec<Duration> = (0..300)
            .map(|n| rt.block_on(prepare_unprepare(&mut s, n)))
            .collect();
        figures.push((
            format!("DRA prepare, 1 claim per call, one call at a time, {label}: p50 / p99"),
            format!(
                "{} / {}",
                ms(percentile(samples.clone(), 0.5)),
                ms(percentile(samples, 0.99))
            ),
        ));
        next += 1000;
        g.bench_function(format!("prepare_1_device_{label}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    next += 1;
                    total += rt.block_on(prepare_unprepare(&mut s, next));
                }
                total
            })
        });
        // Pods starting together: 1000 one-claim calls, 64 in flight, three rounds.
        let mut walls = Vec::new();
        let mut latencies = Vec::new();
        for _ in 0..3 {
            next += 10_000;
            let (wall, mut l) = rt.block_on(concurrent_prepares(&s, next, 1000, 64));
            walls.push(wall);
            latencies.append(&mut l);
        }
        figures.push((
            format!("DRA prepare, 1000 one-claim calls 64 in flight, {label}: claims/s (median of 3 rounds); call p50 / p99"),
            format!(
                "{:.0}; {} / {}",
                1000.0 / percentile(walls, 0.5).as_secs_f64(),
                ms(percentile(latencies.clone(), 0.5)),
                ms(percentile(latencies, 0.99))
            ),
        ));
        if layout.label != "tmpfs" {
            // 1000 claims in one call, prepared concurrently (claims/s = 1000 / time).
            g.sample_size(10);
            let mut rounds = Vec::new();
            g.bench_function(format!("prepare_1000_claims_{label}"), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        next += 10_000;
                        let took = rt.block_on(one_call_of_1000(&mut s, next));
                        rounds.push(took);
                        total += took;
                    }
                    total
                })
            });
            g.sample_size(30);
            // Empty when a filter left the benchmark out.
            if !rounds.is_empty() {
                figures.push((
                    format!(
                        "DRA prepare, 1000 claims in one call, {label}: claims/s (median call)"
                    ),
                    format!("{:.0}", 1000.0 / percentile(rounds, 0.5).as_secs_f64()),
                ));
            }
        }
        s.cancel.cancel();
    }
    g.finish();
    // The figures criterion does not keep (throughput, percentiles).
    figures::write("dra_prepare", &figures);
}

criterion_group! {
    name = dra;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    targets = benches
}
criterion_main!(dra);
