//! Mediated devices: instances under `/sys/bus/mdev/devices`, parents and their supported types
//! under `/sys/class/mdev_bus`, and the type manager that keeps the wanted types created.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kubedev_core::{AttributeValue, Device, DeviceName, Health, HostFs, HostFsError};

use crate::config::{DesiredRule, VendorDevice, VfioConfig};
use crate::error::VfioError;
use crate::naming::{PciAddress, is_mdev_uuid, mdev_device_name, normalize_type_name};
use crate::pci::{attrs, link_name_opt, pcie_root_of, set, string_attr};
use crate::settle::wait_until;

/// Where the kernel lists mdev instances.
pub const MDEV_DEVICES: &str = "/sys/bus/mdev/devices";
/// Where the kernel lists devices that can parent mdev instances.
pub const MDEV_BUS: &str = "/sys/class/mdev_bus";

/// One mdev instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevInstance {
    /// The UUID (the entry's name in `/sys/bus/mdev/devices`).
    pub uuid: String,
    /// The type's directory name, e.g. `nvidia-222`.
    pub type_id: String,
    /// The type name: `mdev_type/name` if present, else the type's directory name; spaces
    /// replaced by `_` (`GRID_T4-1B`).
    pub type_name: String,
    /// The parent PCI function.
    pub parent: PciAddress,
    /// The instance's IOMMU group.
    pub iommu_group: Option<u32>,
    /// The parent's NUMA node.
    pub numa_node: Option<i64>,
    /// The parent's PCIe root complex.
    pub pcie_root: Option<String>,
}

impl MdevInstance {
    /// The device name, `mdev-<uuid>`.
    pub fn device_name(&self) -> Option<DeviceName> {
        mdev_device_name(&self.uuid)
    }
}

/// Reads every mdev instance. A missing `/sys/bus/mdev` gives an empty list; an unreadable
/// instance is logged (warning, naming the file) and left out.
pub fn scan_mdevs(host: &HostFs) -> Result<Vec<MdevInstance>, VfioError> {
    let names = match host.list_dir(MDEV_DEVICES) {
        Ok(n) => n,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for name in names {
        match read_instance(host, &name) {
            Ok(i) => out.push(i),
            Err(e) => {
                tracing::warn!(entry = %name, error = %kubedev_core::echo::Chain(&e), "skipping unreadable mdev instance")
            }
        }
    }
    Ok(out)
}

fn parse_err(path: &Path, value: &str, expected: &'static str) -> HostFsError {
    HostFsError::Parse {
        path: path.to_path_buf(),
        value: value.to_owned(),
        expected,
    }
}

fn read_instance(host: &HostFs, uuid: &str) -> Result<MdevInstance, VfioError> {
    let entry = Path::new(MDEV_DEVICES).join(uuid);
    if !is_mdev_uuid(uuid) {
        return Err(parse_err(&entry, uuid, "an entry named by a lowercase UUID").into());
    }
    let dir = host.canonicalize(&entry)?;
    let type_link = dir.join("mdev_type");
    let type_id = host.read_link_name(&type_link)?;
    let type_name = match host.read_attr_opt(type_link.join("name"))? {
        Some(n) if !n.trim().is_empty() => normalize_type_name(&n),
        _ => normalize_type_name(&type_id),
    };
    let parent_dir = dir
        .parent()
        .ok_or_else(|| parse_err(&entry, uuid, "an instance below its parent device"))?;
    let parent_name = parent_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let parent = PciAddress::parse(parent_name)
        .ok_or_else(|| parse_err(&entry, parent_name, "an instance below a PCI function"))?;
    let iommu_group = match link_name_opt(host, &dir.join("iommu_group"))? {
        None => None,
        Some(g) => Some(g.parse::<u32>().map_err(|_| {
            parse_err(
                &dir.join("iommu_group"),
                &g,
                "a link to a numbered IOMMU group",
            )
        })?),
    };
    let numa_node = read_numa(host, &parent_dir.join("numa_node"))?;
    Ok(MdevInstance {
        uuid: uuid.to_owned(),
        type_id,
        type_name,
        parent,
        iommu_group,
        numa_node,
        pcie_root: pcie_root_of(parent_dir),
    })
}

fn read_numa(host: &HostFs, p: &Path) -> Result<Option<i64>, HostFsError> {
    match host.read_dec(p) {
        Ok(n) if n >= 0 => Ok(Some(n)),
        Ok(_) => Ok(None),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// One type a parent supports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevType {
    /// The directory name, e.g. `nvidia-222`.
    pub id: String,
    /// The name (spaces → `_`), or the directory name when there is no `name` file.
    pub name: String,
    /// `available_instances` now.
    pub available_instances: u32,
    /// UUIDs of the instances of this type on this parent.
    pub instances: Vec<String>,
}

/// A device that can parent mdev instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevParent {
    /// Its PCI address.
    pub address: PciAddress,
    /// Its vendor and device IDs.
    pub ids: VendorDevice,
    /// Its NUMA node.
    pub numa_node: Option<i64>,
    /// The types it supports, by directory name.
    pub types: Vec<MdevType>,
}

/// Reads every mdev parent and its supported types. A missing `/sys/class/mdev_bus` gives an
/// empty list; an unreadable parent is logged and left out.
pub fn scan_mdev_parents(host: &HostFs) -> Result<Vec<MdevParent>, VfioError> {
    let names = match host.list_dir(MDEV_BUS) {
        Ok(n) => n,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for name in names {
        match read_parent(host, &name) {
            Ok(p) => out.push(p),
            Err(e) => {
                tracing::warn!(entry = %name, error = %kubedev_core::echo::Chain(&e), "skipping unreadable mdev parent")
            }
        }
    }
    Ok(out)
}

fn read_parent(host: &HostFs, name: &str) -> Result<MdevParent, VfioError> {
    let entry = Path::new(MDEV_BUS).join(name);
    let address =
        PciAddress::parse(name).ok_or_else(|| parse_err(&entry, name, "a PCI address"))?;
    let dir = host.canonicalize(&entry)?;
    let vendor = host.read_hex(dir.join("vendor"))?;
    let device = host.read_hex(dir.join("device"))?;
    let ids = VendorDevice {
        vendor: u16::try_from(vendor)
            .map_err(|_| parse_err(&dir.join("vendor"), &vendor.to_string(), "a vendor ID"))?,
        device: u16::try_from(device)
            .map_err(|_| parse_err(&dir.join("device"), &device.to_string(), "a device ID"))?,
    };
    let types_dir = dir.join("mdev_supported_types");
    let mut types = Vec::new();
    for id in host.list_dir(&types_dir)? {
        let tdir = types_dir.join(&id);
        let name = match host.read_attr_opt(tdir.join("name"))? {
            Some(n) if !n.trim().is_empty() => normalize_type_name(&n),
            _ => normalize_type_name(&id),
        };
        let available_instances = match host.read_dec(tdir.join("available_instances")) {
            Ok(n) => u32::try_from(n).unwrap_or(0),
            Err(e) if e.is_not_found() => 0,
            Err(e) => return Err(e.into()),
        };
        let instances = match host.list_dir(tdir.join("devices")) {
            Ok(v) => v.into_iter().filter(|u| is_mdev_uuid(u)).collect(),
            Err(e) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        types.push(MdevType {
            id,
            name,
            available_instances,
            instances,
        });
    }
    Ok(MdevParent {
        address,
        ids,
        numa_node: read_numa(host, &dir.join("numa_node"))?,
        types,
    })
}

/// One offered mdev instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevUnit {
    /// The device name, `mdev-<uuid>`.
    pub name: DeviceName,
    /// The resource name from the matching selector.
    pub resource: String,
    /// The IOMMU group of the instance.
    pub group: u32,
    /// The instance.
    pub instance: MdevInstance,
}

impl MdevUnit {
    /// `/dev/vfio/<group>`.
    pub fn group_node(&self) -> String {
        format!("/dev/vfio/{}", self.group)
    }
}

/// The instances whose type a selector names; the rest are logged at debug level.
pub(crate) fn select_mdevs(
    instances: &[MdevInstance],
    rules: &[crate::config::MdevRule],
) -> Vec<MdevUnit> {
    let mut out = Vec::new();
    for i in instances {
        let skip = |reason: &str| {
            tracing::debug!(uuid = %i.uuid, reason, "mdev instance not offered");
        };
        let Some(rule) = rules
            .iter()
            .find(|r| r.name == i.type_name || r.name == normalize_type_name(&i.type_id))
        else {
            skip(&format!("type {} matches no mdev selector", i.type_name));
            continue;
        };
        let Some(group) = i.iommu_group else {
            skip("has no IOMMU group");
            continue;
        };
        let Some(name) = i.device_name() else {
            skip("UUID does not make a device name");
            continue;
        };
        out.push(MdevUnit {
            name,
            resource: rule.resource.clone(),
            group,
            instance: i.clone(),
        });
    }
    out
}

/// The published device for an mdev unit.
pub(crate) fn mdev_device(u: &MdevUnit, health: Health) -> Device {
    let i = &u.instance;
    let mut d = Device::new(u.name.clone());
    d = set(d, attrs::TYPE, string_attr("mdev"));
    d = set(d, attrs::UUID, string_attr(&i.uuid));
    d = set(d, attrs::MDEV_TYPE, string_attr(&i.type_name));
    d = set(d, attrs::MDEV_TYPE_ID, string_attr(&i.type_id));
    d = set(d, attrs::PARENT_ADDRESS, string_attr(&i.parent.to_string()));
    d = set(
        d,
        attrs::IOMMU_GROUP,
        AttributeValue::Int(i64::from(u.group)),
    );
    d = set(d, attrs::RESOURCE_NAME, string_attr(&u.resource));
    if let Some(n) = i.numa_node {
        d = set(d, attrs::NUMA_NODE, AttributeValue::Int(n)).with_numa_node(n);
    }
    if let Some(root) = &i.pcie_root {
        d = set(d, attrs::PCIE_ROOT, string_attr(root));
    }
    d.health = health;
    d
}

/// The type manager's decision for one parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentPlan {
    /// The parent.
    pub parent: PciAddress,
    /// The type it will hold (directory name), or `None` when it supports none of the wanted
    /// types.
    pub type_id: Option<String>,
    /// Instances to remove (of other types).
    pub remove: Vec<String>,
}

/// What the type manager will do: per parent governed by a desired-types entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MdevPlan {
    /// One entry per governed parent, by address.
    pub parents: Vec<ParentPlan>,
}

/// What [`MdevTypeManager::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MdevReport {
    /// The plan it carried out.
    pub plan: MdevPlan,
    /// Instances removed.
    pub removed: Vec<String>,
    /// Instances created: parent, type directory name, UUID.
    pub created: Vec<(PciAddress, String, String)>,
    /// What failed (each failure is also logged); the rest was still done.
    pub errors: Vec<String>,
}

/// Keeps the configured mdev types created, the way vGPU hosts need it: one type per parent GPU,
/// the wanted types spread round-robin over the parents, every available instance created.
///
/// For each parent (by address) the first `desiredMdevTypes` entry whose `parentSelectors` match
/// it (or that has none) governs it; parents no entry matches are left alone. A governed parent
/// that already holds instances of a wanted type keeps that type; the others take, in address
/// order, the wanted type (that they support) held by the fewest parents so far, ties broken by
/// the order in the entry. Instances of any other type on a governed parent are removed, then
/// as many instances of the parent's type are created as `available_instances` allows.
/// Without `desiredMdevTypes` the manager does nothing.
#[derive(Debug, Clone)]
pub struct MdevTypeManager {
    host: HostFs,
    rules: Vec<DesiredRule>,
    timeout: Duration,
}

impl MdevTypeManager {
    /// A manager for `config.desiredMdevTypes` on `host`.
    pub fn new(config: &VfioConfig, host: HostFs) -> Result<Self, VfioError> {
        let checked = config.check()?;
        Ok(Self::from_checked(
            host,
            checked.desired,
            Duration::from_millis(config.settle_timeout_ms),
        ))
    }

    pub(crate) fn from_checked(host: HostFs, rules: Vec<DesiredRule>, timeout: Duration) -> Self {
        MdevTypeManager {
            host,
            rules,
            timeout,
        }
    }

    /// Decides what to do from what sysfs shows now, without changing anything.
    pub fn plan(&self) -> Result<MdevPlan, VfioError> {
        if self.rules.is_empty() {
            return Ok(MdevPlan::default());
        }
        let mut parents = scan_mdev_parents(&self.host)?;
        parents.sort_by_key(|p| p.address);
        Ok(plan(&parents, &self.rules))
    }

    /// Plans and carries the plan out: removes, then creates (waiting for each instance to
    /// appear or vanish, up to the settle timeout). Blocking; call it from a blocking thread.
    pub fn apply(&self) -> Result<MdevReport, VfioError> {
        let plan = self.plan()?;
        let mut report = MdevReport {
            plan: plan.clone(),
            ..MdevReport::default()
        };
        for p in &plan.parents {
            for uuid in &p.remove {
                match self.remove(uuid) {
                    Ok(()) => report.removed.push(uuid.clone()),
                    Err(e) => {
                        tracing::warn!(uuid = %uuid, error = %kubedev_core::echo::Chain(&e), "removing mdev instance failed");
                        report.errors.push(kubedev_core::echo::chain(&e));
                    }
                }
            }
        }
        for p in &plan.parents {
            let Some(t) = &p.type_id else { continue };
            if let Err(e) = self.fill(p.parent, t, &mut report) {
                tracing::warn!(parent = %p.parent, mdev_type = %t, error = %kubedev_core::echo::Chain(&e), "creating mdev instances failed");
                report.errors.push(kubedev_core::echo::chain(&e));
            }
        }
        Ok(report)
    }

    fn remove(&self, uuid: &str) -> Result<(), VfioError> {
        let entry = format!("{MDEV_DEVICES}/{uuid}");
        self.host.write_attr(format!("{entry}/remove"), "1")?;
        wait_until(self.timeout, &format!("mdev {uuid} removed"), || {
            !self.host.exists(&entry)
        })
    }

    fn fill(
        &self,
        parent: PciAddress,
        type_id: &str,
        report: &mut MdevReport,
    ) -> Result<(), VfioError> {
        let tdir = format!("{MDEV_BUS}/{parent}/mdev_supported_types/{type_id}");
        let avail = |host: &HostFs| -> Result<u32, VfioError> {
            Ok(u32::try_from(host.read_dec(format!("{tdir}/available_instances"))?).unwrap_or(0))
        };
        let first = avail(&self.host)?;
        for _ in 0..first {
            if avail(&self.host)? == 0 {
                break;
            }
            let uuid = uuid::Uuid::new_v4().hyphenated().to_string();
            self.host.write_attr(format!("{tdir}/create"), &uuid)?;
            let entry = format!("{MDEV_DEVICES}/{uuid}");
            wait_until(self.timeout, &format!("mdev {uuid} created"), || {
                self.host.exists(&entry)
            })?;
            tracing::info!(parent = %parent, mdev_type = %type_id, uuid = %uuid, "created mdev instance");
            report.created.push((parent, type_id.to_owned(), uuid));
        }
        Ok(())
    }
}

/// The pure planning step of the type manager (see [`MdevTypeManager`]); `parents` sorted by
/// address.
pub(crate) fn plan(parents: &[MdevParent], rules: &[DesiredRule]) -> MdevPlan {
    // Governed parents by rule index.
    let mut by_rule: BTreeMap<usize, Vec<&MdevParent>> = BTreeMap::new();
    for p in parents {
        if let Some(r) = rules
            .iter()
            .position(|r| r.parents.is_empty() || r.parents.contains(&p.ids))
        {
            by_rule.entry(r).or_default().push(p);
        }
    }
    let mut out = Vec::new();
    for (ri, ps) in by_rule {
        let wanted = &rules[ri].types;
        // The parent's type id for wanted type index w, if it supports it.
        let supported = |p: &MdevParent, w: usize| -> Option<String> {
            p.types
                .iter()
                .find(|t| t.id == wanted[w] || t.name == wanted[w])
                .map(|t| t.id.clone())
        };
        let mut held = vec![0usize; wanted.len()];
        let mut chosen: BTreeMap<PciAddress, Option<String>> = BTreeMap::new();
        // Keep a wanted type a parent already holds (the one with most instances).
        for p in &ps {
            let keep = (0..wanted.len())
                .filter_map(|w| {
                    let id = supported(p, w)?;
                    let n = p.types.iter().find(|t| t.id == id)?.instances.len();
                    (n > 0).then_some((n, std::cmp::Reverse(w), id))
                })
                .max();
            if let Some((_, std::cmp::Reverse(w), id)) = keep {
                held[w] += 1;
                chosen.insert(p.address, Some(id));
            }
        }
        for p in &ps {
            if chosen.contains_key(&p.address) {
                continue;
            }
            let pick = (0..wanted.len())
                .filter_map(|w| supported(p, w).map(|id| (held[w], w, id)))
                .min();
            match pick {
                Some((_, w, id)) => {
                    held[w] += 1;
                    chosen.insert(p.address, Some(id));
                }
                None => {
                    tracing::debug!(parent = %p.address, "mdev parent supports none of the wanted types");
                    chosen.insert(p.address, None);
                }
            }
        }
        for p in ps {
            let type_id = chosen.get(&p.address).cloned().flatten();
            let remove = p
                .types
                .iter()
                .filter(|t| Some(&t.id) != type_id.as_ref())
                .flat_map(|t| t.instances.iter().cloned())
                .collect();
            out.push(ParentPlan {
                parent: p.address,
                type_id,
                remove,
            });
        }
    }
    out.sort_by_key(|p| p.parent);
    MdevPlan { parents: out }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parent(addr: &str, types: &[(&str, &str, usize)]) -> MdevParent {
        MdevParent {
            address: PciAddress::parse(addr).unwrap(),
            ids: VendorDevice {
                vendor: 0x10de,
                device: 0x1eb8,
            },
            numa_node: None,
            types: types
                .iter()
                .map(|(id, name, n)| MdevType {
                    id: (*id).to_owned(),
                    name: (*name).to_owned(),
                    available_instances: 4,
                    instances: (0..*n)
                        .map(|i| format!("00000000-0000-0000-0000-{addr:.4}{i:08x}"))
                        .collect(),
                })
                .collect(),
        }
    }

    fn rule(types: &[&str]) -> DesiredRule {
        DesiredRule {
            parents: vec![],
            types: types.iter().map(|t| (*t).to_owned()).collect(),
        }
    }

    fn chosen(p: &MdevPlan) -> Vec<Option<&str>> {
        p.parents.iter().map(|p| p.type_id.as_deref()).collect()
    }

    const AB: [(&str, &str, usize); 2] = [("t-a", "A", 0), ("t-b", "B", 0)];

    #[test]
    fn types_alternate_over_empty_parents() {
        let ps: Vec<_> = [
            "0000:01:00.0",
            "0000:02:00.0",
            "0000:03:00.0",
            "0000:04:00.0",
        ]
        .iter()
        .map(|a| parent(a, &AB))
        .collect();
        let p = plan(&ps, &[rule(&["t-a", "B"])]);
        assert_eq!(
            chosen(&p),
            [Some("t-a"), Some("t-b"), Some("t-a"), Some("t-b")]
        );
        assert!(p.parents.iter().all(|p| p.remove.is_empty()));
    }

    #[test]
    fn held_types_are_kept_and_counted() {
        let ps = vec![
            parent("0000:01:00.0", &AB),
            parent("0000:02:00.0", &[("t-a", "A", 0), ("t-b", "B", 2)]),
            parent("0000:03:00.0", &AB),
        ];
        let p = plan(&ps, &[rule(&["t-a", "t-b"])]);
        // The second parent keeps B; the first takes A (no holder yet); the third finds A and B
        // held once each, and the tie goes to the order in the rule.
        assert_eq!(chosen(&p), [Some("t-a"), Some("t-b"), Some("t-a")]);
    }

    #[test]
    fn undesired_instances_are_removed_and_unsupported_parents_get_nothing() {
        let ps = vec![
            parent("0000:01:00.0", &[("t-a", "A", 1), ("t-c", "C", 3)]),
            parent("0000:02:00.0", &[("t-c", "C", 1)]),
        ];
        let p = plan(&ps, &[rule(&["t-a"])]);
        assert_eq!(chosen(&p), [Some("t-a"), None]);
        assert_eq!(p.parents[0].remove.len(), 3);
        assert_eq!(p.parents[1].remove.len(), 1);
    }

    #[test]
    fn parents_no_rule_matches_are_left_alone() {
        let ps = vec![parent("0000:01:00.0", &[("t-c", "C", 2)])];
        let r = DesiredRule {
            parents: vec![VendorDevice {
                vendor: 0x8086,
                device: 1,
            }],
            types: vec!["t-a".into()],
        };
        assert!(plan(&ps, &[r]).parents.is_empty());
    }
}
