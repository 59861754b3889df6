//! GetPreferredAllocation through the daemon for 8 NVIDIA GPUs (a DGX A100 through the NVML
//! stand-in), with NUMA packing and with the NVLink-aware WebAssembly policy: the kubelet
//! emulator's call over the real socket, answer included; beside it the cheapest call
//! (GetDevicePluginOptions) on the same connection, the part that is transport.
//!
//! Each call is measured twice: with the scheduler placing the caller and the daemon freely,
//! and with both on one CPU. A synchronous call keeps one side busy at a time, so the second
//! is the work of both sides; the difference is what waking a thread on another CPU costs on
//! the machine (tens of µs in a VM whose idle CPUs halt).
#![allow(clippy::unwrap_used, missing_docs)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use kubedev::config::Config;
use kubedev::runtime::run;
use kubedev_kubelet_grpc::pb::deviceplugin::v1beta1 as api;
use kubedev_testkit::kubelet::KubeletEmulator;
use tokio_util::sync::CancellationToken;

#[path = "common/figures.rs"]
mod figures;

fn plugin(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/plugins/wasm")
        .join(format!("{name}.wasm"))
}

fn preferred(c: &mut Criterion) {
    // Logging on, as the daemon starts it (events at info and above), written nowhere.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::sink)
        .init();
    let mut idle = Vec::new();
    calls(c, "get_preferred_allocation_8_gpus", None, Some(&mut idle));
    figures::write("preferred", &idle);
    // The CPU this thread runs on now, for the caller, the daemon and every thread it starts.
    let here = rustix::thread::sched_getcpu();
    calls(
        c,
        "get_preferred_allocation_8_gpus_one_cpu",
        Some(here),
        None,
    );
}

/// How long the calls timed "after idle" wait, without any call, before each one.
const IDLE_GAP: Duration = Duration::from_millis(50);
/// How many calls are timed after idle, per row.
const IDLE_CALLS: usize = 60;

/// A report row for `call` made [`IDLE_CALLS`] times, each after [`IDLE_GAP`] without calls:
/// the median and the 90th percentile.
fn after_idle(what: &str, mut call: impl FnMut()) -> (String, String) {
    let times: Vec<Duration> = (0..IDLE_CALLS)
        .map(|_| {
            std::thread::sleep(IDLE_GAP);
            let started = Instant::now();
            call();
            started.elapsed()
        })
        .collect();
    let us = |p: f64| figures::percentile(times.clone(), p).as_secs_f64() * 1e6;
    (
        format!(
            "GetPreferredAllocation, 8 GPUs, each call after {} ms without calls, {what}",
            IDLE_GAP.as_millis()
        ),
        format!("{:.1} µs (p90 {:.1} µs)", us(0.5), us(0.9)),
    )
}

/// `cpu`'s set alone, for `sched_setaffinity`.
fn only(cpu: usize) -> rustix::thread::CpuSet {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    set
}

/// The group `group` of calls; with `cpu`, the caller and the daemon's threads stay on it.
/// With `idle`, each call is also timed after idle, a row each.
fn calls(
    c: &mut Criterion,
    group: &str,
    cpu: Option<usize>,
    mut idle: Option<&mut Vec<(String, String)>>,
) {
    let before = rustix::thread::sched_getaffinity(None).unwrap();
    if let Some(cpu) = cpu {
        // Every thread started from here on (the runtimes', the daemon's own) inherits it.
        rustix::thread::sched_setaffinity(None, &only(cpu)).unwrap();
    }
    // The daemon on its own runtime, as in its process; the caller on another, as the kubelet
    // is another process.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let caller = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group(group);
    for policy in [None, Some("nvlink-pack")] {
        let dir = tempfile::tempdir().unwrap();
        let dp = dir.path().join("dp");
        std::fs::create_dir_all(&dp).unwrap();
        let lib =
            nvml_mock::isolated_library(dir.path(), &nvml_mock::machine_path("dgx-a100"), None)
                .expect(
                    "build the NVML stand-in first: cargo build --release -p kubedev-nvml-mock",
                );
        let policy_line = policy
            .map(|p| {
                let path = plugin(p);
                assert!(path.exists(), "run `cargo xtask build-plugins` first");
                format!("      policy: {}\n", path.display())
            })
            .unwrap_or_default();
        let path = dir.path().join("kubedev.yaml");
        std::fs::write(
            &path,
            format!(
                "nodeName: node-a\nhostRoot: {r}\nstateDir: {r}/state\ndevicePlugin:\n  directory: {dp}\n  resources:\n    - name: nvidia.com/gpu\n{policy_line}backends:\n  nvidia:\n    libraryPath: {lib}\n",
                r = dir.path().display(),
                dp = dp.display(),
                lib = lib.display()
            ),
        )
        .unwrap();
        let cfg = Config::load(&path).unwrap();
        let kubelet = rt.block_on(KubeletEmulator::start(&dp)).unwrap();
        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        let task = rt.spawn(async move { run(cfg, &path, None, c2).await });
        rt.block_on(
            kubelet.wait_for("nvidia.com/gpu", Duration::from_secs(20), |r| {
                r.connected && r.capacity == 8
            }),
        )
        .unwrap();
        // One connection for every call, as the kubelet keeps.
        let endpoint = dp.join(kubelet.resource("nvidia.com/gpu").unwrap().endpoint);
        let mut client = caller.block_on(async {
            let channel =
                tonic::transport::Endpoint::from_shared(format!("unix://{}", endpoint.display()))
                    .unwrap()
                    .connect()
                    .await
                    .unwrap();
            api::device_plugin_client::DevicePluginClient::new(channel)
        });
        let request = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: (0..8).map(|i| format!("gpu-{i}")).collect(),
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        };
        if policy.is_none() {
            // The transport alone: the cheapest call on the same connection, so the cost of
            // choosing is the difference.
            g.bench_function("empty_call_same_connection", |b| {
                b.iter(|| {
                    caller
                        .block_on(client.get_device_plugin_options(api::Empty {}))
                        .unwrap()
                        .into_inner()
                })
            });
            if let Some(rows) = idle.as_deref_mut() {
                rows.push(after_idle("empty call", || {
                    caller
                        .block_on(client.get_device_plugin_options(api::Empty {}))
                        .unwrap();
                }));
            }
        }
        let mut prefer = || {
            let answer = caller
                .block_on(client.get_preferred_allocation(request.clone()))
                .unwrap()
                .into_inner();
            assert_eq!(answer.container_responses[0].device_i_ds.len(), 2);
            answer
        };
        let name = policy.unwrap_or("numa-packing");
        g.bench_function(name, |b| b.iter(&mut prefer));
        if let Some(rows) = idle.as_deref_mut() {
            rows.push(after_idle(name, || {
                prefer();
            }));
        }
        cancel.cancel();
        rt.block_on(task).unwrap().unwrap();
        rt.block_on(kubelet.stop());
    }
    g.finish();
    drop(rt);
    rustix::thread::sched_setaffinity(None, &before).unwrap();
}

criterion_group!(benches, preferred);
criterion_main!(benches);
