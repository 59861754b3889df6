//! MIG instances kubedev creates for claims' placements, and the records that let a crash
//! be repaired: creating (or adopting) an instance, reconciling the records with what NVML
//! shows after a restart, and the placements the records own.

use kubedev_core::ClaimRef;
use nvml_wrapper::Nvml;

use super::Inner;
use crate::devices::Owned;
use crate::error::NvidiaError;
use crate::ffi;
use crate::records::{MigRecord, RecordState};
use crate::snapshot::{GpuInfo, MigProfile, Placement};

impl Inner {
    /// Finishes or rolls back MIG work a crash interrupted (see the crate docs).
    pub(super) fn reconcile(&self, nvml: &Nvml) {
        let _g = self.mig.lock();
        let records = match self.records.all() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "cannot read MIG records; not reconciled");
                return;
            }
        };
        for rec in records {
            match rec.state {
                RecordState::Creating | RecordState::Destroying => {
                    let what = if rec.state == RecordState::Creating {
                        "rolling back an unfinished MIG creation"
                    } else {
                        "finishing an unfinished MIG destruction"
                    };
                    tracing::info!(device = %rec.device, claim = %rec.claim_uid, "{what}");
                    match ffi::destroy_instance(
                        nvml,
                        &rec.gpu_uuid,
                        rec.profile_id,
                        rec.placement(),
                    ) {
                        Ok(()) => {
                            if let Err(e) = self.records.remove(&rec.device) {
                                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "cannot remove MIG record");
                            }
                        }
                        Err(e) => {
                            tracing::warn!(device = %rec.device, error = %kubedev_core::echo::Chain(&e), "{what} failed")
                        }
                    }
                }
                RecordState::Created => {
                    match ffi::find_instance(nvml, &rec.gpu_uuid, rec.profile_id, rec.placement()) {
                        Ok(Some(found)) if !found.ci_ids.is_empty() => {}
                        Ok(_) => tracing::warn!(
                            device = %rec.device, claim = %rec.claim_uid,
                            "the MIG instance prepared for this claim is gone; preparing it again recreates it"
                        ),
                        Err(e) => {
                            tracing::warn!(device = %rec.device, error = %kubedev_core::echo::Chain(&e), "cannot check MIG instance")
                        }
                    }
                }
            }
        }
    }

    /// Placements kubedev created (or is creating) for claims, with their GPU instance ids.
    pub(super) fn owned_placements(&self) -> Owned {
        match self.records.all() {
            Ok(records) => records
                .into_iter()
                .map(|r| ((r.gpu_uuid.clone(), r.placement()), r.gi_id))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "cannot read MIG records");
                Owned::new()
            }
        }
    }

    /// Creates (or finds, when already prepared) the MIG instance of a placement for a claim.
    /// Returns (GI id, CI id, MIG UUID).
    pub(super) fn prepare_placement(
        &self,
        claim: &ClaimRef,
        device: &str,
        gpu: &GpuInfo,
        profile: &MigProfile,
        placement: Placement,
    ) -> Result<(u32, u32, String), NvidiaError> {
        let nvml = self.nvml()?;
        let _g = self.mig.lock();
        let existing = self.records.get(device)?;
        if let Some(rec) = &existing
            && rec.claim_uid != claim.uid
        {
            return Err(placement_refused(
                gpu,
                placement,
                format!(
                    "the placement is prepared for claim {}; it cannot be prepared for {claim}",
                    rec.claim_uid
                ),
            ));
        }
        let found = ffi::find_instance(&nvml, &gpu.uuid, profile.id, placement)?;
        if existing.is_none() && found.is_some() {
            return Err(placement_refused(
                gpu,
                placement,
                "a MIG instance kubedev did not create occupies the placement".into(),
            ));
        }
        let mut rec = existing.unwrap_or_else(|| MigRecord {
            claim_uid: claim.uid.to_string(),
            device: device.to_string(),
            gpu_uuid: gpu.uuid.clone(),
            profile_index: profile.index,
            profile_id: profile.id,
            start: placement.start,
            size: placement.size,
            state: RecordState::Creating,
            gi_id: None,
            ci_id: None,
            mig_uuid: None,
        });
        // Already there and complete (a repeated prepare, or a crash after creating): adopt it.
        if let Some(f) = &found
            && let (Some(&ci), Some(uuid)) = (f.ci_ids.first(), f.mig_uuid.clone())
        {
            if rec.state != RecordState::Created || rec.mig_uuid.as_deref() != Some(&uuid) {
                mark_created(&mut rec, f.gi_id, ci, &uuid);
                self.records.put(&rec)?;
            }
            return Ok((f.gi_id, ci, uuid));
        }
        rec.state = RecordState::Creating;
        self.records.put(&rec)?;
        if found.is_some() {
            // Half made (a GPU instance without a compute instance): start over.
            ffi::destroy_instance(&nvml, &gpu.uuid, profile.id, placement)?;
        }
        let created = match ffi::create_instance(&nvml, &gpu.uuid, profile.index, placement) {
            Ok(c) => c,
            Err(e) => {
                // Nothing was left behind (create rolls back its own GPU instance).
                if let Err(re) = self.records.remove(device) {
                    tracing::warn!(error = %kubedev_core::echo::Chain(&re), "cannot remove MIG record after a failed create");
                }
                return Err(e);
            }
        };
        let ci = created.ci_ids.first().copied().unwrap_or(0);
        let Some(uuid) = created.mig_uuid.clone() else {
            return Err(NvidiaError::Nvml {
                call: "nvmlDeviceGetMigDeviceHandleByIndex",
                target: format!(
                    "{} GPU instance {} compute instance {ci}",
                    gpu.uuid, created.gi_id
                ),
                message: "NVML lists no MIG device for the new compute instance".into(),
                gpu_lost: false,
            });
        };
        mark_created(&mut rec, created.gi_id, ci, &uuid);
        self.records.put(&rec)?;
        Ok((created.gi_id, ci, uuid))
    }
}

/// A placement that cannot be prepared, and why.
fn placement_refused(gpu: &GpuInfo, placement: Placement, message: String) -> NvidiaError {
    NvidiaError::Nvml {
        call: "creating a MIG instance",
        target: format!(
            "{} placement {}+{}",
            gpu.uuid, placement.start, placement.size
        ),
        message,
        gpu_lost: false,
    }
}

/// Records that the instance of `rec` exists, with its GPU and compute instance ids and its
/// MIG device's UUID.
fn mark_created(rec: &mut MigRecord, gi: u32, ci: u32, uuid: &str) {
    rec.state = RecordState::Created;
    rec.gi_id = Some(gi);
    rec.ci_id = Some(ci);
    rec.mig_uuid = Some(uuid.to_string());
}
