//! After a lost checkpoint: every claim the API server says is reserved and allocated devices on
//! this node prepared again, and the CDI specs and device metadata no claim owns removed, but
//! only when the API server answered (else they are kept and the rebuild tried again later).

use std::collections::HashSet;
use std::path::PathBuf;

use kubedev_core::{ClaimRef, PoolName};
use kubedev_kubelet_grpc::dra::Retry;

use super::{DraDriver, Recovery, StepError, blocking};
use crate::checkpoint::ClaimState;
use crate::metadata::MetadataError;

/// How long recovery waits for the API server's list of claims after a lost checkpoint.
const REBUILD_LIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl DraDriver {
    /// Removes the CDI specs no record owns (or, when the API server did not answer, only
    /// lists them), judged on a fresh read held under the node lock: another instance records a
    /// claim before it writes the claim's spec, so none of its specs can look orphaned while
    /// this runs. The specs and metadata of `rebuild`'s waiting claims are left alone. Returns
    /// the specs removed and those kept unverified.
    pub(super) async fn sweep_orphans(
        &self,
        rebuild: Rebuild,
    ) -> Result<(Vec<PathBuf>, Vec<PathBuf>), StepError> {
        let cdi = self.cdi.clone();
        let metadata = self.metadata.writer();
        let (may_remove, waiting) = match rebuild {
            Rebuild::Unanswered => (false, Vec::new()),
            Rebuild::Answered { waiting } => (true, waiting),
        };
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
                                .map(|r| &r.claim)
                                .chain(&waiting)
                                .any(|c| c.namespace == ns && c.name == name);
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
                        if owned.contains_key(uid.as_str()) || waiting.iter().any(|c| c.uid == uid)
                        {
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
    /// API server could not be asked, or a claim of this node could not be prepared yet.
    /// Prepares the reserved claims of this node that have no completed record and removes the
    /// specs no claim owns. Safe while the kubelet calls the driver (each claim
    /// is prepared under its own lock, and prepare is idempotent). The result says whether the
    /// API server answered this time.
    pub async fn retry_rebuild(&self) -> Result<Recovery, StepError> {
        let mut rec = Recovery {
            checkpoint_lost: Some("finishing an earlier recovery".into()),
            ..Recovery::default()
        };
        let with_spec = self.claims_with_spec().await;
        let rebuild = self.rebuild(&mut rec, &with_spec).await;
        let (removed, kept) = self.sweep_orphans(rebuild).await?;
        rec.cdi_removed = removed;
        rec.kept_unverified = kept;
        Ok(rec)
    }

    /// After a lost checkpoint: prepares again every claim the API server says is reserved and
    /// allocated devices on this node. A claim is this node's when a backend serves one of its
    /// pools, when its allocation names this node, or, when it names no node, when its CDI spec
    /// is here (`with_spec` holds the UIDs of the claims whose spec is). A claim of this node
    /// that could not be prepared, a pool of it served by no
    /// backend at the moment (a discovery failed) among the reasons, is listed in
    /// [`Recovery::rebuild_failed`], and tried again later unless the failure is permanent.
    pub(super) async fn rebuild(&self, rec: &mut Recovery, with_spec: &HashSet<String>) -> Rebuild {
        let listed =
            match tokio::time::timeout(REBUILD_LIST_TIMEOUT, self.claims.reserved_claims()).await {
                Ok(Ok(listed)) => listed,
                Ok(Err(e)) => {
                    rec.cluster_error = Some(e);
                    rec.retry_later = true;
                    return Rebuild::Unanswered;
                }
                Err(_) => {
                    rec.cluster_error = Some(format!(
                        "the API server did not list the claims within {} s",
                        REBUILD_LIST_TIMEOUT.as_secs()
                    ));
                    rec.retry_later = true;
                    return Rebuild::Unanswered;
                }
            };
        let mut waiting = Vec::new();
        for reserved in listed {
            let claim = reserved.claim;
            let unserved: Vec<&PoolName> = reserved
                .devices
                .iter()
                .map(|d| &d.device.pool)
                .filter(|p| self.backends.owner(p).is_none())
                .collect();
            let served = unserved.len() < reserved.devices.len();
            let here = served
                || reserved
                    .on_this_node
                    .unwrap_or_else(|| with_spec.contains(claim.uid.as_str()));
            if !here {
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
            if !unserved.is_empty() {
                // All of the claim's devices or none: prepare refuses a device no backend owns.
                let mut pools: Vec<String> = unserved.iter().map(|p| p.to_string()).collect();
                pools.sort();
                pools.dedup();
                rec.retry_later = true;
                rec.rebuild_failed.push((
                    claim.uid.to_string(),
                    format!(
                        "no backend of this node serves its pool(s) {} now (a backend's discovery \
                         failed or has not found them); its CDI spec and device metadata are \
                         kept and the claim is prepared again once they are served",
                        pools.join(", ")
                    ),
                ));
                waiting.push(claim);
                continue;
            }
            match self.prepare_locked(&claim).await {
                Ok(_) => rec.rebuilt.push(claim.uid.to_string()),
                Err(f) => {
                    rec.retry_later |= f.retry() == Retry::Retryable;
                    rec.rebuild_failed
                        .push((claim.uid.to_string(), f.to_string()));
                    waiting.push(claim);
                }
            }
        }
        Rebuild::Answered { waiting }
    }

    /// The UIDs of the claims with a CDI spec of this driver on the node (none when the
    /// directory cannot be read).
    async fn claims_with_spec(&self) -> HashSet<String> {
        let cdi = self.cdi.clone();
        match blocking(move || cdi.list_claim_files()).await {
            Ok(files) => files.into_iter().map(|(uid, _)| uid.to_string()).collect(),
            Err(e) => {
                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "could not list the CDI specs to tell which listed claims were prepared here");
                HashSet::new()
            }
        }
    }
}

/// What the rebuild after a lost checkpoint learned from the API server.
#[derive(Debug)]
pub(super) enum Rebuild {
    /// It did not answer: no spec can be called an orphan.
    Unanswered,
    /// It answered; `waiting` are this node's claims that could not be prepared again, whose
    /// specs and metadata stay.
    Answered {
        /// The claims still to rebuild.
        waiting: Vec<ClaimRef>,
    },
}
