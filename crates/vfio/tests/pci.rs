//! PCI discovery against the fake machines: attribute tables, IOMMU groups as units, skipped
//! functions, and the prepare edits.
#![allow(clippy::unwrap_used)]

mod common;

use common::{alloc, attrs, backend, claim, names, table, with_logs};
use kubedev_core::{Consumer, DeviceSource, Preparer};
use kubedev_testkit::machines::pci::{
    self as machines, GPU_SERVER_GPUS, NIC_PF, NIC_VFS, PciFunctionSpec, PciMachine, VFIO_PCI,
};
use kubedev_vfio::{PciAddress, SriovRole, scan};

fn gpu_config() -> serde_json::Value {
    serde_json::json!({
        "pciDevices": [{"selector": "10de:2236", "resourceName": "nvidia.com/GA102GL_A10"}]
    })
}

#[tokio::test]
async fn gpu_server_offers_four_gpus_with_their_attributes() {
    let root = machines::dual_socket_gpu_server().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(&root, state.path(), gpu_config());
    let pools = b.discover().await.unwrap();
    assert_eq!(pools.len(), 1);
    let pool = &pools[0];
    assert_eq!(pool.name.as_str(), "node-a-vfio");
    assert_eq!(
        names(pool),
        [
            "pci-0000-3b-00-0",
            "pci-0000-5e-00-0",
            "pci-0000-af-00-0",
            "pci-0000-d8-00-0"
        ]
    );
    for (d, (addr, numa, group, root_complex)) in pool.devices.iter().zip(GPU_SERVER_GPUS) {
        let numa_s = format!("i:{numa}");
        let group_s = format!("i:{group}");
        let addr_s = format!("s:{addr}");
        let root_s = format!("s:{root_complex}");
        assert_eq!(
            attrs(d),
            table(&[
                ("type", "s:pci"),
                ("pciAddress", &addr_s),
                ("vendorID", "s:10de"),
                ("deviceID", "s:2236"),
                ("class", "s:030200"),
                ("iommuGroup", &group_s),
                ("numaNode", &numa_s),
                ("driver", "s:vfio-pci"),
                ("resourceName", "s:nvidia.com/GA102GL_A10"),
                ("sriovRole", "s:none"),
                ("functions", "i:1"),
                ("resource.kubernetes.io/pciBusID", &addr_s),
                ("resource.kubernetes.io/pcieRoot", &root_s),
            ]),
            "{}",
            d.name
        );
        assert_eq!(d.numa_node, Some(numa));
        assert!(d.health.is_healthy(), "{}: {:?}", d.name, d.health);
    }
}

#[test]
fn scan_reads_every_function_before_filtering() {
    let root = machines::dual_socket_gpu_server().unwrap();
    let host = kubedev_core::HostFs::new(root.path());
    let all = scan(&host).unwrap();
    // Host bridge, root port, NVMe, and per GPU a root port and the GPU.
    assert_eq!(all.len(), 3 + 2 * 4);
    let nvme = all
        .iter()
        .find(|f| f.address == PciAddress::parse("0000:01:00.0").unwrap())
        .unwrap();
    assert_eq!(nvme.driver.as_deref(), Some("nvme"));
    assert_eq!(nvme.class, 0x010802);
    assert_eq!(nvme.iommu_group, Some(2));
    assert_eq!(nvme.pcie_root.as_deref(), Some("pci0000:00"));
    assert_eq!(
        nvme.sysfs_path,
        std::path::Path::new("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0")
    );
    let host_bridge = &all[0];
    assert_eq!(host_bridge.driver, None);
    assert!(host_bridge.is_bridge());
}

#[tokio::test]
async fn every_skipped_function_is_logged_with_its_reason() {
    let root = machines::dual_socket_gpu_server().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(
        &root,
        state.path(),
        serde_json::json!({
            "pciDevices": [{"selector": "10de:2236"}, {"selector": "8086:0a54"}]
        }),
    );
    let (pool, logs) = with_logs(|| b.discover_blocking().unwrap());
    assert_eq!(pool.devices.len(), 4);
    // Default resource name.
    assert_eq!(
        attrs(&pool.devices[0])["resourceName"],
        "s:pci.kubedev.io/10de-2236"
    );
    let skipped = [
        ("0000:00:00.0", "matches no PCI selector"),
        ("0000:00:01.0", "matches no PCI selector"),
        ("0000:3a:00.0", "matches no PCI selector"),
        ("0000:01:00.0", "bound to nvme, not vfio-pci"),
    ];
    for (addr, reason) in skipped {
        let line = logs
            .lines()
            .find(|l| l.contains(addr) && l.contains("not offered"))
            .unwrap_or_else(|| panic!("no log line for {addr} in\n{logs}"));
        assert!(line.contains("DEBUG"), "{line}");
        assert!(line.contains(reason), "{line}");
    }
    // Offered functions are not reported as skipped.
    assert!(
        !logs
            .lines()
            .any(|l| l.contains("0000:3b:00.0") && l.contains("not offered")),
        "{logs}"
    );
}

#[tokio::test]
async fn sriov_nic_offers_the_vfs_not_the_pf() {
    let root = machines::sriov_nic().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(
        &root,
        state.path(),
        serde_json::json!({
            "pciDevices": [
                {"selector": "8086:154c", "resourceName": "intel.com/x710_vf"},
                {"selector": "8086:1572", "resourceName": "intel.com/x710"}
            ]
        }),
    );
    let (pool, logs) = with_logs(|| b.discover_blocking().unwrap());
    assert_eq!(pool.devices.len(), 8);
    for (d, (vf, group)) in pool.devices.iter().zip(NIC_VFS) {
        let vf_s = format!("s:{vf}");
        let group_s = format!("i:{group}");
        assert_eq!(
            attrs(d),
            table(&[
                ("type", "s:pci"),
                ("pciAddress", &vf_s),
                ("vendorID", "s:8086"),
                ("deviceID", "s:154c"),
                ("class", "s:020000"),
                ("iommuGroup", &group_s),
                ("numaNode", "i:0"),
                ("driver", "s:vfio-pci"),
                ("resourceName", "s:intel.com/x710_vf"),
                ("sriovRole", "s:vf"),
                ("physfn", "s:0000:5e:00.0"),
                ("functions", "i:1"),
                ("resource.kubernetes.io/pciBusID", &vf_s),
                ("resource.kubernetes.io/pcieRoot", "s:pci0000:5d"),
            ])
        );
    }
    let host = kubedev_core::HostFs::new(root.path());
    let pf = scan(&host)
        .unwrap()
        .into_iter()
        .find(|f| f.address.to_string() == NIC_PF)
        .unwrap();
    assert_eq!(
        pf.sriov,
        SriovRole::PhysicalFunction {
            total_vfs: 64,
            num_vfs: 8
        }
    );
    assert!(
        logs.lines()
            .any(|l| l.contains(NIC_PF) && l.contains("bound to i40e")),
        "{logs}"
    );
}

#[tokio::test]
async fn vgpu_vfs_with_a_type_are_offered() {
    let root = machines::vgpu_vf_host().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(&root, state.path(), serde_json::json!({}));
    let (pool, logs) = with_logs(|| b.discover_blocking().unwrap());
    assert_eq!(names(&pool), ["pci-0000-ca-00-4", "pci-0000-ca-00-5"]);
    assert_eq!(
        attrs(&pool.devices[0]),
        table(&[
            ("type", "s:pci"),
            ("pciAddress", "s:0000:ca:00.4"),
            ("vendorID", "s:10de"),
            ("deviceID", "s:2236"),
            ("class", "s:030200"),
            ("iommuGroup", "i:101"),
            ("numaNode", "i:1"),
            ("driver", "s:nvidia"),
            ("resourceName", "s:nvidia.com/vgpu"),
            ("sriovRole", "s:vf"),
            ("physfn", "s:0000:ca:00.0"),
            ("functions", "i:1"),
            ("vgpuType", "i:557"),
            ("resource.kubernetes.io/pciBusID", "s:0000:ca:00.4"),
            ("resource.kubernetes.io/pcieRoot", "s:pci0000:c9"),
        ])
    );
    for addr in ["0000:ca:00.6", "0000:ca:00.7"] {
        assert!(
            logs.lines()
                .any(|l| l.contains(addr) && l.contains("without a vGPU type")),
            "{logs}"
        );
    }
    // A selector for the model names the VFs' resource; the PF stays on nvidia, not offered.
    let b = backend(
        &root,
        state.path(),
        serde_json::json!({"pciDevices": [{"selector": "10de:2236", "resourceName": "nvidia.com/A10_vgpu"}]}),
    );
    let pool = b.discover_blocking().unwrap();
    assert_eq!(pool.devices.len(), 2);
    assert_eq!(
        attrs(&pool.devices[1])["resourceName"],
        "s:nvidia.com/A10_vgpu"
    );
    let b = backend(
        &root,
        state.path(),
        serde_json::json!({"includeVgpuVfs": false}),
    );
    assert!(b.discover_blocking().unwrap().devices.is_empty());
}

/// A consumer GPU with its HDMI audio function in one IOMMU group behind a root port without
/// ACS (the root port shares the group).
fn gpu_with_audio(audio_driver: &str) -> PciMachine {
    PciMachine::new()
        .function(
            PciFunctionSpec::new("0000:00:03.0", "pci0000:00", 0x8086, 0x2030, 0x060400)
                .driver("pcieport")
                .group(15)
                .numa(0),
        )
        .function(
            PciFunctionSpec::new(
                "0000:0a:00.0",
                "pci0000:00/0000:00:03.0",
                0x10de,
                0x2204,
                0x030000,
            )
            .driver(VFIO_PCI)
            .group(15)
            .numa(0),
        )
        .function(
            PciFunctionSpec::new(
                "0000:0a:00.1",
                "pci0000:00/0000:00:03.0",
                0x10de,
                0x1aef,
                0x040300,
            )
            .driver(audio_driver)
            .group(15)
            .numa(0),
        )
}

#[tokio::test]
async fn a_multi_function_iommu_group_is_one_device() {
    let root = gpu_with_audio(VFIO_PCI).build().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(
        &root,
        state.path(),
        serde_json::json!({"pciDevices": [
            {"selector": "10de:2204", "resourceName": "nvidia.com/GA102"},
            {"selector": "10de:1aef", "resourceName": "nvidia.com/GA102_audio"}
        ]}),
    );
    let pool = b.discover_blocking().unwrap();
    assert_eq!(names(&pool), ["pci-0000-0a-00-0"]);
    let a = attrs(&pool.devices[0]);
    assert_eq!(a["functions"], "i:2");
    assert_eq!(a["iommuGroup"], "i:15");
    assert_eq!(a["resourceName"], "s:nvidia.com/GA102");
    let out = b
        .prepare(&Consumer::Claim(claim()), &[alloc("pci-0000-0a-00-0")])
        .await
        .unwrap();
    let edits = &out[0].edits;
    assert_eq!(
        edits.env["PCI_RESOURCE_NVIDIA_COM_GA102"],
        "0000:0a:00.0,0000:0a:00.1"
    );
    let nodes: Vec<_> = edits
        .device_nodes
        .iter()
        .map(|n| (n.path.as_str(), n.permissions.as_deref()))
        .collect();
    assert_eq!(
        nodes,
        [
            ("/dev/vfio/vfio", Some("mrw")),
            ("/dev/vfio/15", Some("mrw"))
        ]
    );
}

#[tokio::test]
async fn a_group_with_a_function_on_a_host_driver_is_not_offered() {
    let root = gpu_with_audio("snd_hda_intel").build().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(
        &root,
        state.path(),
        serde_json::json!({"pciDevices": [{"selector": "10de:2204"}]}),
    );
    let (pool, logs) = with_logs(|| b.discover_blocking().unwrap());
    assert!(pool.devices.is_empty());
    let line = logs
        .lines()
        .find(|l| l.contains("0000:0a:00.0") && l.contains("not offered"))
        .unwrap_or_else(|| panic!("{logs}"));
    assert!(
        line.contains("0000:0a:00.1 bound to snd_hda_intel"),
        "{line}"
    );
}

#[tokio::test]
async fn env_name_is_the_allocated_resource_or_the_configured_one() {
    let root = machines::dual_socket_gpu_server().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(&root, state.path(), gpu_config());
    b.discover().await.unwrap();
    let devices = [alloc("pci-0000-3b-00-0"), alloc("pci-0000-af-00-0")];
    // DRA: the configured resource name.
    let out = b
        .prepare(&Consumer::Claim(claim()), &devices)
        .await
        .unwrap();
    let mut merged = kubedev_core::ContainerEdits::default();
    for p in &out {
        merged.merge(&p.edits);
    }
    assert_eq!(
        merged.env["PCI_RESOURCE_NVIDIA_COM_GA102GL_A10"],
        "0000:3b:00.0,0000:af:00.0"
    );
    let paths: Vec<_> = merged
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    assert_eq!(paths, ["/dev/vfio/vfio", "/dev/vfio/20", "/dev/vfio/40"]);
    // Device plugin: the extended resource the kubelet allocated.
    let consumer = Consumer::Container {
        resource: "example.com/passthrough.gpu".into(),
    };
    let out = b.prepare(&consumer, &devices[..1]).await.unwrap();
    assert_eq!(
        out[0].edits.env["PCI_RESOURCE_EXAMPLE_COM_PASSTHROUGH_GPU"],
        "0000:3b:00.0"
    );
    // Idempotent.
    let again = b.prepare(&consumer, &devices[..1]).await.unwrap();
    assert_eq!(out, again);
    // Unknown devices and foreign pools are errors naming the device.
    let err = b
        .prepare(&consumer, &[alloc("pci-0000-99-00-0")])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("pci-0000-99-00-0"), "{err}");
    // Unprepare of something never rebound succeeds.
    b.unprepare(&claim(), &devices).await.unwrap();
}

#[tokio::test]
async fn prepare_fails_for_a_device_whose_group_node_is_gone() {
    let root = machines::dual_socket_gpu_server().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(&root, state.path(), gpu_config());
    b.discover().await.unwrap();
    root.remove("/dev/vfio/30").unwrap();
    let err = b
        .prepare(&Consumer::Claim(claim()), &[alloc("pci-0000-5e-00-0")])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("/dev/vfio/30 is missing"), "{err}");
    let pool = b.discover_blocking().unwrap();
    assert!(!pool.devices[1].health.is_healthy());
}

#[test]
fn broken_sysfs_entries_are_skipped_and_named() {
    let root = machines::dual_socket_gpu_server().unwrap();
    // A function whose vendor file holds garbage, and an entry that is not an address.
    root.file(
        "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/vendor",
        "nonsense\n",
    )
    .unwrap();
    root.dir("/sys/bus/pci/devices/not-an-address").unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(&root, state.path(), gpu_config());
    let (pool, logs) = with_logs(|| b.discover_blocking().unwrap());
    assert_eq!(pool.devices.len(), 3);
    assert!(
        logs.lines().any(|l| l.contains("WARN")
            && l.contains("0000:3b:00.0/vendor")
            && l.contains("nonsense")),
        "{logs}"
    );
    assert!(logs.contains("not-an-address"), "{logs}");
}

#[test]
fn links_outside_the_root_stay_inside() {
    let root = machines::dual_socket_gpu_server().unwrap();
    // An absolute driver link: resolved inside the root, never the machine's own /sys.
    root.link(
        "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/driver",
        "/sys/bus/pci/drivers/vfio-pci",
    )
    .unwrap();
    root.link(
        "/sys/bus/pci/devices/0000:5e:00.0",
        "../../../../../../../../../sys/devices/pci0000:5d/0000:5d:00.0/0000:5e:00.0",
    )
    .unwrap();
    let host = kubedev_core::HostFs::new(root.path());
    let all = scan(&host).unwrap();
    let f = all
        .iter()
        .find(|f| f.address.to_string() == "0000:5e:00.0")
        .unwrap();
    assert_eq!(f.pcie_root.as_deref(), Some("pci0000:5d"));
    assert_eq!(f.iommu_group, Some(30));
}
