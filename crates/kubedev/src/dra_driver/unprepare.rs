//! Unprepare of a claim: the backend's unprepare, the claim's CDI spec and device metadata
//! removed, then its record; a claim without a record only has its files removed.

use kubedev_core::ClaimRef;
use kubedev_kubelet_grpc::dra::ClaimError;

use super::claim_status::StatusChange;
use super::{DraDriver, backend_error, blocking};
use crate::checkpoint::Change;
use crate::failpoint;

impl DraDriver {
    /// Unprepares `claim`, whose lock the caller holds; idempotent.
    pub(super) async fn unprepare_locked(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        let record = self.journal.recorded().get(claim.uid.as_str()).cloned();
        if let Some(r) = &record {
            failpoint::reached("during-unprepare").await;
            self.backends
                .unprepare(&r.claim, &r.devices)
                .await
                .map_err(|e| {
                    backend_error(
                        &e,
                        format!(
                            "unpreparing claim {claim}: {}",
                            kubedev_core::echo::chain(&e)
                        ),
                    )
                })?;
        }
        let cdi = self.cdi.clone();
        let uid = claim.uid.clone();
        blocking(move || cdi.remove_claim(&uid).map(|_| ()))
            .await
            .map_err(|e| e.for_kubelet(format_args!("removing the CDI spec of claim {claim}")))?;
        self.metadata.remove(claim).await.map_err(|e| {
            e.for_kubelet(format_args!(
                "removing the device metadata of claim {claim}"
            ))
        })?;
        if record.is_some() {
            self.journal
                .commit(Change::Remove {
                    uid: claim.uid.clone(),
                })
                .await
                .map_err(|e| e.for_kubelet(format_args!("forgetting claim {claim}")))?;
            tracing::info!(claim = %claim, "unprepared");
        }
        self.status.send(StatusChange::Unprepared(claim.clone()));
        Ok(())
    }
}
