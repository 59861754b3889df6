//! Discovery of an 8-GPU DGX A100 through nvml-wrapper and the NVML mock
//! (`cargo build -p kubedev-nvml-mock` first): every GPU, its topology, and with the
//! partitionable strategy the MIG profiles, placements and instances of the MIG-enabled GPUs.
#![allow(clippy::unwrap_used, missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use kubedev_core::{BackendContext, DeviceSource};
use kubedev_nvidia::{MigStrategy, NvidiaBackend, NvidiaConfig};

fn discovery(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let library =
        nvml_mock::isolated_library(dir.path(), &nvml_mock::machine_path("dgx-a100"), None)
            .expect("the mock library: run `cargo build -p kubedev-nvml-mock` first");
    let ctx = BackendContext::new(
        kubedev_core::HostFs::new(dir.path().join("host")),
        dir.path().join("state"),
        "node-a",
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("discover_dgx_a100");
    for (name, strategy) in [
        ("partitionable", MigStrategy::Partitionable),
        ("no_mig", MigStrategy::None),
    ] {
        let backend = NvidiaBackend::new(
            NvidiaConfig {
                library_path: Some(library.clone()),
                mig_strategy: strategy,
                ..NvidiaConfig::default()
            },
            &ctx,
        )
        .unwrap();
        let devices = rt.block_on(backend.discover()).unwrap()[0].devices.len();
        assert!(devices >= 8, "{devices}");
        group.bench_function(name, |b| {
            b.iter(|| rt.block_on(backend.discover()).unwrap());
        });
    }
    group.finish();
}

criterion_group!(benches, discovery);
criterion_main!(benches);
