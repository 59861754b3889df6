//! What nvml-wrapper reports for each bundled machine.

use nvml_wrapper::enum_wrappers::device::{Brand, TopologyLevel};
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::CudaComputeCapability;

use crate::load;

const MIB: u64 = 1024 * 1024;

struct Row {
    uuid: &'static str,
    minor: u32,
    bus: &'static str,
    numa: Option<u32>,
}

const DGX: [Row; 8] = [
    Row {
        uuid: "GPU-4a1c2e8f-61b0-3d27-9a4e-0c5f7b1d2e01",
        minor: 0,
        bus: "00000000:07:00.0",
        numa: Some(0),
    },
    Row {
        uuid: "GPU-9b3d5f71-0c2a-4e86-b1d9-2f4a6c8e0a12",
        minor: 1,
        bus: "00000000:0F:00.0",
        numa: Some(0),
    },
    Row {
        uuid: "GPU-1e5a7c93-2d4b-4f68-83a1-5c7e9b0d1f23",
        minor: 2,
        bus: "00000000:47:00.0",
        numa: Some(0),
    },
    Row {
        uuid: "GPU-6f8b0d24-3e5c-4a79-94b2-6d8f0a1c2e34",
        minor: 3,
        bus: "00000000:4E:00.0",
        numa: Some(0),
    },
    Row {
        uuid: "GPU-2c4e6a85-4f6d-4b8a-a5c3-7e9a1b2d3f45",
        minor: 4,
        bus: "00000000:87:00.0",
        numa: Some(1),
    },
    Row {
        uuid: "GPU-7d9f1b36-5a7e-4c9b-b6d4-8fa02c3e4a56",
        minor: 5,
        bus: "00000000:90:00.0",
        numa: Some(1),
    },
    Row {
        uuid: "GPU-3e5a7c97-6b8f-4dac-87e5-90b13d4f5b67",
        minor: 6,
        bus: "00000000:B7:00.0",
        numa: Some(1),
    },
    Row {
        uuid: "GPU-8fa02d48-7c9a-4ebd-98f6-a1c24e5a6c78",
        minor: 7,
        bus: "00000000:BD:00.0",
        numa: Some(1),
    },
];

#[test]
fn dgx_a100_attribute_table() {
    let l = load("dgx-a100");
    let nvml = &l.nvml;
    assert_eq!(nvml.sys_driver_version().unwrap(), "550.54.15");
    assert_eq!(nvml.sys_nvml_version().unwrap(), "12.550.54.15");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12040);
    assert_eq!(nvml.device_count().unwrap(), 8);
    for (i, row) in DGX.iter().enumerate() {
        let d = nvml.device_by_index(i as u32).unwrap();
        assert_eq!(d.uuid().unwrap(), row.uuid);
        assert_eq!(d.index().unwrap(), i as u32);
        assert_eq!(d.minor_number().unwrap(), row.minor);
        assert_eq!(d.name().unwrap(), "NVIDIA A100-SXM4-40GB");
        assert_eq!(d.brand().unwrap(), Brand::Nvidia);
        assert_eq!(d.architecture().unwrap(), DeviceArchitecture::Ampere);
        assert_eq!(
            d.cuda_compute_capability().unwrap(),
            CudaComputeCapability { major: 8, minor: 0 }
        );
        let mem = d.memory_info().unwrap();
        assert_eq!(mem.total, 40960 * MIB);
        assert_eq!(mem.reserved, 512 * MIB);
        assert_eq!(mem.free, (40960 - 512) * MIB);
        let pci = d.pci_info().unwrap();
        assert_eq!(pci.bus_id, row.bus);
        assert_eq!(pci.pci_device_id, 0x20B0_10DE);
        assert_eq!(pci.pci_sub_system_id, Some(0x134F_10DE));
        assert_eq!(d.numa_node_id().ok(), row.numa);
        let node = row.numa.unwrap();
        let nodes = d.memory_affinity(1, 0).unwrap();
        assert_eq!(nodes, vec![1 << node]);
        let cpus = d.cpu_affinity_within_scope(4, 0).unwrap();
        // Node 0: CPUs 0-63 and 128-191; node 1: 64-127 and 192-255.
        let want = if node == 0 {
            vec![u64::MAX, 0, u64::MAX, 0]
        } else {
            vec![0, u64::MAX, 0, u64::MAX]
        };
        assert_eq!(cpus, want);
        // Lookups by UUID and bus id give the same device.
        assert_eq!(
            nvml.device_by_uuid(row.uuid).unwrap().index().unwrap(),
            i as u32
        );
        assert_eq!(
            nvml.device_by_pci_bus_id(row.bus).unwrap().index().unwrap(),
            i as u32
        );
        assert_eq!(
            nvml.device_by_pci_bus_id(&row.bus[4..])
                .unwrap()
                .index()
                .unwrap(),
            i as u32
        );
        // MIG mode: GPUs 6 and 7 enabled.
        let mig = d.mig_mode().unwrap();
        assert_eq!(
            (mig.current, mig.pending),
            if i >= 6 { (1, 1) } else { (0, 0) }
        );
    }
    assert!(matches!(
        nvml.device_by_uuid("GPU-00000000-0000-0000-0000-000000000000"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_index(8),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn dgx_a100_nvlink_and_topology() {
    let l = load("dgx-a100");
    let nvml = &l.nvml;
    let d0 = nvml.device_by_index(0).unwrap();
    for link in 0..12 {
        let l = d0.link_wrapper_for(link);
        assert!(l.is_active().unwrap(), "link {link}");
        assert_eq!(l.version().unwrap(), 3);
        let remote = l.remote_pci_info().unwrap();
        assert_eq!(remote.bus_id, format!("00000000:C{}:00.0", 4 + link % 6));
    }
    assert!(matches!(
        d0.link_wrapper_for(12).is_active(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        d0.link_wrapper_for(18).is_active(),
        Err(NvmlError::InvalidArg)
    ));
    let level = |a: u32, b: u32| {
        let da = nvml.device_by_index(a).unwrap();
        let db = nvml.device_by_index(b).unwrap();
        da.topology_common_ancestor(db).unwrap()
    };
    assert_eq!(level(0, 0), TopologyLevel::Internal);
    assert_eq!(level(0, 1), TopologyLevel::Multiple);
    assert_eq!(level(1, 0), TopologyLevel::Multiple);
    assert_eq!(level(0, 3), TopologyLevel::Node);
    assert_eq!(level(3, 4), TopologyLevel::System);
    assert_eq!(level(6, 7), TopologyLevel::Multiple);
    let near: Vec<u32> = d0
        .topology_nearest_gpus(TopologyLevel::Node)
        .unwrap()
        .iter()
        .map(|d| d.index().unwrap())
        .collect();
    assert_eq!(near, vec![1, 2, 3]);
    let d5 = nvml.device_by_index(5).unwrap();
    let p2p = d0
        .p2p_status(
            &d5,
            nvml_wrapper::enum_wrappers::device::P2pCapabilitiesIndex::NvLink,
        )
        .unwrap();
    assert_eq!(p2p, nvml_wrapper::enum_wrappers::device::P2pStatus::Ok);
}

#[test]
fn workstation_attribute_table() {
    let l = load("workstation");
    let nvml = &l.nvml;
    assert_eq!(nvml.device_count().unwrap(), 2);
    let a6000 = nvml.device_by_index(0).unwrap();
    let rtx4090 = nvml.device_by_index(1).unwrap();
    assert_eq!(a6000.name().unwrap(), "NVIDIA RTX A6000");
    assert_eq!(rtx4090.name().unwrap(), "NVIDIA GeForce RTX 4090");
    assert_eq!(a6000.minor_number().unwrap(), 1);
    assert_eq!(rtx4090.minor_number().unwrap(), 0);
    assert_eq!(a6000.brand().unwrap(), Brand::NvidiaRTX);
    assert_eq!(rtx4090.brand().unwrap(), Brand::GeForceRTX);
    assert_eq!(a6000.architecture().unwrap(), DeviceArchitecture::Ampere);
    assert_eq!(rtx4090.architecture().unwrap(), DeviceArchitecture::Ada);
    assert_eq!(
        a6000.cuda_compute_capability().unwrap(),
        CudaComputeCapability { major: 8, minor: 6 }
    );
    assert_eq!(
        rtx4090.cuda_compute_capability().unwrap(),
        CudaComputeCapability { major: 8, minor: 9 }
    );
    assert_eq!(a6000.memory_info().unwrap().total, 49140 * MIB);
    assert_eq!(rtx4090.memory_info().unwrap().used, MIB);
    for d in [&a6000, &rtx4090] {
        assert!(matches!(d.mig_mode(), Err(NvmlError::NotSupported)));
        assert_eq!(d.mig_device_count().unwrap(), 0);
        assert!(matches!(d.profile_info(0), Err(NvmlError::NotSupported)));
        assert!(matches!(d.numa_node_id(), Err(NvmlError::NotSupported)));
        assert!(matches!(
            d.memory_affinity(1, 0),
            Err(NvmlError::NotSupported)
        ));
        assert!(matches!(
            d.link_wrapper_for(0).is_active(),
            Err(NvmlError::NotSupported)
        ));
    }
    assert_eq!(
        a6000
            .topology_common_ancestor(nvml.device_by_index(1).unwrap())
            .unwrap(),
        TopologyLevel::Node
    );
    let p2p = a6000
        .p2p_status(
            &rtx4090,
            nvml_wrapper::enum_wrappers::device::P2pCapabilitiesIndex::NvLink,
        )
        .unwrap();
    assert_eq!(
        p2p,
        nvml_wrapper::enum_wrappers::device::P2pStatus::NotSupported
    );
}
