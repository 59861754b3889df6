//! Start-up recovery of the DRA driver: rolling back half-done prepares, repairing completed
//! claims' CDI specs and device metadata, applying their configuration again, rebuilding from the
//! API server after a lost checkpoint, and removing what no claim owns.

use std::path::PathBuf;

use kubedev_core::Consumer;

use super::{DraDriver, StepError, blocking};
use crate::cdi::SpecCheck;
use crate::checkpoint::{ClaimRecord, ClaimState, LoadOutcome};

/// What start-up recovery did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Claims whose prepare had started but not completed, rolled back.
    pub rolled_back: Vec<String>,
    /// Completed claims whose CDI spec was missing or damaged and was written again, with what
    /// was found in its place.
    pub cdi_repaired: Vec<(String, String)>,
    /// CDI files of ours that no claim owned, removed.
    pub cdi_removed: Vec<PathBuf>,
    /// Temporary files of interrupted CDI writes, removed.
    pub cdi_temp_removed: Vec<PathBuf>,
    /// Unfinished prepares left alone: the instance that started them is still running (the
    /// old daemon during a rolling update).
    pub left_to_other_instance: Vec<String>,
    /// Why the checkpoint's records were lost (a corrupt file moved aside, or a missing file
    /// while CDI specs of ours existed); `None` when they were read.
    pub checkpoint_lost: Option<String>,
    /// Claims re-prepared from what the API server says (after a lost checkpoint).
    pub rebuilt: Vec<String>,
    /// Claims the API server listed that could not be re-prepared, with why.
    pub rebuild_failed: Vec<(String, String)>,
    /// Whether trying the rebuild again may do more: the API server could not be asked, a
    /// listed claim's prepare failed in a way the next try may not meet, or a claim of this
    /// node is in a pool no backend serves yet. The kubelet does not
    /// prepare a running pod's claims again, so the driver must.
    pub retry_later: bool,
    /// CDI specs kept although no record owns them, because the API server could not be asked
    /// whether their claims still exist.
    pub kept_unverified: Vec<PathBuf>,
    /// Why the API server could not be asked (after a lost checkpoint).
    pub cluster_error: Option<String>,
    /// Prepared claims with opaque configuration whose backend prepare ran again, so what the
    /// configuration set up on the host (an MPS daemon, a time-slice) is in place again.
    pub reapplied: Vec<String>,
    /// Prepared claims whose configuration could not be applied again, with why (the claim
    /// stays prepared; its next prepare call tries again).
    pub reapply_failed: Vec<(String, String)>,
}

/// How old a temporary CDI file must be before recovery removes it while another instance
/// runs (its writes take milliseconds).
const STALE_TEMP_MARGIN: std::time::Duration = std::time::Duration::from_secs(300);

impl DraDriver {
    /// Start-up recovery; see the module docs. Call once, before serving the kubelet, with what
    /// opening the checkpoint found.
    ///
    /// When the checkpoint's records were lost (a corrupt file, or no file while CDI specs of
    /// this driver exist), nothing a running pod needs is destroyed: every claim the API server
    /// says is allocated devices on this node and reserved for a pod is prepared again (its
    /// record and CDI spec rebuilt), and only specs whose claims the API server does not list
    /// are removed. When the API server cannot be asked, every spec is kept.
    pub async fn recover(&self, checkpoint: &LoadOutcome) -> Result<Recovery, StepError> {
        let mut rec = Recovery::default();
        let records: Vec<_> = {
            let store = self.journal.stored();
            store
                .claims()
                .values()
                .map(|r| (r.clone(), store.in_progress_elsewhere(r)))
                .collect()
        };
        for (r, elsewhere) in records {
            match r.state {
                ClaimState::PrepareStarted if elsewhere => {
                    // The daemon instance we replace (rolling update) is in the middle of it.
                    tracing::info!(claim = %r.claim, owner = ?r.owner, "leaving a prepare another running instance started");
                    rec.left_to_other_instance.push(r.claim.uid.to_string());
                }
                ClaimState::PrepareStarted => {
                    self.roll_back(&r).await?;
                    rec.rolled_back.push(r.claim.uid.to_string());
                }
                _ => self.restore_completed(&r, &mut rec).await?,
            }
        }
        // Edits that changed while the daemon was down (a driver upgraded meanwhile); the
        // metadata was brought up to date above.
        for uid in self.refresh(false).await {
            tracing::info!(claim_uid = %uid, "a prepared claim's container edits changed while the daemon was stopped");
        }
        let cdi = self.cdi.clone();
        let spec_files = blocking(move || cdi.list_claim_files()).await?;
        rec.checkpoint_lost = why_records_lost(checkpoint, spec_files.len());
        let rebuild = if rec.checkpoint_lost.is_some() {
            let with_spec = spec_files.iter().map(|(uid, _)| uid.to_string()).collect();
            self.rebuild(&mut rec, &with_spec).await
        } else {
            // The records were read: a spec none of them owns is an orphan.
            super::rebuild::Rebuild::Answered {
                waiting: Vec::new(),
            }
        };
        let (removed, kept) = self.sweep_orphans(rebuild).await?;
        rec.cdi_removed = removed;
        rec.kept_unverified = kept;
        rec.cdi_temp_removed = self.remove_interrupted_writes().await?;
        Ok(rec)
    }

    /// Rolls back the prepare of `record` that a crash interrupted: the backend's unprepare,
    /// then the claim's CDI spec, device metadata and record removed.
    async fn roll_back(&self, record: &ClaimRecord) -> Result<(), StepError> {
        tracing::warn!(claim = %record.claim, "rolling back a prepare interrupted by a crash");
        self.backends
            .unprepare(&record.claim, &record.devices)
            .await
            .map_err(|source| StepError::RollBack {
                claim: Box::new(record.claim.clone()),
                source: Box::new(source),
            })?;
        let cdi = self.cdi.clone();
        let uid = record.claim.uid.clone();
        blocking(move || cdi.remove_claim(&uid)).await?;
        self.metadata.remove(&record.claim).await?;
        let uid = record.claim.uid.clone();
        self.journal.with_store(move |s| s.remove(&uid)).await?;
        Ok(())
    }

    /// Brings the completed claim of `record` back as it was: its CDI spec repaired, its opaque
    /// configuration applied again by the backend, its device metadata brought up to date.
    async fn restore_completed(
        &self,
        record: &ClaimRecord,
        rec: &mut Recovery,
    ) -> Result<(), StepError> {
        let uid = record.claim.uid.clone();
        let cdi = self.cdi.clone();
        let u = uid.clone();
        let prepared = record.prepared.clone();
        let check = blocking(move || cdi.ensure_claim(&u, &prepared)).await?;
        if let SpecCheck::Repaired { found } = check {
            tracing::warn!(claim = %record.claim, found = %found, "rewrote a missing or damaged CDI spec");
            rec.cdi_repaired.push((uid.to_string(), found));
        }
        if record.devices.iter().any(|d| !d.config.is_empty()) {
            match self
                .backends
                .prepare(&Consumer::Claim(record.claim.clone()), &record.devices)
                .await
            {
                Ok(_) => rec.reapplied.push(uid.to_string()),
                Err(e) => {
                    tracing::warn!(claim = %record.claim, error = %kubedev_core::echo::Chain(&e), "applying a prepared claim's configuration again failed");
                    rec.reapply_failed
                        .push((uid.to_string(), kubedev_core::echo::chain(&e)));
                }
            }
        }
        self.metadata
            .write(
                &record.claim,
                record.pod_claim_name.clone(),
                &record.prepared,
                true,
            )
            .await?;
        Ok(())
    }

    /// Removes the temporary files of CDI writes a crash interrupted. Another running instance
    /// (a rolling update) may be writing one right now: then only old ones go.
    async fn remove_interrupted_writes(&self) -> Result<Vec<PathBuf>, StepError> {
        let cdi = self.cdi.clone();
        self.journal
            .with_store(move |s| {
                let margin = if s.other_instances_alive() {
                    STALE_TEMP_MARGIN
                } else {
                    std::time::Duration::ZERO
                };
                cdi.remove_stale_temp_files(margin)
            })
            .await
    }
}

/// Why the checkpoint's records were lost, as [`Recovery::checkpoint_lost`] says it, given what
/// opening it found and how many CDI specs of this driver exist.
fn why_records_lost(checkpoint: &LoadOutcome, spec_files: usize) -> Option<String> {
    match checkpoint {
        LoadOutcome::Corrupt { .. } => Some(checkpoint.to_string()),
        LoadOutcome::Created if spec_files != 0 => Some(format!(
            "the checkpoint was missing while {spec_files} CDI specs of this driver existed"
        )),
        _ => None,
    }
}
