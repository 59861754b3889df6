//! Fake mediated-device (mdev) machines: parent PCI devices with `mdev_supported_types`,
//! `/sys/class/mdev_bus`, and instances under `/sys/bus/mdev/devices` laid out as Linux does:
//!
//! ```text
//! /sys/class/mdev_bus/0000:3b:00.0 -> ../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0
//! /sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/mdev_supported_types/nvidia-222/
//!     name ("GRID T4-1B"), available_instances, device_api, description, create, devices/
//! /sys/bus/mdev/devices/<uuid> -> ../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/<uuid>
//! /sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/<uuid>/
//!     mdev_type -> ../mdev_supported_types/nvidia-222, iommu_group -> ../../../../../kernel/iommu_groups/200,
//!     remove
//! /dev/vfio/200
//! ```
//!
//! Availability follows NVIDIA's vGPU rule: once a parent has instances of one type, every
//! other type of that parent has 0 available instances. [`MdevKernelSim`] plays the kernel's
//! part for writes to `create` and `remove`.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::pci::{INTEL, NVIDIA, PciFunctionSpec, PciMachine, T4};
use crate::hostroot::HostRoot;

/// One mdev type a parent supports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevTypeSpec {
    /// The type's directory name, e.g. `nvidia-222`.
    pub id: String,
    /// The `name` attribute (e.g. `GRID T4-1B`); Intel GVT-g types have none.
    pub name: Option<String>,
    /// How many instances fit on an otherwise empty parent.
    pub max_instances: u32,
}

impl MdevTypeSpec {
    /// A type with a `name` file.
    pub fn named(id: &str, name: &str, max_instances: u32) -> Self {
        MdevTypeSpec {
            id: id.to_owned(),
            name: Some(name.to_owned()),
            max_instances,
        }
    }

    /// A type without a `name` file.
    pub fn unnamed(id: &str, max_instances: u32) -> Self {
        MdevTypeSpec {
            id: id.to_owned(),
            name: None,
            max_instances,
        }
    }
}

/// A PCI device that can host mdev instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevParentSpec {
    /// The parent's PCI function.
    pub function: PciFunctionSpec,
    /// The types it supports.
    pub types: Vec<MdevTypeSpec>,
}

/// One existing mdev instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevInstanceSpec {
    /// The instance UUID (lowercase, with dashes).
    pub uuid: String,
    /// The parent's PCI address.
    pub parent: String,
    /// The type's directory name.
    pub type_id: String,
    /// The instance's IOMMU group.
    pub iommu_group: u32,
}

/// A fake mdev machine: parents (with their types) and instances.
#[derive(Debug, Clone, Default)]
pub struct MdevMachine {
    /// The parents.
    pub parents: Vec<MdevParentSpec>,
    /// The instances present at start.
    pub instances: Vec<MdevInstanceSpec>,
}

/// The T4 GPUs of [`vgpu_mdev_host`]: address, NUMA node, IOMMU group of the GPU, PCIe root.
pub const MDEV_GPUS: [(&str, i64, u32, &str); 2] = [
    ("0000:3b:00.0", 0, 20, "pci0000:3a"),
    ("0000:d8:00.0", 1, 50, "pci0000:d7"),
];

/// The Intel iGPU of [`vgpu_mdev_host`] (GVT-g).
pub const MDEV_IGPU: &str = "0000:00:02.0";

/// The instances of [`vgpu_mdev_host`]: UUID, parent, type, IOMMU group.
pub const MDEV_INSTANCES: [(&str, &str, &str, u32); 3] = [
    (
        "4b20d080-1b54-4048-85b3-a6a62d165c01",
        "0000:3b:00.0",
        "nvidia-222",
        200,
    ),
    (
        "4b20d080-1b54-4048-85b3-a6a62d165c02",
        "0000:3b:00.0",
        "nvidia-222",
        201,
    ),
    (
        "4b20d080-1b54-4048-85b3-a6a62d165c03",
        MDEV_IGPU,
        "i915-GVTg_V5_4",
        202,
    ),
];

/// The T4 types of [`vgpu_mdev_host`].
pub fn t4_types() -> Vec<MdevTypeSpec> {
    vec![
        MdevTypeSpec::named("nvidia-222", "GRID T4-1B", 16),
        MdevTypeSpec::named("nvidia-223", "GRID T4-2B", 8),
        MdevTypeSpec::named("nvidia-230", "GRID T4-16Q", 1),
    ]
}

/// An NVIDIA vGPU host: two Tesla T4 (`10de:1eb8`, driver `nvidia`) on NUMA nodes 0 and 1 with
/// types `nvidia-222` ("GRID T4-1B", 16), `nvidia-223` ("GRID T4-2B", 8) and `nvidia-230`
/// ("GRID T4-16Q", 1); the first T4 has two `nvidia-222` instances. Plus an Intel iGPU with
/// GVT-g type `i915-GVTg_V5_4` (no `name` file) and one instance. See [`MDEV_INSTANCES`].
pub fn vgpu_mdev_host_spec() -> MdevMachine {
    let mut parents = Vec::new();
    for (addr, numa, group, root) in MDEV_GPUS {
        let port = format!("{}:00.0", &root[3..]);
        parents.push(MdevParentSpec {
            function: PciFunctionSpec::new(addr, &format!("{root}/{port}"), NVIDIA, T4, 0x030200)
                .driver("nvidia")
                .group(group)
                .numa(numa),
            types: t4_types(),
        });
    }
    parents.push(MdevParentSpec {
        function: PciFunctionSpec::new(MDEV_IGPU, "pci0000:00", INTEL, 0x3e92, 0x030000)
            .driver("i915")
            .group(1)
            .numa(-1),
        types: vec![MdevTypeSpec::unnamed("i915-GVTg_V5_4", 2)],
    });
    let instances = MDEV_INSTANCES
        .iter()
        .map(|(uuid, parent, t, g)| MdevInstanceSpec {
            uuid: (*uuid).to_owned(),
            parent: (*parent).to_owned(),
            type_id: (*t).to_owned(),
            iommu_group: *g,
        })
        .collect();
    MdevMachine { parents, instances }
}

/// The NVIDIA vGPU host of [`vgpu_mdev_host_spec`], written into a new host root.
pub fn vgpu_mdev_host() -> io::Result<HostRoot> {
    vgpu_mdev_host_spec().build()
}

fn under(root: &Path, host: &str) -> PathBuf {
    root.join(host.trim_start_matches('/'))
}

fn put(root: &Path, host: &str, contents: &str) -> io::Result<()> {
    let p = under(root, host);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(p, contents)
}

fn ln(root: &Path, host: &str, target: &str) -> io::Result<()> {
    let p = under(root, host);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let _ = std::fs::remove_file(&p);
    std::os::unix::fs::symlink(target, p)
}

fn depth_below_sys(host_path: &str) -> usize {
    host_path
        .trim_start_matches("/sys/")
        .split('/')
        .filter(|c| !c.is_empty())
        .count()
}

fn rel_from(from_dir: &str, to: &str) -> String {
    format!("{}{}", "../".repeat(depth_below_sys(from_dir)), to)
}

impl MdevMachine {
    /// Writes the machine into a new host root.
    pub fn build(&self) -> io::Result<HostRoot> {
        let root = HostRoot::new()?;
        self.write_into(&root)?;
        Ok(root)
    }

    /// Writes the machine into an existing host root.
    pub fn write_into(&self, root: &HostRoot) -> io::Result<()> {
        let pci = self
            .parents
            .iter()
            .fold(PciMachine::new(), |m, p| m.function(p.function.clone()));
        pci.write_into(root)?;
        let r = root.path();
        std::fs::create_dir_all(under(r, "/sys/bus/mdev/devices"))?;
        for f in ["bind", "unbind"] {
            put(r, &format!("/sys/bus/mdev/drivers/vfio_mdev/{f}"), "")?;
        }
        for p in &self.parents {
            let dir = p.function.sysfs_dir();
            ln(
                r,
                &format!("/sys/class/mdev_bus/{}", p.function.address),
                &rel_from("/sys/class/mdev_bus", dir.trim_start_matches("/sys/")),
            )?;
            for t in &p.types {
                let tdir = format!("{dir}/mdev_supported_types/{}", t.id);
                if let Some(name) = &t.name {
                    put(r, &format!("{tdir}/name"), &format!("{name}\n"))?;
                }
                put(r, &format!("{tdir}/device_api"), "vfio-pci\n")?;
                put(
                    r,
                    &format!("{tdir}/description"),
                    &format!("max_instance={}\n", t.max_instances),
                )?;
                put(r, &format!("{tdir}/create"), "")?;
                std::fs::create_dir_all(under(r, &format!("{tdir}/devices")))?;
            }
        }
        for i in &self.instances {
            create_instance(r, self, &i.parent, &i.type_id, &i.uuid, i.iommu_group)?;
        }
        for p in &self.parents {
            update_available(r, p)?;
        }
        Ok(())
    }

    fn parent(&self, address: &str) -> Option<&MdevParentSpec> {
        self.parents.iter().find(|p| p.function.address == address)
    }
}

/// Creates one instance's directory and links, and its `/dev/vfio` node.
fn create_instance(
    r: &Path,
    m: &MdevMachine,
    parent: &str,
    type_id: &str,
    uuid: &str,
    group: u32,
) -> io::Result<()> {
    let Some(p) = m.parent(parent) else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no mdev parent {parent}"),
        ));
    };
    let pdir = p.function.sysfs_dir();
    let dir = format!("{pdir}/{uuid}");
    let rel_dir = dir.trim_start_matches("/sys/").to_owned();
    put(r, &format!("{dir}/remove"), "")?;
    put(
        r,
        &format!("{dir}/uevent"),
        &format!("MDEV_TYPE={type_id}\n"),
    )?;
    ln(
        r,
        &format!("{dir}/mdev_type"),
        &format!("../mdev_supported_types/{type_id}"),
    )?;
    ln(
        r,
        &format!("{dir}/iommu_group"),
        &rel_from(&dir, &format!("kernel/iommu_groups/{group}")),
    )?;
    ln(
        r,
        &format!("{dir}/driver"),
        &rel_from(&dir, "bus/mdev/drivers/vfio_mdev"),
    )?;
    ln(
        r,
        &format!("{pdir}/mdev_supported_types/{type_id}/devices/{uuid}"),
        &format!("../../../{uuid}"),
    )?;
    let gdir = format!("/sys/kernel/iommu_groups/{group}");
    put(r, &format!("{gdir}/type"), "identity\n")?;
    ln(
        r,
        &format!("{gdir}/devices/{uuid}"),
        &rel_from(&format!("{gdir}/devices"), &rel_dir),
    )?;
    put(r, &format!("/dev/vfio/{group}"), "")?;
    // Availability changes with the instance, before it shows on the bus.
    update_available(r, p)?;
    ln(
        r,
        &format!("/sys/bus/mdev/devices/{uuid}"),
        &rel_from("/sys/bus/mdev/devices", &rel_dir),
    )?;
    Ok(())
}

/// Removes one instance: its directory, links, IOMMU group and `/dev/vfio` node; availability
/// is updated before the instance leaves the bus.
fn remove_instance(
    r: &Path,
    p: Option<&MdevParentSpec>,
    inst_dir: &Path,
    uuid: &str,
) -> io::Result<()> {
    let group = std::fs::read_link(inst_dir.join("iommu_group"))
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
    if let Some(t) = std::fs::read_link(inst_dir.join("mdev_type"))
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
        && let Some(pdir) = inst_dir.parent()
    {
        let _ = std::fs::remove_file(pdir.join(format!("mdev_supported_types/{t}/devices/{uuid}")));
    }
    if let Some(p) = p {
        update_available(r, p)?;
    }
    std::fs::remove_dir_all(inst_dir)?;
    if let Some(g) = group {
        let _ = std::fs::remove_dir_all(under(r, &format!("/sys/kernel/iommu_groups/{g}")));
        let _ = std::fs::remove_file(under(r, &format!("/dev/vfio/{g}")));
    }
    std::fs::remove_file(under(r, &format!("/sys/bus/mdev/devices/{uuid}")))
}

/// Instances per type on a parent.
fn counts(r: &Path, p: &MdevParentSpec) -> Vec<(String, u32)> {
    let dir = p.function.sysfs_dir();
    p.types
        .iter()
        .map(|t| {
            let n = std::fs::read_dir(under(
                r,
                &format!("{dir}/mdev_supported_types/{}/devices", t.id),
            ))
            .map(|rd| rd.count() as u32)
            .unwrap_or(0);
            (t.id.clone(), n)
        })
        .collect()
}

/// Rewrites `available_instances` of every type of `p` (NVIDIA's one-type-per-GPU rule).
fn update_available(r: &Path, p: &MdevParentSpec) -> io::Result<()> {
    let counts = counts(r, p);
    let dir = p.function.sysfs_dir();
    for t in &p.types {
        let mine = counts
            .iter()
            .find(|(id, _)| *id == t.id)
            .map_or(0, |(_, n)| *n);
        let others = counts.iter().any(|(id, n)| *id != t.id && *n > 0);
        let avail = if others {
            0
        } else {
            t.max_instances.saturating_sub(mine)
        };
        put(
            r,
            &format!("{dir}/mdev_supported_types/{}/available_instances", t.id),
            &format!("{avail}\n"),
        )?;
    }
    Ok(())
}

/// Plays the kernel's part for mdev `create` and `remove` writes in a fake root, on a
/// background thread polling every millisecond: a UUID written to a type's `create` makes an
/// instance (in a new IOMMU group, with its `/dev/vfio` node) when the type has an available
/// instance; `1` written to an instance's `remove` removes it. Availability is recomputed after
/// each change. Stops when dropped.
#[derive(Debug)]
pub struct MdevKernelSim {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MdevKernelSim {
    /// Starts simulating `machine` on the host root at `root`.
    pub fn start(root: &Path, machine: &MdevMachine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let root = root.to_path_buf();
        let machine = machine.clone();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(Ordering::Relaxed) {
                    mdev_sim_step(&root, &machine);
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        MdevKernelSim {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for MdevKernelSim {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn take_request(p: &Path) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim().to_owned();
    if s.is_empty() {
        return None;
    }
    std::fs::write(p, "").ok()?;
    Some(s)
}

fn next_group(r: &Path) -> u32 {
    let used: BTreeSet<u32> = std::fs::read_dir(under(r, "/sys/kernel/iommu_groups"))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    used.last().map_or(0, |g| g + 1)
}

fn valid_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn mdev_sim_step(r: &Path, m: &MdevMachine) {
    // Removals first.
    if let Ok(rd) = std::fs::read_dir(under(r, "/sys/bus/mdev/devices")) {
        for e in rd.filter_map(Result::ok) {
            let uuid = e.file_name().to_string_lossy().into_owned();
            let Ok(dir) = std::fs::canonicalize(e.path()) else {
                continue;
            };
            if take_request(&dir.join("remove")).as_deref() == Some("1") {
                let parent = m.parents.iter().find(|p| {
                    dir.parent()
                        .and_then(|d| d.file_name())
                        .is_some_and(|n| n.to_string_lossy() == p.function.address)
                });
                let _ = remove_instance(r, parent, &dir, &uuid);
            }
        }
    }
    for p in &m.parents {
        let dir = p.function.sysfs_dir();
        for t in &p.types {
            let create = under(r, &format!("{dir}/mdev_supported_types/{}/create", t.id));
            let Some(uuid) = take_request(&create) else {
                continue;
            };
            let uuid = uuid.to_ascii_lowercase();
            let avail = std::fs::read_to_string(under(
                r,
                &format!("{dir}/mdev_supported_types/{}/available_instances", t.id),
            ))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0);
            let exists = under(r, &format!("/sys/bus/mdev/devices/{uuid}"))
                .symlink_metadata()
                .is_ok();
            if avail == 0 || exists || !valid_uuid(&uuid) {
                continue;
            }
            let g = next_group(r);
            let _ = create_instance(r, m, &p.function.address, &t.id, &uuid, g);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn avail(root: &HostRoot, parent: &str, t: &str) -> String {
        std::fs::read_to_string(root.join(format!(
            "/sys/class/mdev_bus/{parent}/mdev_supported_types/{t}/available_instances"
        )))
        .unwrap()
    }

    #[test]
    fn vgpu_host_lays_out_types_and_instances() {
        let root = vgpu_mdev_host().unwrap();
        let uuid = MDEV_INSTANCES[0].0;
        let inst = root.join(format!("/sys/bus/mdev/devices/{uuid}"));
        assert_eq!(
            std::fs::read_link(&inst).unwrap(),
            Path::new(&format!(
                "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/{uuid}"
            ))
        );
        assert_eq!(
            std::fs::read_to_string(inst.join("mdev_type/name")).unwrap(),
            "GRID T4-1B\n"
        );
        assert!(inst.join("iommu_group/type").exists());
        assert!(root.join("/dev/vfio/200").exists());
        assert_eq!(avail(&root, "0000:3b:00.0", "nvidia-222"), "14\n");
        assert_eq!(avail(&root, "0000:3b:00.0", "nvidia-223"), "0\n");
        assert_eq!(avail(&root, "0000:d8:00.0", "nvidia-223"), "8\n");
        assert!(
            !root
                .join(format!(
                    "/sys/class/mdev_bus/{MDEV_IGPU}/mdev_supported_types/i915-GVTg_V5_4/name"
                ))
                .exists()
        );
    }

    #[test]
    fn sim_creates_and_removes() {
        let spec = vgpu_mdev_host_spec();
        let root = spec.build().unwrap();
        let sim = MdevKernelSim::start(root.path(), &spec);
        let uuid = "11111111-2222-3333-4444-555555555555";
        std::fs::write(
            root.join("/sys/class/mdev_bus/0000:d8:00.0/mdev_supported_types/nvidia-230/create"),
            uuid,
        )
        .unwrap();
        let inst = root.join(format!("/sys/bus/mdev/devices/{uuid}"));
        for _ in 0..2000 {
            if inst.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(inst.exists());
        assert_eq!(avail(&root, "0000:d8:00.0", "nvidia-230"), "0\n");
        assert_eq!(avail(&root, "0000:d8:00.0", "nvidia-222"), "0\n");
        std::fs::write(inst.join("remove"), "1").unwrap();
        for _ in 0..2000 {
            if inst.symlink_metadata().is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(inst.symlink_metadata().is_err());
        assert_eq!(avail(&root, "0000:d8:00.0", "nvidia-222"), "16\n");
        drop(sim);
    }
}
