//! After a lost checkpoint: every claim the API server says is reserved and allocated devices on
//! this node prepared again, and the CDI specs and device metadata no claim owns removed, but
//! only when the API server answered (else they are kept and the rebuild tried again later).

use std::path::PathBuf;

use kubedev_kubelet_grpc::dra::Retry;

use super::{DraDriver, Recovery, StepError};
use crate::checkpoint::ClaimState;
use crate::metadata::MetadataError;

/// How long recovery waits for the API server's list of claims after a lost checkpoint.
const REBUILD_LIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl DraDriver {
    /// Removes the CDI specs no record owns (or, when `may_remove` is false, only lists them),
    /// judged on a fresh read held under the node lock: another instance records a claim before
    /// it writes the claim's spec, so none of its specs can look orphaned while this runs.
    /// Returns the specs removed and those kept.
    pub(super) async fn sweep_orphans(
        &self,
        may_remove: bool,
    ) -> Result<(Vec<PathBuf>, Vec<PathBuf>), StepError> {
        let cdi = self.cdi.clone();
        let metadata = self.metadata.writer();
        self.journal
            .with_store(move |s| {
                s.with_fresh_claims(|owned| {
                    let (mut removed, mut kept) = (Vec::new(), Vec::new());
                    let mut files = cdi.list_claim_files()?;
                    if let Some(m) = &metadata {
                        files.extend(m.cdi().list_claim_files()?);
                        let dirs = m.list_claim_dirs().map_err(|source| MetadataError::File {
                            path: m.dir().to_path_buf(),
                            source,
                        })?;
                        for (ns, name, path) in dirs {
                            let has_record = owned
                                .values()
                                .any(|r| r.claim.namespace == ns && r.claim.name == name);
                            if has_record {
                                continue;
                            }
                            if !may_remove {
                                kept.push(path);
                                continue;
                            }
                            if let Err(source) = std::fs::remove_dir_all(&path) {
                                return Err(MetadataError::File { path, source }.into());
                            }
                            removed.push(path);
                        }
                    }
                    for (uid, path) in files {
                        if owned.contains_key(uid.as_str()) {
                            continue;
                        }
                        if !may_remove {
                            kept.push(path);
                            continue;
                        }
                        cdi.remove_spec_path(&path)?;
                        removed.push(path);
                    }
                    Ok::<_, StepError>((removed, kept))
                })
                .map_err(StepError::from)?
            })
            .await
    }

    /// Tries again what start-up recovery could not finish (see [`Recovery::retry_later`]): the
    /// API server could not be asked, or a claim's prepare failed in a way that may pass.
    /// Prepares the reserved claims of this node that have no completed record and removes the
    /// specs no claim owns. Safe while the kubelet calls the driver (each claim
    /// is prepared under its own lock, and prepare is idempotent). The result says whether the
    /// API server answered this time.
    pub async fn retry_rebuild(&self) -> Result<Recovery, StepError> {
        let mut rec = Recovery {
            checkpoint_lost: Some("finishing an earlier recovery".into()),
            ..Recovery::default()
        };
        let answered = self.rebuild(&mut rec).await;
        let (removed, kept) = self.sweep_orphans(answered).await?;
        rec.cdi_removed = removed;
        rec.kept_unverified = kept;
        Ok(rec)
    }

    /// After a lost checkpoint: prepares again every claim the API server says is reserved and
    /// allocated devices on this node. Returns whether the API server answered (only then can a
    /// spec no claim owns be called an orphan).
    pub(super) async fn rebuild(&self, rec: &mut Recovery) -> bool {
        let listed =
            match tokio::time::timeout(REBUILD_LIST_TIMEOUT, self.claims.reserved_claims()).await {
                Ok(Ok(listed)) => listed,
                Ok(Err(e)) => {
                    rec.cluster_error = Some(e);
                    rec.retry_later = true;
                    return false;
                }
                Err(_) => {
                    rec.cluster_error = Some(format!(
                        "the API server did not list the claims within {} s",
                        REBUILD_LIST_TIMEOUT.as_secs()
                    ));
                    rec.retry_later = true;
                    return false;
                }
            };
        for (claim, devices) in listed {
            if !devices
                .iter()
                .any(|d| self.backends.owner(&d.device.pool).is_some())
            {
                continue;
            }
            let lock = self.locks.of(&claim.uid);
            let _held = lock.lock().await;
            let prepared = self
                .journal
                .recorded()
                .get(claim.uid.as_str())
                .is_some_and(|r| r.state == ClaimState::PrepareCompleted);
            if prepared {
                // Rebuilt by an earlier try, or prepared by the kubelet since.
                continue;
            }
            match self.prepare_locked(&claim).await {
                Ok(_) => rec.rebuilt.push(claim.uid.to_string()),
                Err(f) => {
                    rec.retry_later |= f.retry() == Retry::Retryable;
                    rec.rebuild_failed
                        .push((claim.uid.to_string(), f.to_string()));
                }
            }
        }
        true
    }
}
