//! Process start → registered with the (emulated) kubelet, for the real `kubedev` binary.
#![allow(clippy::unwrap_used, missing_docs)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use kubedev_testkit::kubelet::KubeletEmulator;

fn startup(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dp = dir.path().join("dp");
    std::fs::create_dir_all(&dp).unwrap();
    let config = dir.path().join("kubedev.yaml");
    std::fs::write(
        &config,
        format!(
            "devicePlugin:\n  directory: {}\n  resources:\n    - name: example.com/dev\nbackends:\n  static:\n    pool: node\n    devices:\n      - name: dev-0\n      - name: dev-1\n",
            dp.display()
        ),
    )
    .unwrap();
    let kubelet = rt.block_on(KubeletEmulator::start(&dp)).unwrap();
    let mut registered = 0usize;
    let mut g = c.benchmark_group("daemon");
    g.sample_size(20);
    g.bench_function("exec_to_registered", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                let mut child = Command::new(env!("CARGO_BIN_EXE_kubedev"))
                    .args(["run", "--config"])
                    .arg(&config)
                    .env("RUST_LOG", "error")
                    .stdin(Stdio::null())
                    .spawn()
                    .unwrap();
                registered += 1;
                assert!(
                    rt.block_on(kubelet.wait_registrations(registered, Duration::from_secs(10)))
                );
                total += t.elapsed();
                child.kill().unwrap();
                child.wait().unwrap();
            }
            total
        })
    });
    g.finish();
}

criterion_group! {
    name = daemon;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = startup
}
criterion_main!(daemon);
