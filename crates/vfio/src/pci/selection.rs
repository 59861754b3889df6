//! Which PCI functions are offered: each matched against the configuration on its own, then
//! grouped by IOMMU group, a group offered only when nothing else in it blocks passthrough.

use std::collections::BTreeMap;

use super::{PciFunction, PciKind, PciUnit, SriovRole, VFIO_PCI};
use crate::config::Checked;

/// Options of [`select`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SelectOptions {
    pub(crate) bind_on_prepare: bool,
    pub(crate) include_vgpu_vfs: bool,
}

/// Drivers a function may be bound to without blocking passthrough of the rest of its IOMMU
/// group (besides `vfio-pci` and no driver at all).
const GROUP_HARMLESS_DRIVERS: [&str; 2] = ["pci-stub", "pcieport"];

/// Decides which functions are offered and groups them into units by IOMMU group. Every
/// function left out is logged at debug level with the reason.
pub(crate) fn select(
    functions: &[PciFunction],
    cfg: &Checked,
    opts: SelectOptions,
) -> Vec<PciUnit> {
    let mut by_group: BTreeMap<u32, Vec<Candidate>> = BTreeMap::new();
    for (index, f) in functions.iter().enumerate() {
        let (resource, kind) = match offer(f, cfg, opts) {
            Ok(offered) => offered,
            Err(reason) => {
                skip(f, &reason);
                continue;
            }
        };
        let Some(group) = f.iommu_group else {
            skip(f, "has no IOMMU group (is the IOMMU enabled?)");
            continue;
        };
        by_group.entry(group).or_default().push(Candidate {
            index,
            resource,
            kind,
        });
    }
    let mut units = Vec::new();
    for (group, mut members) in by_group {
        members.sort_by_key(|m| functions[m.index].address);
        match group_unit(functions, group, &members) {
            Ok(unit) => units.push(unit),
            Err(reason) => {
                for m in &members {
                    skip(&functions[m.index], &reason);
                }
            }
        }
    }
    units.sort_by_key(|u| u.primary().address);
    units
}

/// A function offered on its own, before its IOMMU group is looked at.
struct Candidate {
    /// Its position in the scanned functions.
    index: usize,
    /// Its resource name.
    resource: String,
    /// How it would be used.
    kind: PciKind,
}

/// Logs that `f` is not offered, and why.
fn skip(f: &PciFunction, reason: &str) {
    tracing::debug!(address = %f.address, reason, "PCI function not offered");
}

/// The resource name and use of function `f` on its own (its IOMMU group aside), or why it is
/// not offered.
fn offer(f: &PciFunction, cfg: &Checked, opts: SelectOptions) -> Result<(String, PciKind), String> {
    let rule = cfg.pci.iter().find(|r| r.ids == f.ids());
    let nvidia_vf = f.driver.as_deref() == Some("nvidia")
        && matches!(f.sriov, SriovRole::VirtualFunction { .. });
    if nvidia_vf && f.vgpu_type.is_some() {
        if !opts.include_vgpu_vfs {
            return Err("NVIDIA vGPU virtual function, and includeVgpuVfs is off".into());
        }
        if !f.is_vgpu_vf() {
            return Err(
                "NVIDIA vGPU virtual function without a vGPU type (current_vgpu_type is 0)".into(),
            );
        }
        let resource = rule.map_or_else(|| cfg.vgpu_resource.clone(), |r| r.resource.clone());
        return Ok((resource, PciKind::VgpuVf));
    }
    let Some(rule) = rule else {
        return Err("matches no PCI selector".into());
    };
    let on_vfio = f.driver.as_deref() == Some(VFIO_PCI);
    if !on_vfio && !opts.bind_on_prepare {
        return Err(match &f.driver {
            Some(d) => format!("bound to {d}, not {VFIO_PCI} (and bindOnPrepare is off)"),
            None => format!("bound to no driver, not {VFIO_PCI} (and bindOnPrepare is off)"),
        });
    }
    if let SriovRole::PhysicalFunction { num_vfs, .. } = f.sriov
        && num_vfs > 0
        && !on_vfio
    {
        return Err(
            "an SR-IOV physical function with enabled VFs is not rebound (they depend on its driver)"
                .into(),
        );
    }
    Ok((rule.resource.clone(), PciKind::Passthrough))
}

/// The unit of IOMMU group `group` made of `members` (sorted by address), or why none of them
/// is offered: another function of the group is bound to a driver that blocks passthrough, or
/// the first address makes no device name.
fn group_unit(
    functions: &[PciFunction],
    group: u32,
    members: &[Candidate],
) -> Result<PciUnit, String> {
    let blocker = functions.iter().enumerate().find(|(i, f)| {
        f.iommu_group == Some(group)
            && !members.iter().any(|m| m.index == *i)
            && !f.is_bridge()
            && f.driver
                .as_deref()
                .is_some_and(|d| d != VFIO_PCI && !GROUP_HARMLESS_DRIVERS.contains(&d))
    });
    if let Some((_, b)) = blocker {
        return Err(format!(
            "IOMMU group {group} also holds {} bound to {}, which blocks passthrough",
            b.address,
            b.driver.as_deref().unwrap_or("?")
        ));
    }
    let first = &members[0];
    let Some(name) = functions[first.index].address.device_name() else {
        return Err("its address does not make a device name".into());
    };
    Ok(PciUnit {
        name,
        resource: first.resource.clone(),
        group,
        functions: members.iter().map(|m| functions[m.index].clone()).collect(),
        kind: first.kind,
    })
}
