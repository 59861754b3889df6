//! Container edits and device data that changed under prepared claims: a driver upgraded or
//! reloaded while the daemon runs replaces the files a claim's CDI spec mounts, so the spec is
//! rewritten with what the backend gives now; a device whose attributes changed gets its
//! device metadata file rewritten with the next generation.

use super::{DraDriver, blocking};
use crate::checkpoint::{Change, ClaimState};

impl DraDriver {
    /// Brings each completed claim's device metadata up to date with the inventory, and asks the
    /// owning backends whether its container edits still hold: for every claim where one
    /// changed, records the new edits in the checkpoint and rewrites the claim's CDI spec. Each claim is handled under its lock, so a prepare or unprepare of
    /// the same claim never interleaves. Returns the UIDs of the claims rewritten; a failure is
    /// logged and leaves that claim as it was.
    pub async fn refresh_edits(&self) -> Vec<String> {
        self.refresh(true).await
    }

    /// [`DraDriver::refresh_edits`], bringing the device metadata up to date too when
    /// `metadata` (start-up recovery has just done that itself).
    pub(super) async fn refresh(&self, metadata: bool) -> Vec<String> {
        let uids: Vec<kubedev_core::ClaimUid> = {
            let store = self.journal.stored();
            store
                .claims()
                .values()
                .filter(|r| r.state == ClaimState::PrepareCompleted)
                .map(|r| r.claim.uid.clone())
                .collect()
        };
        let mut rewritten = Vec::new();
        for uid in uids {
            let lock = self.locks.of(&uid);
            let _held = lock.lock().await;
            // Read again under the claim's lock: it may have been unprepared meanwhile.
            let record = {
                let store = self.journal.stored();
                store.get(uid.as_str()).cloned()
            };
            let Some(record) = record.filter(|r| r.state == ClaimState::PrepareCompleted) else {
                continue;
            };
            // Device metadata first: it says what the devices are now (an unchanged file is
            // left alone; a changed one gets the next generation).
            if metadata
                && let Err(e) = self
                    .metadata
                    .write(
                        &record.claim,
                        record.pod_claim_name.clone(),
                        &record.prepared,
                        true,
                    )
                    .await
            {
                tracing::warn!(claim = %record.claim, error = %kubedev_core::echo::Chain(&e), "cannot bring a prepared claim's device metadata up to date");
            }
            let mut prepared = record.prepared.clone();
            let mut changed = false;
            for p in &mut prepared {
                match self.backends.refreshed_edits(p).await {
                    Ok(Some(edits)) => {
                        p.edits = edits;
                        changed = true;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(claim = %record.claim, device = %p.device.device, error = %kubedev_core::echo::Chain(&e), "cannot tell whether a prepared device's container edits changed");
                    }
                }
            }
            if !changed {
                continue;
            }
            // The record first: a crash before the spec is rewritten leaves recovery to write
            // the spec from the new record.
            let change = Change::Complete {
                uid: uid.clone(),
                prepared: prepared.clone(),
                cdi_file: record.cdi_file.clone(),
                pod_claim_name: record.pod_claim_name.clone(),
            };
            if let Err(e) = self
                .journal
                .with_store(move |s| s.apply(vec![change])?.pop().unwrap_or(Ok(())))
                .await
            {
                tracing::warn!(claim = %record.claim, error = %kubedev_core::echo::Chain(&e), "cannot record a prepared claim's new container edits");
                continue;
            }
            let cdi = self.cdi.clone();
            let u = uid.clone();
            match blocking(move || cdi.ensure_claim(&u, &prepared)).await {
                Ok(_) => {
                    tracing::info!(claim = %record.claim, "rewrote a prepared claim's CDI spec: its container edits changed (driver upgrade or reload)");
                    rewritten.push(uid.to_string());
                }
                Err(e) => {
                    tracing::warn!(claim = %record.claim, error = %kubedev_core::echo::Chain(&e), "cannot rewrite a prepared claim's CDI spec with its new container edits");
                }
            }
        }
        rewritten
    }
}
