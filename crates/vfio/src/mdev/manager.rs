//! The mdev type manager: carrying out its plan on the host, removing the instances of
//! unwanted types and creating instances of the wanted ones.

use std::time::Duration;

use kubedev_core::HostFs;

use super::plan::{MdevPlan, plan};
use super::sysfs::scan_mdev_parents;
use super::{MDEV_BUS, MDEV_DEVICES};
use crate::config::{DesiredRule, VfioConfig};
use crate::error::VfioError;
use crate::naming::PciAddress;
use crate::settle::wait_until;

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
