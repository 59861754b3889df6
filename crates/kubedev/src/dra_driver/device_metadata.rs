//! The device metadata files of prepared claims (KEP-5304), when enabled: written, checked and
//! removed off the async threads.

use std::collections::BTreeMap;
use std::sync::Arc;

use kubedev_core::{ClaimRef, Inventory, PreparedDevice};
use parking_lot::RwLock;

use super::{StepError, blocking};
use crate::metadata::MetadataWriter;

/// Claims' device metadata: the writer when metadata is on, and the inventory whose attributes
/// the files carry.
#[derive(Debug, Default)]
pub(super) struct ClaimMetadata {
    writer: Option<Arc<MetadataWriter>>,
    inventory: Option<Arc<RwLock<Inventory>>>,
}

impl ClaimMetadata {
    /// Metadata written with `writer`.
    pub(super) fn on(&mut self, writer: MetadataWriter) {
        self.writer = Some(Arc::new(writer));
    }

    /// Devices' attributes read from `inventory`.
    pub(super) fn read_from(&mut self, inventory: Arc<RwLock<Inventory>>) {
        self.inventory = Some(inventory);
    }

    /// The writer, when metadata is on.
    pub(super) fn writer(&self) -> Option<Arc<MetadataWriter>> {
        self.writer.clone()
    }

    /// Writes (`ensure`: checks and repairs) `claim`'s device metadata; the CDI ID per main
    /// request. Nothing when metadata is off.
    pub(super) async fn write(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<String>,
        prepared: &[PreparedDevice],
        ensure: bool,
    ) -> Result<BTreeMap<String, String>, StepError> {
        let Some(m) = self.writer.clone() else {
            return Ok(BTreeMap::new());
        };
        // A copy, for the work done off the async threads.
        let inventory = self.inventory.as_ref().map(|i| i.read().clone());
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
    pub(super) async fn remove(&self, claim: &ClaimRef) -> Result<(), StepError> {
        let Some(m) = self.writer.clone() else {
            return Ok(());
        };
        let claim = claim.clone();
        blocking(move || m.remove_claim(&claim)).await
    }
}
