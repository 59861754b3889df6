//! Two-phase prepare of a claim: its start recorded in the checkpoint, the backend's prepare,
//! the CDI spec and device metadata written, then its completion recorded; a claim prepared
//! already gets the same answer again, with its files repaired.

use std::collections::BTreeMap;

use kubedev_core::{AllocatedDevice, ClaimRef, Consumer, PreparedDevice};
use kubedev_kubelet_grpc::dra::{ClaimError, PreparedClaimDevice};

use super::claim_status::StatusChange;
use super::{ClaimAllocation, DraDriver, StepError, backend_error, blocking};
use crate::cdi::{CdiClaimSpec, SpecCheck};
use crate::checkpoint::{Change, ClaimRecord, ClaimState};
use crate::failpoint;

impl DraDriver {
    /// Prepares `claim`, whose lock the caller holds; idempotent.
    pub(super) async fn prepare_locked(
        &self,
        claim: &ClaimRef,
    ) -> Result<Vec<PreparedClaimDevice>, ClaimError> {
        let existing = self.journal.recorded().get(claim.uid.as_str()).cloned();
        if let Some(r) = existing
            && r.state == ClaimState::PrepareCompleted
        {
            return self.prepare_again(claim, &r).await;
        }

        let ClaimAllocation {
            devices,
            pod_claim_name,
        } = self.allocation_on_node(claim).await?;
        self.record_start(claim, &devices).await?;
        failpoint::reached("after-prepare-started").await;

        let prepared = self.prepare_devices(claim, &devices).await?;
        failpoint::reached("after-device-prepare").await;

        let (written, metadata) = self
            .write_files(claim, &devices, &prepared, pod_claim_name.clone())
            .await?;
        failpoint::reached("after-cdi-write").await;
        failpoint::reached("before-prepare-completed").await;

        self.record_completed(claim, &prepared, &written, pod_claim_name)
            .await?;
        tracing::info!(claim = %claim, devices = prepared.len(), "prepared");
        let answer = Self::answer(&prepared, written.device_ids, metadata);
        self.status
            .send(StatusChange::Prepared(claim.clone(), prepared));
        Ok(answer)
    }

    /// The answer for `claim`, prepared already as `record` says: the same answer again, with
    /// the CDI spec and device metadata put back if they went missing or were damaged.
    async fn prepare_again(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
    ) -> Result<Vec<PreparedClaimDevice>, ClaimError> {
        let cdi = self.cdi.clone();
        let (uid, prepared) = (claim.uid.clone(), record.prepared.clone());
        let (check, ids) = blocking(move || cdi.ensure_claim_ids(&uid, &prepared))
            .await
            .map_err(|e| e.for_kubelet(format_args!("checking the CDI spec of claim {claim}")))?;
        if let SpecCheck::Repaired { found } = check {
            tracing::warn!(claim = %claim, found = %found, "rewrote a missing or damaged CDI spec");
        }
        let metadata = self
            .metadata
            .write(claim, record.pod_claim_name.clone(), &record.prepared, true)
            .await
            .map_err(|e| {
                e.for_kubelet(format_args!(
                    "checking the device metadata of claim {claim}"
                ))
            })?;
        self.status.send(StatusChange::Prepared(
            claim.clone(),
            record.prepared.clone(),
        ));
        Ok(Self::answer(&record.prepared, ids, metadata))
    }

    /// `claim`'s allocation for this driver; an error unless it has devices and all of them
    /// are on this node.
    async fn allocation_on_node(&self, claim: &ClaimRef) -> Result<ClaimAllocation, ClaimError> {
        let allocation = self.claims.allocation(claim).await?;
        if allocation.devices.is_empty() {
            return Err(ClaimError::permanent(
                "not_allocated",
                format!("claim {claim} has no devices allocated by this driver"),
            ));
        }
        for d in &allocation.devices {
            if self.backends.owner(&d.device.pool).is_none() {
                return Err(ClaimError::permanent(
                    "not_on_node",
                    format!("claim {claim}: device {} is not on this node", d.device),
                ));
            }
        }
        Ok(allocation)
    }

    /// Records in the checkpoint that `claim`'s prepare of `devices` started, once no other
    /// claim holds one of its exclusive devices.
    async fn record_start(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<(), ClaimError> {
        let taken = self
            .exclusive
            .take(claim, devices, &self.journal.recorded())
            .map_err(|(device, other)| {
                ClaimError::retryable(
                    "device_in_use",
                    format!(
                        "claim {claim}: device {device} does not allow multiple allocations and is \
                     already prepared for claim {other}; unprepare that claim first"
                    ),
                )
            })?;
        let started = self
            .journal
            .commit(Change::Start {
                claim: claim.clone(),
                devices: devices.to_vec(),
            })
            .await;
        // Recorded (or failed): from here the checkpoint speaks for these devices.
        drop(taken);
        started.map_err(|e| e.for_kubelet(format_args!("recording the start of claim {claim}")))
    }

    /// The backend's prepare of `devices` for `claim`; when it fails, the claim's record is
    /// removed.
    async fn prepare_devices(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        match self
            .backends
            .prepare(&Consumer::Claim(claim.clone()), devices)
            .await
        {
            Ok(p) => Ok(p),
            Err(e) => {
                self.journal
                    .commit(Change::Remove {
                        uid: claim.uid.clone(),
                    })
                    .await
                    .map_err(|e| e.for_kubelet(format_args!("forgetting claim {claim}")))?;
                Err(backend_error(
                    &e,
                    format!("preparing claim {claim}: {}", kubedev_core::echo::chain(&e)),
                ))
            }
        }
    }

    /// Records in the checkpoint that `claim`'s prepare completed, with its devices as
    /// prepared and the file of its CDI spec.
    async fn record_completed(
        &self,
        claim: &ClaimRef,
        prepared: &[PreparedDevice],
        written: &CdiClaimSpec,
        pod_claim_name: Option<String>,
    ) -> Result<(), ClaimError> {
        let file_name = written
            .file
            .as_ref()
            .and_then(|f| f.file_name())
            .map(|f| f.to_string_lossy().into_owned());
        self.journal
            .commit(Change::Complete {
                uid: claim.uid.clone(),
                prepared: prepared.to_vec(),
                cdi_file: file_name,
                pod_claim_name,
            })
            .await
            .map_err(|e| e.for_kubelet(format_args!("recording claim {claim} as prepared")))
    }

    /// Writes the CDI spec and device metadata of a claim whose devices the backend prepared;
    /// on failure undoes the backend's prepare, removes what was written and forgets the claim.
    async fn write_files(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
        prepared: &[PreparedDevice],
        pod_claim_name: Option<String>,
    ) -> Result<(CdiClaimSpec, BTreeMap<String, String>), ClaimError> {
        let cdi = self.cdi.clone();
        let (uid, p) = (claim.uid.clone(), prepared.to_vec());
        let written = blocking(move || cdi.write_claim(&uid, &p)).await;
        let metadata = match &written {
            Ok(_) => {
                self.metadata
                    .write(claim, pod_claim_name, prepared, false)
                    .await
            }
            Err(_) => Ok(BTreeMap::new()),
        };
        match written.and_then(|w| Ok((w, metadata?))) {
            Ok(w) => Ok(w),
            Err(e) => {
                if let Err(u) = self.backends.unprepare(claim, devices).await {
                    tracing::error!(claim = %claim, error = %kubedev_core::echo::Chain(&u), "rolling back after a CDI failure failed");
                }
                let cdi = self.cdi.clone();
                let uid = claim.uid.clone();
                if let Err(r) = blocking(move || cdi.remove_claim(&uid).map(|_| ()))
                    .await
                    .and(self.metadata.remove(claim).await)
                {
                    tracing::error!(claim = %claim, error = %kubedev_core::echo::Chain(&r), "removing the files of a failed prepare failed");
                }
                self.journal
                    .commit(Change::Remove {
                        uid: claim.uid.clone(),
                    })
                    .await
                    .map_err(|e| e.for_kubelet(format_args!("forgetting claim {claim}")))?;
                let what = match e {
                    StepError::Metadata(_) => "the device metadata",
                    _ => "the CDI spec",
                };
                Err(e.for_kubelet(format_args!("writing {what} of claim {claim}")))
            }
        }
    }

    /// The kubelet's answer for `prepared`, with the CDI device IDs the claim's spec gave them.
    /// The first device of each request also gets the request's device metadata (`metadata`,
    /// main request → CDI ID), so every container using the request sees the file.
    fn answer(
        prepared: &[PreparedDevice],
        ids: Vec<Option<String>>,
        mut metadata: BTreeMap<String, String>,
    ) -> Vec<PreparedClaimDevice> {
        prepared
            .iter()
            .zip(ids)
            .map(|(p, id)| {
                let request = kubedev_core::base_request(&p.device.request).to_string();
                let mut cdi_device_ids: Vec<String> = id.into_iter().collect();
                cdi_device_ids.extend(metadata.remove(&request));
                PreparedClaimDevice {
                    request_names: vec![request],
                    pool: p.device.device.pool.to_string(),
                    device: p.device.device.device.to_string(),
                    cdi_device_ids,
                    share_id: p.device.share_id.clone(),
                }
            })
            .collect()
    }
}
