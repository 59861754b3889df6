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

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::hostroot::HostRoot;

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

/// Plays the kernel's part for driver binding in a fake root, on a background thread that
/// polls every millisecond:
///
/// - an address written to `/sys/bus/pci/drivers/<d>/unbind` unbinds the function from `d`
///   (and removes `/dev/vfio/<group>` when the last `vfio-pci` function of the group leaves);
/// - an address written to `/sys/bus/pci/drivers_probe` binds an unbound function to the driver
///   named in its `driver_override`, or to the driver it had when the simulator started (unless
///   that was `vfio-pci`);
/// - an address written to `/sys/bus/pci/drivers/<d>/bind` binds an unbound function to `d`,
///   unless its `driver_override` names another driver;
/// - writing a newline to `driver_override` clears it (reads back `(null)`).
///
/// Binding to `vfio-pci` creates `/dev/vfio/<group>`. Within one poll unbinds run before probes
/// and binds, so a writer that waits for each effect before its next write of the same file
/// sees what the kernel would do. Stops when dropped.
#[derive(Debug)]
pub struct PciKernelSim {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PciKernelSim {
    /// Starts simulating on the root at `root` (the path of a [`HostRoot`]).
    pub fn start(root: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let root = root.to_path_buf();
        let native = current_drivers(&root);
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(Ordering::Relaxed) {
                    sim_step(&root, &native);
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        PciKernelSim {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for PciKernelSim {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn under(root: &Path, host: &str) -> PathBuf {
    root.join(host.trim_start_matches('/'))
}

fn link_name(p: &Path) -> Option<String> {
    std::fs::read_link(p)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Address → driver of every function now bound to something other than vfio-pci.
fn current_drivers(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(under(root, "/sys/bus/pci/devices")) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let addr = e.file_name().to_string_lossy().into_owned();
        if let Some(d) = link_name(&e.path().join("driver"))
            && d != VFIO_PCI
        {
            out.insert(addr, d);
        }
    }
    out
}

/// Takes a request out of a control file: its trimmed content, leaving the file empty.
fn take_request(p: &Path) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim().to_owned();
    if s.is_empty() {
        return None;
    }
    std::fs::write(p, "").ok()?;
    Some(s)
}

/// The function's sysfs directory (the target of its `/sys/bus/pci/devices` link).
fn device_dir(root: &Path, addr: &str) -> Option<PathBuf> {
    let link = under(root, &format!("/sys/bus/pci/devices/{addr}"));
    let target = std::fs::read_link(&link).ok()?;
    let dir = link.parent()?.join(target);
    dir.exists().then_some(dir)
}

fn group_of(dev_dir: &Path) -> Option<String> {
    link_name(&dev_dir.join("iommu_group"))
}

fn sim_unbind(root: &Path, driver: &str, addr: &str) {
    let Some(dir) = device_dir(root, addr) else {
        return;
    };
    if link_name(&dir.join("driver")).as_deref() != Some(driver) {
        return;
    }
    // The group node goes first: once the driver link is gone, so is the node.
    if driver == VFIO_PCI
        && let Some(g) = group_of(&dir)
    {
        let members = under(root, &format!("/sys/kernel/iommu_groups/{g}/devices"));
        let still_vfio = std::fs::read_dir(members)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy() != addr)
                    .any(|e| link_name(&e.path().join("driver")).as_deref() == Some(VFIO_PCI))
            })
            .unwrap_or(false);
        if !still_vfio {
            let _ = std::fs::remove_file(under(root, &format!("/dev/vfio/{g}")));
        }
    }
    let _ = std::fs::remove_file(under(
        root,
        &format!("/sys/bus/pci/drivers/{driver}/{addr}"),
    ));
    let _ = std::fs::remove_file(dir.join("driver"));
}

fn sim_bind(root: &Path, driver: &str, addr: &str) {
    let Some(dir) = device_dir(root, addr) else {
        return;
    };
    if dir.join("driver").symlink_metadata().is_ok() {
        return;
    }
    let override_ = std::fs::read_to_string(dir.join("driver_override")).unwrap_or_default();
    let override_ = override_.trim();
    if !override_.is_empty() && override_ != "(null)" && override_ != driver {
        return;
    }
    let drv_dir = under(root, &format!("/sys/bus/pci/drivers/{driver}"));
    if !drv_dir.is_dir() {
        return;
    }
    let host_dir = format!(
        "/{}",
        dir.strip_prefix(root)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    );
    let rel_dir = host_dir.trim_start_matches("/sys/").to_owned();
    // The group node first: once the driver link shows, the node is there.
    if driver == VFIO_PCI
        && let Some(g) = group_of(&dir)
    {
        let _ = std::fs::create_dir_all(under(root, "/dev/vfio"));
        let _ = std::fs::write(under(root, &format!("/dev/vfio/{g}")), "");
    }
    let _ = std::os::unix::fs::symlink(
        rel_from(&format!("/sys/bus/pci/drivers/{driver}"), &rel_dir),
        drv_dir.join(addr),
    );
    let _ = std::os::unix::fs::symlink(
        rel_from(&host_dir, &format!("bus/pci/drivers/{driver}")),
        dir.join("driver"),
    );
}

fn sim_step(root: &Path, native: &BTreeMap<String, String>) {
    let drivers_dir = under(root, "/sys/bus/pci/drivers");
    let mut drivers: Vec<String> = std::fs::read_dir(&drivers_dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    drivers.sort();
    // driver_override: writing a lone newline clears it. (An empty file is a write in
    // progress: left alone.)
    if let Ok(rd) = std::fs::read_dir(under(root, "/sys/bus/pci/devices")) {
        for e in rd.filter_map(Result::ok) {
            let p = e.path().join("driver_override");
            if let Ok(s) = std::fs::read_to_string(&p)
                && s == "\n"
            {
                let _ = std::fs::write(&p, "(null)\n");
            }
        }
    }
    for d in &drivers {
        if let Some(addr) = take_request(&drivers_dir.join(d).join("unbind")) {
            sim_unbind(root, d, &addr);
        }
    }
    if let Some(addr) = take_request(&under(root, "/sys/bus/pci/drivers_probe"))
        && let Some(dir) = device_dir(root, &addr)
    {
        let override_ = std::fs::read_to_string(dir.join("driver_override")).unwrap_or_default();
        let override_ = override_.trim();
        let target = if !override_.is_empty() && override_ != "(null)" {
            Some(override_.to_owned())
        } else {
            native.get(&addr).cloned()
        };
        if let Some(t) = target {
            sim_bind(root, &t, &addr);
        }
    }
    for d in &drivers {
        if let Some(addr) = take_request(&drivers_dir.join(d).join("bind")) {
            sim_bind(root, d, &addr);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn gpu_server_links_look_like_sysfs() {
        let root = dual_socket_gpu_server().unwrap();
        let link = std::fs::read_link(root.join("/sys/bus/pci/devices/0000:3b:00.0")).unwrap();
        assert_eq!(
            link,
            Path::new("../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0")
        );
        let dev = root.join("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
        assert_eq!(
            std::fs::read_link(dev.join("iommu_group")).unwrap(),
            Path::new("../../../../kernel/iommu_groups/20")
        );
        assert_eq!(
            std::fs::read_link(dev.join("driver")).unwrap(),
            Path::new("../../../../bus/pci/drivers/vfio-pci")
        );
        // The links resolve inside the root.
        assert!(
            root.join("/sys/bus/pci/devices/0000:3b:00.0/vendor")
                .exists()
        );
        assert!(
            root.join("/sys/bus/pci/devices/0000:3b:00.0/iommu_group/type")
                .exists()
        );
        assert!(
            root.join("/sys/bus/pci/devices/0000:3b:00.0/driver/bind")
                .exists()
        );
        assert!(
            root.join("/sys/kernel/iommu_groups/20/devices/0000:3b:00.0/vendor")
                .exists()
        );
        for g in [20, 30, 40, 50] {
            assert!(root.join(format!("/dev/vfio/{g}")).exists());
        }
        assert!(!root.join("/dev/vfio/2").exists(), "nvme is not on vfio");
        assert!(root.join("/dev/vfio/vfio").exists());
    }

    #[test]
    fn sriov_links_point_both_ways() {
        let root = sriov_nic().unwrap();
        let vf = root.join("/sys/bus/pci/devices/0000:5e:02.3");
        assert_eq!(
            std::fs::read_link(vf.join("physfn")).unwrap(),
            Path::new("../0000:5e:00.0")
        );
        assert!(vf.join("physfn/sriov_totalvfs").exists());
        let pf = root.join("/sys/bus/pci/devices/0000:5e:00.0");
        assert_eq!(
            std::fs::read_link(pf.join("virtfn3")).unwrap(),
            Path::new("../0000:5e:02.3")
        );
        assert_eq!(
            std::fs::read_to_string(pf.join("sriov_numvfs")).unwrap(),
            "8\n"
        );
    }

    #[test]
    fn kernel_sim_rebinds_and_restores() {
        let root = sriov_nic().unwrap();
        let sim = PciKernelSim::start(root.path());
        let pf = root.join("/sys/bus/pci/devices/0000:5e:00.0");
        let wait = |want: Option<&str>| {
            for _ in 0..2000 {
                if link_name(&pf.join("driver")).as_deref() == want {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            panic!("driver never became {want:?}");
        };
        std::fs::write(pf.join("driver_override"), "vfio-pci").unwrap();
        std::fs::write(
            root.join("/sys/bus/pci/drivers/i40e/unbind"),
            "0000:5e:00.0",
        )
        .unwrap();
        wait(None);
        std::fs::write(root.join("/sys/bus/pci/drivers_probe"), "0000:5e:00.0").unwrap();
        wait(Some(VFIO_PCI));
        assert!(root.join("/dev/vfio/30").exists());
        std::fs::write(pf.join("driver_override"), "\n").unwrap();
        std::fs::write(
            root.join("/sys/bus/pci/drivers/vfio-pci/unbind"),
            "0000:5e:00.0",
        )
        .unwrap();
        wait(None);
        assert!(!root.join("/dev/vfio/30").exists());
        std::fs::write(root.join("/sys/bus/pci/drivers/i40e/bind"), "0000:5e:00.0").unwrap();
        wait(Some("i40e"));
        drop(sim);
    }

    #[test]
    fn generated_machine_has_n_functions() {
        let root = generated(20).unwrap();
        let n = std::fs::read_dir(root.join("/sys/bus/pci/devices"))
            .unwrap()
            .count();
        assert_eq!(n, 20);
        assert!(root.join("/dev/vfio/1019").exists());
    }
}
