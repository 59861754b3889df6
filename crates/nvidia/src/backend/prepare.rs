//! Prepare: each allocated device's edits and status data (a MIG placement's instance created
//! first), every sharing configuration read before anything on the host changes, and the
//! claim's sharing applied after (see `claims`); also the edits planned before a prepare.

use std::collections::BTreeMap;

use kubedev_core::{
    AllocatedDevice, ClaimRef, Consumer, ContainerEdits, DeviceRef, PrepareError, PreparedDevice,
};

use super::{Discovered, Inner};
use crate::devices::DeviceKind;
use crate::edits::{gpu_edits, mig_edits, read_mig_minors};
use crate::sharing::{GpuSharing, Strategy, Target, device_sharing};
use crate::snapshot::{GpuInfo, MigProfile, Placement};

impl Inner {
    /// Prepares `devices` for `consumer`: nothing on the host changes before every device's
    /// configuration is read; a claim's sharing is applied once all devices are prepared.
    pub(super) fn prepare_blocking(
        &self,
        consumer: &Consumer,
        devices: &[AllocatedDevice],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let d = self
            .discovered_or_discover()
            .map_err(|e| PrepareError::Other(kubedev_core::echo::chain(&e)))?;
        let claim = match consumer {
            Consumer::Claim(c) => Some(c),
            _ => None,
        };
        // Every configuration is read before anything on the host changes.
        let sharing = sharing_of_devices(claim, devices)?;
        let minors = read_mig_minors(&self.ctx.host);
        let mut out = Vec::with_capacity(devices.len());
        let mut targets = Vec::with_capacity(devices.len());
        for (allocated, sharing) in devices.iter().zip(sharing) {
            let (prepared, target) =
                self.prepare_device(consumer, &d, allocated, &minors, sharing)?;
            targets.push(target);
            out.push(prepared);
        }
        if let Some(claim) = claim {
            self.share(claim, devices, &targets, &mut out)?;
        }
        Ok(out)
    }

    /// Prepares one device with its `sharing`: its edits (a MIG placement's instance created
    /// for the claim first) and status data (GPU UUID, MIG UUID and instance ids, sharing
    /// strategy), and what sharing sees of it.
    fn prepare_device(
        &self,
        consumer: &Consumer,
        d: &Discovered,
        allocated: &AllocatedDevice,
        minors: &BTreeMap<String, u32>,
        sharing: Option<GpuSharing>,
    ) -> Result<(PreparedDevice, Target), PrepareError> {
        let (kind, gpu) = self.published_device(d, &allocated.device)?;
        let mut data = serde_json::json!({"gpuUUID": gpu.uuid});
        if let DeviceKind::Mig { instance, .. } = kind {
            set_mig_status(
                &mut data,
                serde_json::json!(instance.uuid),
                instance.gi_id,
                instance.ci_id,
            );
        }
        let edits = match kind {
            DeviceKind::Gpu { .. } | DeviceKind::Mig { .. } => {
                self.existing_edits(kind, gpu, minors, &allocated.device)?
            }
            DeviceKind::Placement {
                profile, placement, ..
            } => {
                let (gi, ci, uuid) =
                    self.placement_instance(consumer, &allocated.device, gpu, profile, *placement)?;
                set_mig_status(&mut data, serde_json::json!(uuid), gi, ci);
                let driver = self.driver();
                mig_edits(&self.edit_source(&driver), minors, gpu.minor, &uuid, gi, ci)
            }
        };
        let whole_gpu = matches!(kind, DeviceKind::Gpu { .. });
        let uuid = data
            .get("migUUID")
            .or(data.get("gpuUUID"))
            .and_then(|u| u.as_str())
            .unwrap_or_default()
            .to_string();
        if let Some(s) = &sharing {
            data["sharing"] = serde_json::json!(match s.strategy {
                Strategy::TimeSlicing => "TimeSlicing",
                Strategy::Mps => "MPS",
            });
        }
        let target = Target {
            uuid,
            whole_gpu,
            sharing,
        };
        let prepared = PreparedDevice::new(allocated.clone(), edits).with_status_data(data);
        Ok((prepared, target))
    }

    /// What `device` is in discovery `d` and the GPU it is on; an unknown device when it is
    /// not one of this backend's published devices.
    fn published_device<'d>(
        &self,
        d: &'d Discovered,
        device: &DeviceRef,
    ) -> Result<(&'d DeviceKind, &'d GpuInfo), PrepareError> {
        let unknown = || PrepareError::UnknownDevice {
            device: device.to_string(),
        };
        if device.pool != self.pool {
            return Err(unknown());
        }
        let kind = d.built.kinds.get(&device.device).ok_or_else(unknown)?;
        let gpu = d.machine.gpus.get(kind.gpu()).ok_or_else(unknown)?;
        Ok((kind, gpu))
    }

    /// Creates (or finds) the MIG instance of a placement for a DRA claim; the device-plugin
    /// API cannot use placements. Returns (GI id, CI id, MIG UUID).
    fn placement_instance(
        &self,
        consumer: &Consumer,
        device: &DeviceRef,
        gpu: &GpuInfo,
        profile: &MigProfile,
        placement: Placement,
    ) -> Result<(u32, u32, String), PrepareError> {
        let Consumer::Claim(claim) = consumer else {
            return Err(PrepareError::Other(format!(
                "device {device}: MIG placements are created for DRA claims only; the \
                 device-plugin API never unprepares, so it cannot use them"
            )));
        };
        self.prepare_placement(claim, device.device.as_str(), gpu, profile, placement)
            .map_err(|e| PrepareError::Other(format!("device {device}: {e}")))
    }

    /// Edits of a whole GPU or of a MIG instance that exists already; a MIG placement has
    /// none until `prepare` creates its instance.
    fn existing_edits(
        &self,
        kind: &DeviceKind,
        gpu: &GpuInfo,
        minors: &BTreeMap<String, u32>,
        device: &DeviceRef,
    ) -> Result<ContainerEdits, PrepareError> {
        let driver = self.driver();
        let src = self.edit_source(&driver);
        match kind {
            DeviceKind::Gpu { .. } => Ok(gpu_edits(&src, gpu.minor, &gpu.uuid)),
            DeviceKind::Mig { instance, .. } => {
                let uuid = instance
                    .uuid
                    .as_deref()
                    .ok_or_else(|| PrepareError::Unhealthy {
                        device: device.to_string(),
                        reason: "NVML lists no MIG device (UUID) for this compute instance".into(),
                    })?;
                Ok(mig_edits(
                    &src,
                    minors,
                    gpu.minor,
                    uuid,
                    instance.gi_id,
                    instance.ci_id,
                ))
            }
            DeviceKind::Placement { .. } => Err(PrepareError::Other(format!(
                "device {device}: a MIG placement has no instance before it is prepared"
            ))),
        }
    }

    /// `prepare`'s edits for whole GPUs and existing MIG instances; `None` for a MIG placement,
    /// whose instance only `prepare` creates.
    pub(super) fn planned_blocking(
        &self,
        device: &DeviceRef,
    ) -> Result<Option<ContainerEdits>, PrepareError> {
        let d = self
            .discovered_or_discover()
            .map_err(|e| PrepareError::Other(kubedev_core::echo::chain(&e)))?;
        let (kind, gpu) = self.published_device(&d, device)?;
        if matches!(kind, DeviceKind::Placement { .. }) {
            return Ok(None);
        }
        let minors = read_mig_minors(&self.ctx.host);
        self.existing_edits(kind, gpu, &minors, device).map(Some)
    }
}

/// Each device's sharing, from its configuration; none for every device of a device-plugin
/// consumer (no `claim`).
fn sharing_of_devices(
    claim: Option<&ClaimRef>,
    devices: &[AllocatedDevice],
) -> Result<Vec<Option<GpuSharing>>, PrepareError> {
    let mut sharing = Vec::with_capacity(devices.len());
    for a in devices {
        let s = match claim {
            Some(c) => device_sharing(a).map_err(|e| PrepareError::config(c, e))?,
            None => None,
        };
        sharing.push(s);
    }
    Ok(sharing)
}

/// Puts a MIG device's UUID and GPU and compute instance ids into a device's status data.
fn set_mig_status(data: &mut serde_json::Value, mig_uuid: serde_json::Value, gi: u32, ci: u32) {
    data["migUUID"] = mig_uuid;
    data["gpuInstance"] = gi.into();
    data["computeInstance"] = ci.into();
}
