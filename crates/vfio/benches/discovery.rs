//! Discovery of 256 PCI functions (each on vfio-pci in its own IOMMU group) from a fake root.
//!
//! `cargo bench -p kubedev-vfio --bench discovery`

use criterion::{Criterion, criterion_group, criterion_main};
use kubedev_core::{BackendContext, HostFs};
use kubedev_testkit::machines::pci;
use kubedev_vfio::{VfioBackend, VfioConfig, scan};

fn discovery(c: &mut Criterion) {
    let root = pci::generated(256).expect("fake root");
    let state = tempfile::tempdir().expect("state dir");
    let config: VfioConfig = serde_json::from_value(serde_json::json!({
        "pciDevices": [{"selector": "10de:2236", "resourceName": "nvidia.com/GA102GL_A10"}]
    }))
    .expect("config");
    let backend = VfioBackend::new(
        config,
        &BackendContext::new(HostFs::new(root.path()), state.path(), "node-a"),
    )
    .expect("backend");
    assert_eq!(
        backend.discover_blocking().expect("discover").devices.len(),
        256
    );
    let host = HostFs::new(root.path());
    c.bench_function("scan_256_pci_functions", |b| {
        b.iter(|| scan(&host).expect("scan"))
    });
    c.bench_function("discover_256_pci_functions", |b| {
        b.iter(|| backend.discover_blocking().expect("discover"))
    });
}

criterion_group!(benches, discovery);
criterion_main!(benches);
