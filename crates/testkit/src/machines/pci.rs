//! Fake PCI machines: `/sys/bus/pci`, `/sys/devices/pci*`, `/sys/kernel/iommu_groups` and
//! `/dev/vfio` laid out as Linux lays them out, with relative symlinks like the real ones:
//!
//! ```text
//! /sys/bus/pci/devices/0000:3b:00.0 -> ../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0
//! /sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/iommu_group -> ../../../../kernel/iommu_groups/20
//! /sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/driver -> ../../../../bus/pci/drivers/vfio-pci
//! /sys/kernel/iommu_groups/20/devices/0000:3b:00.0 -> ../../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0
//! /dev/vfio/vfio, /dev/vfio/20
//! ```
//!
//! Machines: [`dual_socket_gpu_server`], [`sriov_nic`], [`vgpu_vf_host`], [`generated`]; any other
//! layout with [`PciMachine`]. [`PciKernelSim`] plays the kernel's part when a test writes to
//! `driver_override`, `unbind`, `bind` and `drivers_probe`.

mod kernel_sim;
mod machines;

use std::collections::BTreeSet;
use std::io;

use crate::hostroot::HostRoot;

pub use kernel_sim::PciKernelSim;
pub use machines::{
    A10, GPU_SERVER_GPUS, INTEL, NIC_PF, NIC_VFS, NVIDIA, T4, VGPU_PF, VGPU_VFS,
    dual_socket_gpu_server, dual_socket_gpu_server_spec, generated, generated_spec, sriov_nic,
    sriov_nic_spec, vgpu_vf_host, vgpu_vf_host_spec,
};

/// The driver name Linux uses for VFIO PCI passthrough.
pub const VFIO_PCI: &str = "vfio-pci";

/// One PCI function to lay out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciFunctionSpec {
    /// The PCI address in extended BDF form, e.g. `0000:3b:00.0`.
    pub address: String,
    /// Where the function hangs under `/sys/devices`: the root complex and the bridges above it,
    /// e.g. `pci0000:3a/0000:3a:00.0`.
    pub parent: String,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Class code (24 bits, e.g. `0x030200` for a 3D controller).
    pub class: u32,
    /// The bound driver, if any.
    pub driver: Option<String>,
    /// The IOMMU group, if the IOMMU is on.
    pub iommu_group: Option<u32>,
    /// The NUMA node (`-1` when the platform does not say).
    pub numa_node: i64,
    /// `sriov_totalvfs` of a physical function.
    pub sriov_totalvfs: Option<u32>,
    /// The physical function's address, for a virtual function (it must be a sibling, as on
    /// real machines).
    pub physfn: Option<String>,
    /// `nvidia/current_vgpu_type` of an NVIDIA vGPU virtual function.
    pub vgpu_type: Option<u32>,
}

impl PciFunctionSpec {
    /// A function with the given address, parent, IDs and class, no driver, no IOMMU group and
    /// NUMA node -1.
    pub fn new(address: &str, parent: &str, vendor: u16, device: u16, class: u32) -> Self {
        PciFunctionSpec {
            address: address.to_owned(),
            parent: parent.to_owned(),
            vendor,
            device,
            class,
            driver: None,
            iommu_group: None,
            numa_node: -1,
            sriov_totalvfs: None,
            physfn: None,
            vgpu_type: None,
        }
    }

    /// Sets the driver (builder style).
    pub fn driver(mut self, driver: &str) -> Self {
        self.driver = Some(driver.to_owned());
        self
    }

    /// Sets the IOMMU group (builder style).
    pub fn group(mut self, group: u32) -> Self {
        self.iommu_group = Some(group);
        self
    }

    /// Sets the NUMA node (builder style).
    pub fn numa(mut self, node: i64) -> Self {
        self.numa_node = node;
        self
    }

    /// Makes the function an SR-IOV physical function (builder style).
    pub fn sriov_pf(mut self, total_vfs: u32) -> Self {
        self.sriov_totalvfs = Some(total_vfs);
        self
    }

    /// Makes the function a virtual function of `pf` (builder style).
    pub fn sriov_vf(mut self, pf: &str) -> Self {
        self.physfn = Some(pf.to_owned());
        self
    }

    /// Sets `nvidia/current_vgpu_type` (builder style).
    pub fn vgpu_type(mut self, vgpu_type: u32) -> Self {
        self.vgpu_type = Some(vgpu_type);
        self
    }

    /// The function's directory as a host path, e.g.
    /// `/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0`.
    pub fn sysfs_dir(&self) -> String {
        format!("/sys/devices/{}/{}", self.parent, self.address)
    }

    /// The PCIe root complex (first component of the parent), e.g. `pci0000:3a`.
    pub fn pcie_root(&self) -> &str {
        self.parent.split('/').next().unwrap_or(&self.parent)
    }
}

/// `n` times `../`.
fn up(n: usize) -> String {
    "../".repeat(n)
}

/// How many components a host path under `/sys` has below `/sys` (`/sys/a/b` → 2).
fn depth_below_sys(host_path: &str) -> usize {
    host_path
        .trim_start_matches("/sys/")
        .split('/')
        .filter(|c| !c.is_empty())
        .count()
}

/// A relative link target from directory `from_dir` (a host path under `/sys`) to `to` (a path
/// relative to `/sys`).
fn rel_from(from_dir: &str, to: &str) -> String {
    format!("{}{}", up(depth_below_sys(from_dir)), to)
}

/// A fake machine's PCI tree: a list of functions written into a [`HostRoot`].
#[derive(Debug, Default, Clone)]
pub struct PciMachine {
    functions: Vec<PciFunctionSpec>,
}

impl PciMachine {
    /// An empty machine.
    pub fn new() -> Self {
        PciMachine::default()
    }

    /// Adds a function (builder style).
    pub fn function(mut self, f: PciFunctionSpec) -> Self {
        self.functions.push(f);
        self
    }

    /// The functions, in the order they were added.
    pub fn functions(&self) -> &[PciFunctionSpec] {
        &self.functions
    }

    /// Writes the machine into a new host root.
    pub fn build(&self) -> io::Result<HostRoot> {
        let root = HostRoot::new()?;
        self.write_into(&root)?;
        Ok(root)
    }

    /// Writes the machine into an existing host root (e.g. next to an mdev tree).
    pub fn write_into(&self, root: &HostRoot) -> io::Result<()> {
        root.dir("/sys/bus/pci/devices")?;
        root.file("/sys/bus/pci/drivers_probe", "")?;
        root.file("/sys/bus/pci/rescan", "")?;
        // vfio-pci is always loaded on these machines, bound or not.
        add_driver(root, VFIO_PCI)?;
        for f in &self.functions {
            add_function(root, f)?;
        }
        let mut vfio_groups = BTreeSet::new();
        for f in &self.functions {
            let on_vfio = f.driver.as_deref() == Some(VFIO_PCI);
            let vgpu_vf = f.driver.as_deref() == Some("nvidia")
                && f.physfn.is_some()
                && f.vgpu_type.is_some_and(|t| t != 0);
            if let (Some(g), true) = (f.iommu_group, on_vfio || vgpu_vf) {
                vfio_groups.insert(g);
            }
        }
        root.device_node("/dev/vfio/vfio")?;
        for g in vfio_groups {
            root.device_node(format!("/dev/vfio/{g}"))?;
        }
        Ok(())
    }
}

/// Creates `/sys/bus/pci/drivers/<name>` with its `bind`, `unbind`, `new_id` and `remove_id`
/// files, if it is not there yet.
pub fn add_driver(root: &HostRoot, name: &str) -> io::Result<()> {
    let dir = format!("/sys/bus/pci/drivers/{name}");
    if root.join(&dir).exists() {
        return Ok(());
    }
    for file in ["bind", "unbind", "new_id", "remove_id"] {
        root.file(format!("{dir}/{file}"), "")?;
    }
    Ok(())
}

/// Writes one PCI function: its sysfs directory and attributes, its `/sys/bus/pci/devices` link,
/// its driver and IOMMU group links (both ways), SR-IOV links and files. Does not create
/// `/dev/vfio` nodes.
pub fn add_function(root: &HostRoot, f: &PciFunctionSpec) -> io::Result<()> {
    let dir = f.sysfs_dir();
    let rel_dir = dir.trim_start_matches("/sys/");
    root.dir(&dir)?;
    root.file(format!("{dir}/vendor"), format!("0x{:04x}\n", f.vendor))?;
    root.file(format!("{dir}/device"), format!("0x{:04x}\n", f.device))?;
    root.file(format!("{dir}/class"), format!("0x{:06x}\n", f.class))?;
    root.file(
        format!("{dir}/subsystem_vendor"),
        format!("0x{:04x}\n", f.vendor),
    )?;
    root.file(format!("{dir}/subsystem_device"), "0x0000\n")?;
    root.file(format!("{dir}/numa_node"), format!("{}\n", f.numa_node))?;
    root.file(format!("{dir}/driver_override"), "(null)\n")?;
    root.file(format!("{dir}/enable"), "1\n")?;
    root.file(
        format!("{dir}/uevent"),
        format!(
            "PCI_CLASS={:X}\nPCI_ID={:04X}:{:04X}\nPCI_SLOT_NAME={}\n{}",
            f.class,
            f.vendor,
            f.device,
            f.address,
            f.driver
                .as_ref()
                .map(|d| format!("DRIVER={d}\n"))
                .unwrap_or_default()
        ),
    )?;
    root.link(
        format!("/sys/bus/pci/devices/{}", f.address),
        rel_from("/sys/bus/pci/devices", rel_dir),
    )?;
    if let Some(driver) = &f.driver {
        bind_links(root, f, driver)?;
    }
    if let Some(g) = f.iommu_group {
        let group_dir = format!("/sys/kernel/iommu_groups/{g}");
        root.file(format!("{group_dir}/type"), "DMA\n")?;
        root.link(
            format!("{dir}/iommu_group"),
            rel_from(&dir, &format!("kernel/iommu_groups/{g}")),
        )?;
        root.link(
            format!("{group_dir}/devices/{}", f.address),
            rel_from(&format!("{group_dir}/devices"), rel_dir),
        )?;
    }
    if let Some(total) = f.sriov_totalvfs {
        root.file(format!("{dir}/sriov_totalvfs"), format!("{total}\n"))?;
        root.file(format!("{dir}/sriov_numvfs"), "0\n")?;
    }
    if let Some(pf) = &f.physfn {
        root.link(format!("{dir}/physfn"), format!("../{pf}"))?;
        let pf_dir = format!("/sys/devices/{}/{pf}", f.parent);
        // virtfnN on the PF: N counts the VFs laid out so far.
        let n = std::fs::read_dir(root.join(&pf_dir))
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with("virtfn"))
                    .count()
            })
            .unwrap_or(0);
        root.link(format!("{pf_dir}/virtfn{n}"), format!("../{}", f.address))?;
        root.file(format!("{pf_dir}/sriov_numvfs"), format!("{}\n", n + 1))?;
    }
    if let Some(t) = f.vgpu_type {
        root.file(format!("{dir}/nvidia/current_vgpu_type"), format!("{t}\n"))?;
        root.file(format!("{dir}/nvidia/creatable_vgpu_types"), "")?;
    }
    Ok(())
}

/// Creates the `driver` link of `f` and the driver's link back to the device.
fn bind_links(root: &HostRoot, f: &PciFunctionSpec, driver: &str) -> io::Result<()> {
    let dir = f.sysfs_dir();
    let rel_dir = dir.trim_start_matches("/sys/");
    add_driver(root, driver)?;
    root.link(
        format!("{dir}/driver"),
        rel_from(&dir, &format!("bus/pci/drivers/{driver}")),
    )?;
    let drv_dir = format!("/sys/bus/pci/drivers/{driver}");
    root.link(
        format!("{drv_dir}/{}", f.address),
        rel_from(&drv_dir, rel_dir),
    )?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
