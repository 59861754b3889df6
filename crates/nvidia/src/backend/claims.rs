//! A claim's sharing (MPS daemon, time-slices, compute modes) applied after its devices are
//! prepared, and undoing a prepare: its sharing and the MIG instances created for its
//! placements.

use kubedev_core::{AllocatedDevice, ClaimRef, PrepareError, PreparedDevice};

use super::Inner;
use crate::devices::DeviceKind;
use crate::error::NvidiaError;
use crate::ffi;
use crate::records::RecordState;
use crate::sharing::{Sharing, Target, device_sharing};

impl Inner {
    /// Applies the claim's sharing to its prepared devices `out` (extra edits), after checking
    /// it; on failure nothing of the prepare stays: its MIG instances go, and its sharing when
    /// applying it failed half-way.
    pub(super) fn share(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
        targets: &[Target],
        out: &mut [PreparedDevice],
    ) -> Result<(), PrepareError> {
        if !targets.iter().any(|t| t.sharing.is_some()) {
            return Ok(());
        }
        let rollback = |sharing: bool| {
            let undone = match sharing {
                true => self.unprepare_blocking(claim, devices),
                false => self.release_placements(claim, devices),
            };
            if let Err(u) = undone {
                tracing::error!(claim = %claim, error = %kubedev_core::echo::Chain(&u), "rolling back a failed prepare failed");
            }
        };
        if let Err(e) = Sharing::check(claim, targets) {
            rollback(false);
            return Err(e);
        }
        match self.sharing.apply(claim, targets) {
            Ok(extra) => {
                for (p, e) in out.iter_mut().zip(extra) {
                    p.edits.merge(&e);
                }
            }
            Err(e) => {
                rollback(true);
                return Err(PrepareError::Other(e));
            }
        }
        Ok(())
    }

    pub(super) fn unprepare_blocking(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<(), PrepareError> {
        self.sharing
            .undo(claim, &self.sharing_targets(devices))
            .map_err(|e| PrepareError::Other(format!("claim {claim}: {e}")))?;
        self.release_placements(claim, devices)
    }

    /// Destroys the MIG instances `prepare` created for `claim`'s placements.
    pub(super) fn release_placements(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<(), PrepareError> {
        for a in devices {
            if a.device.pool != self.pool {
                continue;
            }
            let name = a.device.device.as_str();
            let fail = |e: NvidiaError| PrepareError::Other(format!("device {}: {e}", a.device));
            if self.records.get(name).map_err(fail)?.is_none() {
                continue;
            }
            // Load NVML before taking the MIG lock: the first load reconciles under that lock.
            let nvml = self.nvml().map_err(fail)?;
            let _g = self.mig.lock();
            let Some(mut rec) = self.records.get(name).map_err(fail)? else {
                continue;
            };
            if rec.claim_uid != claim.uid {
                // Another claim's instance (this claim never got it): leave it alone.
                continue;
            }
            if rec.state != RecordState::Destroying {
                rec.state = RecordState::Destroying;
                self.records.put(&rec).map_err(fail)?;
            }
            ffi::destroy_instance(&nvml, &rec.gpu_uuid, rec.profile_id, rec.placement())
                .map_err(fail)?;
            self.records.remove(name).map_err(fail)?;
        }
        Ok(())
    }

    /// The sharing targets of `devices` for undoing: whatever discovery still knows of them.
    fn sharing_targets(&self, devices: &[AllocatedDevice]) -> Vec<Target> {
        let d = self.current();
        devices
            .iter()
            .filter(|a| a.device.pool == self.pool)
            .filter_map(|a| {
                let sharing = device_sharing(a).ok().flatten()?;
                let d = d.as_ref()?;
                let kind = d.built.kinds.get(&a.device.device)?;
                let gpu = d.machine.gpus.get(kind.gpu())?;
                Some(Target {
                    uuid: gpu.uuid.clone(),
                    whole_gpu: matches!(kind, DeviceKind::Gpu { .. }),
                    sharing: Some(sharing),
                })
            })
            .collect()
    }
}
