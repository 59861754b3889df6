//! Attribute tables per machine file, the partition model through NVML, and NVML missing.

use kubedev_core::{AttributeValue, DeviceSource, Quantity};
use kubedev_nvidia::{MigStrategy, NvidiaBackend, NvidiaConfig, PcieLevel};

use crate::{Fixture, a, discover, s};

#[tokio::test]
async fn dgx_a100_gpus_with_versions_numa_and_nvlink() {
    let f = Fixture::new("dgx-a100");
    let b = f.backend(f.config());
    let pool = discover(&b).await;
    assert_eq!(pool.name.as_str(), "node-a-nvidia");
    let names: Vec<_> = pool.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
        ]
    );
    let buses = [
        "0000:07:00.0",
        "0000:0f:00.0",
        "0000:47:00.0",
        "0000:4e:00.0",
        "0000:87:00.0",
        "0000:90:00.0",
        "0000:b7:00.0",
        "0000:bd:00.0",
    ];
    let roots = [
        "pci0000:00",
        "pci0000:00",
        "pci0000:40",
        "pci0000:40",
        "pci0000:80",
        "pci0000:80",
        "pci0000:b0",
        "pci0000:b0",
    ];
    for (i, d) in pool.devices.iter().enumerate() {
        let i64i = i as i64;
        assert_eq!(a(d, "type"), s("gpu"));
        assert_eq!(a(d, "index"), AttributeValue::Int(i64i));
        assert_eq!(a(d, "minor"), AttributeValue::Int(i64i));
        assert!(a(d, "uuid").as_str().unwrap().starts_with("GPU-"));
        assert_eq!(a(d, "productName"), s("NVIDIA A100-SXM4-40GB"));
        assert_eq!(a(d, "brand"), s("Nvidia"));
        assert_eq!(a(d, "architecture"), s("Ampere"));
        assert_eq!(a(d, "cudaComputeCapability").to_string(), "8.0.0");
        assert!(a(d, "cudaComputeCapability").as_version().is_some());
        assert_eq!(a(d, "driverVersion").to_string(), "550.54.15");
        assert_eq!(a(d, "cudaDriverVersion").to_string(), "12.4.0");
        assert_eq!(a(d, "pcieBusID"), s(buses[i]));
        assert_eq!(
            d.attribute("resource.kubernetes.io/pciBusID"),
            Some(&s(buses[i]))
        );
        assert_eq!(
            d.attribute("resource.kubernetes.io/pcieRoot"),
            Some(&s(roots[i]))
        );
        assert_eq!(a(d, "migCapable"), AttributeValue::Bool(true));
        assert_eq!(a(d, "migEnabled"), AttributeValue::Bool(i >= 6));
        assert_eq!(
            a(d, "nvlinkGroup"),
            AttributeValue::Int(0),
            "one NVSwitch fabric"
        );
        assert_eq!(a(d, "nvlinkPeers"), AttributeValue::Int(7));
        assert_eq!(
            a(d, "pcieSwitchGroup"),
            AttributeValue::Int(i64i / 2 * 2),
            "pairs behind PCIe switches"
        );
        assert_eq!(d.numa_node, Some(i64i / 4));
        assert_eq!(
            d.capacity[&"gpu.nvidia.com/memory".parse().unwrap()].value,
            Quantity::parse("40Gi").unwrap()
        );
        assert!(d.health.is_healthy());
        assert!(d.consumes_counters.is_empty());
    }
    let t = b.topology().expect("cached at discovery");
    assert_eq!(t.gpus.len(), 8);
    assert_eq!(t.nvlinks[0][7], 12);
    assert_eq!(t.pcie[0][1], Some(PcieLevel::MultipleSwitches));
    assert_eq!(t.pcie[0][2], Some(PcieLevel::NumaNode));
    assert_eq!(t.pcie[0][4].map(|l| l.short_name()), Some("SYS"));
}

#[tokio::test]
async fn h100_static_mig_lists_seven_1g10gb_devices() {
    let f = Fixture::new("h100-mig");
    let b = f.backend(NvidiaConfig {
        mig_strategy: MigStrategy::Static,
        ..f.config()
    });
    let pool = discover(&b).await;
    let names: Vec<_> = pool.devices.iter().map(|d| d.name.as_str()).collect();
    let expected: Vec<String> = (0..7).map(|i| format!("gpu-0-mig-1g10gb-{i}")).collect();
    assert_eq!(names, expected);
    let mut uuids = std::collections::BTreeSet::new();
    for (i, d) in pool.devices.iter().enumerate() {
        assert_eq!(a(d, "type"), s("mig"));
        assert_eq!(a(d, "profile"), s("1g.10gb"));
        assert_eq!(
            a(d, "parentUUID"),
            s("GPU-5b7d9f12-8a0c-4e3b-9d5f-b2d46f8a0c89")
        );
        assert_eq!(a(d, "parentIndex"), AttributeValue::Int(0));
        assert_eq!(a(d, "placementStart"), AttributeValue::Int(i as i64));
        assert_eq!(a(d, "placementSize"), AttributeValue::Int(1));
        assert_eq!(a(d, "gpuInstanceId"), AttributeValue::Int(7 + i as i64));
        assert_eq!(a(d, "computeInstanceId"), AttributeValue::Int(0));
        assert_eq!(a(d, "productName"), s("NVIDIA H100 80GB HBM3"));
        assert_eq!(a(d, "architecture"), s("Hopper"));
        assert_eq!(a(d, "cudaComputeCapability").to_string(), "9.0.0");
        let uuid = a(d, "uuid");
        assert!(uuid.as_str().unwrap().starts_with("MIG-"), "{uuid}");
        uuids.insert(uuid.to_string());
        let cap = |n: &str| d.capacity[&format!("gpu.nvidia.com/{n}").parse().unwrap()].value;
        assert_eq!(cap("memory"), Quantity::parse("9984Mi").unwrap());
        assert_eq!(cap("multiprocessors"), Quantity::parse("16").unwrap());
        assert_eq!(d.numa_node, Some(0));
        assert!(d.consumes_counters.is_empty());
    }
    assert_eq!(uuids.len(), 7, "distinct MIG UUIDs");
    assert!(pool.shared_counters.is_empty());
}

#[tokio::test]
async fn workstation_two_gpus_without_nvlink_or_numa() {
    let f = Fixture::new("workstation");
    let b = f.backend(f.config());
    let pool = discover(&b).await;
    assert_eq!(pool.devices.len(), 2);
    let (g0, g1) = (&pool.devices[0], &pool.devices[1]);
    assert_eq!(g0.name.as_str(), "gpu-0");
    assert_eq!(a(g0, "productName"), s("NVIDIA RTX A6000"));
    assert_eq!(a(g0, "minor"), AttributeValue::Int(1));
    assert_eq!(a(g0, "brand"), s("NvidiaRTX"));
    assert_eq!(a(g0, "cudaComputeCapability").to_string(), "8.6.0");
    assert_eq!(a(g1, "productName"), s("NVIDIA GeForce RTX 4090"));
    assert_eq!(a(g1, "minor"), AttributeValue::Int(0));
    assert_eq!(a(g1, "brand"), s("GeForceRTX"));
    assert_eq!(a(g1, "architecture"), s("Ada"));
    for (i, d) in [g0, g1].into_iter().enumerate() {
        assert_eq!(a(d, "nvlinkPeers"), AttributeValue::Int(0));
        assert_eq!(a(d, "nvlinkGroup"), AttributeValue::Int(i as i64));
        assert_eq!(a(d, "pcieSwitchGroup"), AttributeValue::Int(i as i64));
        assert_eq!(a(d, "migCapable"), AttributeValue::Bool(false));
        assert_eq!(d.numa_node, None);
        assert_eq!(d.attribute("resource.kubernetes.io/pcieRoot"), None);
    }
    assert_eq!(
        g1.capacity[&"gpu.nvidia.com/memory".parse().unwrap()].value,
        Quantity::parse("24564Mi").unwrap()
    );
    let t = b.topology().unwrap();
    assert_eq!(t.nvlinks, vec![vec![0, 0], vec![0, 0]]);
    assert_eq!(t.pcie[0][1], Some(PcieLevel::NumaNode));
}

#[tokio::test]
async fn dgx_a100_static_mig_shows_the_mixed_gpu() {
    let f = Fixture::new("dgx-a100");
    let b = f.backend(NvidiaConfig {
        mig_strategy: MigStrategy::Static,
        ..f.config()
    });
    let pool = discover(&b).await;
    let names: Vec<_> = pool.devices.iter().map(|d| d.name.as_str()).collect();
    // GPUs 0-5 have MIG off; GPU 6 has MIG on and no instances; GPU 7 has four MIG devices,
    // two of them compute instances of one 2g.10gb GPU instance.
    assert_eq!(
        names,
        [
            "gpu-0",
            "gpu-1",
            "gpu-2",
            "gpu-3",
            "gpu-4",
            "gpu-5",
            "gpu-7-mig-3g20gb-0",
            "gpu-7-mig-2g10gb-4-c1-0",
            "gpu-7-mig-2g10gb-4-c1-1",
            "gpu-7-mig-1g5gb-6"
        ]
    );
}

#[tokio::test]
async fn dgx_a100_partitionable_model() {
    let f = Fixture::new("dgx-a100");
    let b = f.backend(NvidiaConfig {
        mig_strategy: MigStrategy::Partitionable,
        ..f.config()
    });
    let pool = discover(&b).await;
    // GPU 6 (MIG on, empty): the whole GPU and every placement of every profile:
    // 7 × 1g.5gb + 7 × 1g.5gb+me + 4 × 1g.10gb + 3 × 2g.10gb + 2 × 3g.20gb + 4g.20gb + 7g.40gb.
    let gpu6: Vec<_> = pool
        .devices
        .iter()
        .filter(|d| d.name.as_str().starts_with("gpu-6"))
        .collect();
    assert_eq!(gpu6.len(), 1 + 25);
    let set = pool
        .shared_counters
        .iter()
        .find(|s| s.name.as_str() == "gpu-6-counters")
        .unwrap();
    let total = |k: &str| set.counters[k].as_i64().unwrap();
    assert_eq!(set.counters.len(), 8 + 7);
    assert_eq!(total("multiprocessors"), 98);
    assert_eq!(total("memory"), 40192 << 20);
    let whole = pool.device("gpu-6").unwrap();
    assert_eq!(whole.consumes_counters[0].counters, set.counters);
    for d in gpu6.iter().filter(|d| d.name.as_str() != "gpu-6") {
        let c = &d.consumes_counters[0];
        assert_eq!(c.counter_set, set.name);
        let start = a(d, "placementStart").as_int().unwrap();
        let size = a(d, "placementSize").as_int().unwrap();
        let slices: Vec<i64> = c
            .counters
            .keys()
            .filter_map(|k| k.as_str().strip_prefix("memory-slice-"))
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(
            slices,
            (start..start + size).collect::<Vec<_>>(),
            "{}",
            d.name
        );
        assert!(
            d.attribute("gpu.nvidia.com/uuid").is_none(),
            "not created yet"
        );
    }
    // GPU 7 holds instances kubedev did not make: they are static devices, no placement fits
    // beside them, and the whole GPU is withheld.
    let gpu7: Vec<_> = pool
        .devices
        .iter()
        .filter(|d| d.name.as_str().starts_with("gpu-7"))
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(gpu7.len(), 4, "{gpu7:?}");
    assert!(pool.device("gpu-7").is_none());
    // GPUs with MIG off are whole GPUs without counters.
    assert!(pool.device("gpu-0").unwrap().consumes_counters.is_empty());
    assert_eq!(pool.devices.len(), 6 + 26 + 4);
}

#[tokio::test]
async fn nvml_unavailable_is_a_clear_source_error() {
    let f = Fixture::new("dgx-a100");
    let missing = NvidiaConfig {
        library_path: Some(f.dir.path().join("no-such-libnvidia-ml.so")),
        ..NvidiaConfig::default()
    };
    let b = NvidiaBackend::new(missing, &f.ctx).expect("new succeeds without NVML");
    let err = b.discover().await.unwrap_err().to_string();
    assert!(err.contains("NVML unavailable: "), "{err}");
    assert!(err.contains("no-such-libnvidia-ml.so"), "{err}");
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let err = b.watch(tx).await.unwrap_err().to_string();
    assert!(err.contains("NVML unavailable"), "{err}");

    // A library that loads but whose init fails (driver not loaded).
    let machine = f.dir.path().join("broken.yaml");
    std::fs::write(
        &machine,
        "driverVersion: \"550.54.15\"\ncudaDriverVersion: 12040\ninitError: 9\ngpus: []\n",
    )
    .unwrap();
    let g = Fixture::with_machine_file(&machine);
    let b = g.backend(g.config());
    let err = b.discover().await.unwrap_err().to_string();
    assert!(err.contains("NVML unavailable: "), "{err}");
    assert!(err.contains("driver is not loaded"), "{err}");
}

#[tokio::test]
async fn time_slicing_replicas_prepare_to_their_gpu() {
    use kubedev_core::{AllocatedDevice, Consumer, DeviceRef, Preparer};
    let f = Fixture::new("workstation");
    let b = f.backend(NvidiaConfig {
        replicas: 2,
        ..f.config()
    });
    let pool = discover(&b).await;
    let names: Vec<_> = pool.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0-replica-0",
            "gpu-0-replica-1",
            "gpu-1-replica-0",
            "gpu-1-replica-1"
        ]
    );
    assert_eq!(a(&pool.devices[3], "replica"), AttributeValue::Int(1));
    let d = &pool.devices[3];
    let out = b
        .prepare(
            &Consumer::Container {
                resource: "nvidia.com/gpu".into(),
            },
            &[AllocatedDevice::new(DeviceRef::new(
                pool.name.clone(),
                d.name.clone(),
            ))],
        )
        .await
        .unwrap();
    assert_eq!(
        out[0].edits.env["NVIDIA_VISIBLE_DEVICES"],
        "GPU-e1a3c5e7-f9b1-4d3f-b5d7-f9a1c3e5a7b9"
    );
    assert!(
        out[0]
            .edits
            .device_nodes
            .iter()
            .any(|n| n.path == "/dev/nvidia0"),
        "GPU index 1 has minor 0"
    );
}
