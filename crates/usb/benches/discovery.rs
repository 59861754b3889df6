//! Discovery of 64 USB devices from a fake host root.
//!
//! `cargo bench -p kubedev-usb --bench discovery`
#![allow(clippy::unwrap_used, missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use kubedev_core::hostfs::HostFs;
use kubedev_core::{BackendContext, DeviceSource};
use kubedev_usb::{UsbBackend, UsbConfig, read_usb_devices};

fn discovery(c: &mut Criterion) {
    let root = kubedev_testkit::machines::usb::many_devices(64).unwrap();
    let host = HostFs::new(root.path());
    assert_eq!(read_usb_devices(&host).unwrap().len(), 64);
    c.bench_function("usb/read_64_devices", |b| {
        b.iter(|| read_usb_devices(&host).unwrap())
    });

    let config: UsbConfig = serde_json::from_value(serde_json::json!({
        "resources": [
            {"name": "example.com/pair", "selectors": ["1050:0407", "0403:6001"]},
            {"name": "example.com/key", "selectors": ["1050:0407"]}
        ]
    }))
    .unwrap();
    let ctx = BackendContext::new(
        HostFs::new(root.path()),
        root.path().join("state"),
        "node-a",
    );
    let backend = UsbBackend::new(config, &ctx).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert_eq!(
        rt.block_on(backend.discover()).unwrap()[0].devices.len(),
        32
    );
    c.bench_function("usb/discover_64_devices", |b| {
        b.iter(|| rt.block_on(backend.discover()).unwrap())
    });
}

criterion_group!(benches, discovery);
criterion_main!(benches);
