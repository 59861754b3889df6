//! Start-up recovery of the DRA driver: rolling back half-done prepares, repairing completed
//! claims' CDI specs and device metadata, applying their configuration again, rebuilding from the
//! API server after a lost checkpoint, and removing what no claim owns.

use std::path::PathBuf;

use kubedev_core::Consumer;

use super::{DraDriver, REBUILD_LIST_TIMEOUT, Recovery, STALE_TEMP_MARGIN, blocking};
use crate::cdi::SpecCheck;
use crate::checkpoint::{ClaimState, LoadOutcome};

impl DraDriver {
    /// Start-up recovery; see the module docs. Call once, before serving the kubelet, with what
    /// opening the checkpoint found.
    ///
    /// When the checkpoint's records were lost (a corrupt file, or no file while CDI specs of
    /// this driver exist), nothing a running pod needs is destroyed: every claim the API server
    /// says is allocated devices on this node and reserved for a pod is prepared again (its
    /// record and CDI spec rebuilt), and only specs whose claims the API server does not list
    /// are removed. When the API server cannot be asked, every spec is kept.
    pub async fn recover(&self, checkpoint: &LoadOutcome) -> Result<Recovery, String> {
        let mut rec = Recovery::default();
        let records: Vec<_> = {
            let store = self.store.lock();
            store
                .claims()
                .values()
                .map(|r| (r.clone(), store.in_progress_elsewhere(r)))
                .collect()
        };
        for (r, elsewhere) in records {
            let uid = r.claim.uid.clone();
            match r.state {
                ClaimState::PrepareStarted if elsewhere => {
                    // The daemon instance we replace (rolling update) is in the middle of it.
                    tracing::info!(claim = %r.claim, owner = ?r.owner, "leaving a prepare another running instance started");
                    rec.left_to_other_instance.push(uid.to_string());
                }
                ClaimState::PrepareStarted => {
                    tracing::warn!(claim = %r.claim, "rolling back a prepare interrupted by a crash");
                    self.backends
                        .unprepare(&r.claim, &r.devices)
                        .await
                        .map_err(|e| format!("rolling back claim {}: {e}", r.claim))?;
                    let cdi = self.cdi.clone();
                    let u = uid.clone();
                    blocking(move || {
                        cdi.remove_claim(&u)
                            .map_err(|e| kubedev_core::echo::chain(&e))
                    })
                    .await?;
                    self.remove_metadata(&r.claim).await?;
                    let u = uid.clone();
                    self.with_store(move |s| {
                        s.remove(u.as_str())
                            .map_err(|e| kubedev_core::echo::chain(&e))
                    })
                    .await?;
                    rec.rolled_back.push(uid.to_string());
                }
                _ => {
                    let cdi = self.cdi.clone();
                    let u = uid.clone();
                    let prepared = r.prepared.clone();
                    let check = blocking(move || {
                        cdi.ensure_claim(&u, &prepared)
                            .map_err(|e| kubedev_core::echo::chain(&e))
                    })
                    .await?;
                    if let SpecCheck::Repaired { found } = check {
                        tracing::warn!(claim = %r.claim, found = %found, "rewrote a missing or damaged CDI spec");
                        rec.cdi_repaired.push((uid.to_string(), found));
                    }
                    if r.devices.iter().any(|d| !d.config.is_empty()) {
                        match self
                            .backends
                            .prepare(&Consumer::Claim(r.claim.clone()), &r.devices)
                            .await
                        {
                            Ok(_) => rec.reapplied.push(uid.to_string()),
                            Err(e) => {
                                tracing::warn!(claim = %r.claim, error = %kubedev_core::echo::Chain(&e), "applying a prepared claim's configuration again failed");
                                rec.reapply_failed
                                    .push((uid.to_string(), kubedev_core::echo::chain(&e)));
                            }
                        }
                    }
                    self.metadata_files(&r.claim, r.pod_claim_name.clone(), &r.prepared, true)
                        .await?;
                }
            }
        }
        // Edits that changed while the daemon was down (a driver upgraded meanwhile); the
        // metadata was brought up to date above.
        for uid in self.refresh(false).await {
            tracing::info!(claim_uid = %uid, "a prepared claim's container edits changed while the daemon was stopped");
        }
        let cdi = self.cdi.clone();
        let spec_files = blocking(move || {
            cdi.list_claim_files()
                .map_err(|e| kubedev_core::echo::chain(&e))
        })
        .await?;
        rec.checkpoint_lost = match checkpoint {
            LoadOutcome::Corrupt { .. } => Some(checkpoint.to_string()),
            LoadOutcome::Created if !spec_files.is_empty() => Some(format!(
                "the checkpoint was missing while {} CDI specs of this driver existed",
                spec_files.len()
            )),
            _ => None,
        };
        let mut may_remove_orphans = true;
        if rec.checkpoint_lost.is_some() {
            may_remove_orphans = self.rebuild(&mut rec).await;
        }
        let (removed, kept) = self.sweep_orphans(may_remove_orphans).await?;
        rec.cdi_removed = removed;
        rec.kept_unverified = kept;
        // Temporary files of CDI writes a crash interrupted. Another running instance (a rolling
        // update) may be writing one right now: then only old ones go.
        let cdi = self.cdi.clone();
        rec.cdi_temp_removed = self
            .with_store(move |s| {
                let margin = if s.other_instances_alive() {
                    STALE_TEMP_MARGIN
                } else {
                    std::time::Duration::ZERO
                };
                cdi.remove_stale_temp_files(margin)
                    .map_err(|e| kubedev_core::echo::chain(&e))
            })
            .await?;
        Ok(rec)
    }

    /// Removes the CDI specs no record owns (or, when `may_remove` is false, only lists them),
    /// judged on a fresh read held under the node lock: another instance records a claim before
    /// it writes the claim's spec, so none of its specs can look orphaned while this runs.
    /// Returns the specs removed and those kept.
    async fn sweep_orphans(
        &self,
        may_remove: bool,
    ) -> Result<(Vec<PathBuf>, Vec<PathBuf>), String> {
        let cdi = self.cdi.clone();
        let metadata = self.metadata.clone();
        self.with_store(move |s| {
            s.with_fresh_claims(|owned| {
                let (mut removed, mut kept) = (Vec::new(), Vec::new());
                let mut files = cdi
                    .list_claim_files()
                    .map_err(|e| kubedev_core::echo::chain(&e))?;
                if let Some(m) = &metadata {
                    files.extend(
                        m.cdi()
                            .list_claim_files()
                            .map_err(|e| kubedev_core::echo::chain(&e))?,
                    );
                    let dirs = m
                        .list_claim_dirs()
                        .map_err(|e| kubedev_core::echo::chain(&e))?;
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
                        std::fs::remove_dir_all(&path).map_err(|e| {
                            format!("removing orphan device metadata {}: {e}", path.display())
                        })?;
                        removed.push(path);
                    }
                }
                for (uid, path) in files {
                    if owned.contains_key(&uid) {
                        continue;
                    }
                    if !may_remove {
                        kept.push(path);
                        continue;
                    }
                    cdi.remove_spec_path(&path)
                        .map_err(|e| format!("removing orphan CDI file {}: {e}", path.display()))?;
                    removed.push(path);
                }
                Ok((removed, kept))
            })
            .map_err(|e| kubedev_core::echo::chain(&e))?
        })
        .await
    }

    /// Tries again what start-up recovery could not finish because the API server could not be
    /// asked (see [`Recovery::cluster_error`]): prepares the reserved claims of this node again
    /// and removes the specs no claim owns. Safe while the kubelet calls the driver (each claim
    /// is prepared under its own lock, and prepare is idempotent). The result says whether the
    /// API server answered this time.
    pub async fn retry_rebuild(&self) -> Result<Recovery, String> {
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
    async fn rebuild(&self, rec: &mut Recovery) -> bool {
        let listed =
            match tokio::time::timeout(REBUILD_LIST_TIMEOUT, self.claims.reserved_claims()).await {
                Ok(Ok(listed)) => listed,
                Ok(Err(e)) => {
                    rec.cluster_error = Some(e);
                    return false;
                }
                Err(_) => {
                    rec.cluster_error = Some(format!(
                        "the API server did not list the claims within {} s",
                        REBUILD_LIST_TIMEOUT.as_secs()
                    ));
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
            let lock = self.lock_for(claim.uid.as_str());
            let _held = lock.lock().await;
            match self.prepare_locked(&claim).await {
                Ok(_) => rec.rebuilt.push(claim.uid.to_string()),
                Err(f) => rec
                    .rebuild_failed
                    .push((claim.uid.to_string(), f.to_string())),
            }
        }
        true
    }
}
