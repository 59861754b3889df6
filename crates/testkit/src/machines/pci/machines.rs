//! The named fake machines: a dual-socket GPU server, an SR-IOV NIC, an NVIDIA vGPU host with
//! SR-IOV virtual functions, and generated machines of any size for benchmarks.

use std::io;

use super::{PciFunctionSpec, PciMachine, VFIO_PCI};
use crate::hostroot::HostRoot;

/// The GPUs of [`dual_socket_gpu_server`]: address, NUMA node, IOMMU group, PCIe root.
pub const GPU_SERVER_GPUS: [(&str, i64, u32, &str); 4] = [
    ("0000:3b:00.0", 0, 20, "pci0000:3a"),
    ("0000:5e:00.0", 0, 30, "pci0000:5d"),
    ("0000:af:00.0", 1, 40, "pci0000:ae"),
    ("0000:d8:00.0", 1, 50, "pci0000:d7"),
];

/// NVIDIA's PCI vendor ID.
pub const NVIDIA: u16 = 0x10de;
/// Intel's PCI vendor ID.
pub const INTEL: u16 = 0x8086;
/// The device ID of an NVIDIA A10 (GA102GL).
pub const A10: u16 = 0x2236;
/// The device ID of an NVIDIA T4 (TU104GL).
pub const T4: u16 = 0x1eb8;

/// The dual-socket server's functions: a host bridge and an NVMe drive on root `pci0000:00`,
/// and four NVIDIA A10 GPUs (`10de:2236`) on `vfio-pci` behind their own root ports
/// (`pcieport`), each GPU alone in its IOMMU group: two on NUMA node 0, two on node 1 (see
/// [`GPU_SERVER_GPUS`]).
pub fn dual_socket_gpu_server_spec() -> PciMachine {
    let mut m = PciMachine::new()
        .function(
            PciFunctionSpec::new("0000:00:00.0", "pci0000:00", INTEL, 0x2020, 0x060000)
                .group(0)
                .numa(0),
        )
        .function(
            PciFunctionSpec::new("0000:00:01.0", "pci0000:00", INTEL, 0x2030, 0x060400)
                .driver("pcieport")
                .group(1)
                .numa(0),
        )
        .function(
            PciFunctionSpec::new(
                "0000:01:00.0",
                "pci0000:00/0000:00:01.0",
                INTEL,
                0x0a54,
                0x010802,
            )
            .driver("nvme")
            .group(2)
            .numa(0),
        );
    for (addr, numa, group, root) in GPU_SERVER_GPUS {
        let bus = &root[3..];
        let port = format!("{bus}:00.0");
        m = m
            .function(
                PciFunctionSpec::new(&port, root, INTEL, 0x2030, 0x060400)
                    .driver("pcieport")
                    .group(group - 1)
                    .numa(numa),
            )
            .function(
                PciFunctionSpec::new(addr, &format!("{root}/{port}"), NVIDIA, A10, 0x030200)
                    .driver(VFIO_PCI)
                    .group(group)
                    .numa(numa),
            );
    }
    m
}

/// A dual-socket server with 4 GPUs on `vfio-pci` in 4 IOMMU groups over 2 NUMA nodes (see
/// [`dual_socket_gpu_server_spec`]).
pub fn dual_socket_gpu_server() -> io::Result<HostRoot> {
    dual_socket_gpu_server_spec().build()
}

/// The PF of [`sriov_nic`].
pub const NIC_PF: &str = "0000:5e:00.0";

/// The VFs of [`sriov_nic`] with their IOMMU groups.
pub const NIC_VFS: [(&str, u32); 8] = [
    ("0000:5e:02.0", 70),
    ("0000:5e:02.1", 71),
    ("0000:5e:02.2", 72),
    ("0000:5e:02.3", 73),
    ("0000:5e:02.4", 74),
    ("0000:5e:02.5", 75),
    ("0000:5e:02.6", 76),
    ("0000:5e:02.7", 77),
];

/// An Intel X710 (`8086:1572`, driver `i40e`) physical function with 8 virtual functions
/// (`8086:154c`) bound to `vfio-pci`, each VF in its own IOMMU group, on NUMA node 0 behind root
/// port `0000:5d:00.0`.
pub fn sriov_nic_spec() -> PciMachine {
    let parent = "pci0000:5d/0000:5d:00.0";
    let mut m = PciMachine::new()
        .function(
            PciFunctionSpec::new("0000:5d:00.0", "pci0000:5d", INTEL, 0x2030, 0x060400)
                .driver("pcieport")
                .group(29)
                .numa(0),
        )
        .function(
            PciFunctionSpec::new(NIC_PF, parent, INTEL, 0x1572, 0x020000)
                .driver("i40e")
                .group(30)
                .numa(0)
                .sriov_pf(64),
        );
    for (vf, group) in NIC_VFS {
        m = m.function(
            PciFunctionSpec::new(vf, parent, INTEL, 0x154c, 0x020000)
                .driver(VFIO_PCI)
                .group(group)
                .numa(0)
                .sriov_vf(NIC_PF),
        );
    }
    m
}

/// An SR-IOV NIC with a PF and 8 VFs (see [`sriov_nic_spec`]).
pub fn sriov_nic() -> io::Result<HostRoot> {
    sriov_nic_spec().build()
}

/// The PF of [`vgpu_vf_host`].
pub const VGPU_PF: &str = "0000:ca:00.0";

/// The VFs of [`vgpu_vf_host`]: address, IOMMU group, `current_vgpu_type` (0 = no vGPU type
/// set, not offered).
pub const VGPU_VFS: [(&str, u32, u32); 4] = [
    ("0000:ca:00.4", 101, 557),
    ("0000:ca:00.5", 102, 557),
    ("0000:ca:00.6", 103, 0),
    ("0000:ca:00.7", 104, 0),
];

/// An NVIDIA A10 with SR-IOV vGPU (the vendor VFIO framework): the PF and 4 VFs all bound to
/// `nvidia`, on NUMA node 1; two VFs have a vGPU type set (see [`VGPU_VFS`]).
pub fn vgpu_vf_host_spec() -> PciMachine {
    let parent = "pci0000:c9/0000:c9:00.0";
    let mut m = PciMachine::new()
        .function(
            PciFunctionSpec::new("0000:c9:00.0", "pci0000:c9", INTEL, 0x2030, 0x060400)
                .driver("pcieport")
                .group(99)
                .numa(1),
        )
        .function(
            PciFunctionSpec::new(VGPU_PF, parent, NVIDIA, A10, 0x030200)
                .driver("nvidia")
                .group(100)
                .numa(1)
                .sriov_pf(32),
        );
    for (vf, group, t) in VGPU_VFS {
        m = m.function(
            PciFunctionSpec::new(vf, parent, NVIDIA, A10, 0x030200)
                .driver("nvidia")
                .group(group)
                .numa(1)
                .sriov_vf(VGPU_PF)
                .vgpu_type(t),
        );
    }
    m
}

/// An NVIDIA vGPU host with SR-IOV virtual functions (see [`vgpu_vf_host_spec`]).
pub fn vgpu_vf_host() -> io::Result<HostRoot> {
    vgpu_vf_host_spec().build()
}

/// `n` NVIDIA A10 functions on `vfio-pci`, each in its own IOMMU group, 8 per root complex,
/// alternating NUMA nodes by root complex: the benchmark machine.
pub fn generated_spec(n: usize) -> PciMachine {
    let mut m = PciMachine::new();
    for i in 0..n {
        let domain = i / (8 * 255);
        let bus = ((i / 8) % 255) + 1;
        let addr = format!("{domain:04x}:{bus:02x}:{:02x}.0", i % 8);
        let parent = format!("pci{domain:04x}:{:02x}", bus - 1);
        m = m.function(
            PciFunctionSpec::new(&addr, &parent, NVIDIA, A10, 0x030200)
                .driver(VFIO_PCI)
                .group(1000 + i as u32)
                .numa(((i / 8) % 2) as i64),
        );
    }
    m
}

/// A host root with `n` PCI functions (see [`generated_spec`]).
pub fn generated(n: usize) -> io::Result<HostRoot> {
    generated_spec(n).build()
}
