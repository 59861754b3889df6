//! The device metadata files of prepared claims (KEP-5304), when enabled: written, checked and
//! removed off the async threads.

use std::collections::BTreeMap;

use kubedev_core::{ClaimRef, Inventory, PreparedDevice};

use super::{DraDriver, StepError, blocking};

impl DraDriver {
    /// A copy of the inventory, for work done off the async threads.
    fn inventory_now(&self) -> Option<Inventory> {
        self.inventory.as_ref().map(|i| i.read().clone())
    }

    /// Writes (`ensure`: checks and repairs) `claim`'s device metadata; the CDI ID per main
    /// request. Nothing when metadata is off.
    pub(super) async fn metadata_files(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<String>,
        prepared: &[PreparedDevice],
        ensure: bool,
    ) -> Result<BTreeMap<String, String>, StepError> {
        let Some(m) = self.metadata.clone() else {
            return Ok(BTreeMap::new());
        };
        let inventory = self.inventory_now();
        let (claim, prepared) = (claim.clone(), prepared.to_vec());
        blocking(move || {
            let name = pod_claim_name.as_deref();
            if ensure {
                m.ensure_claim(&claim, name, &prepared, inventory.as_ref())
            } else {
                m.write_claim(&claim, name, &prepared, inventory.as_ref())
            }
        })
        .await
    }

    /// Removes `claim`'s device metadata, if metadata is on.
    pub(super) async fn remove_metadata(&self, claim: &ClaimRef) -> Result<(), StepError> {
        let Some(m) = self.metadata.clone() else {
            return Ok(());
        };
        let claim = claim.clone();
        blocking(move || m.remove_claim(&claim)).await
    }
}
