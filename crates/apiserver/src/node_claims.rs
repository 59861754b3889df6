//! The claims the cluster says this driver holds on this node: what start-up recovery rebuilds
//! from when the node's own record of its prepared claims was lost.

use k8s_openapi::api::resource::v1 as res;
use kube::api::{Api, ListParams};
use kubedev_core::ClaimRef;

use crate::claim::{AllocatedClaim, ClaimReader, allocated_claim};
use crate::error::Error;

/// How many claims one list page holds.
const PAGE: u32 = 500;

impl ClaimReader {
    /// Every ResourceClaim in the cluster that is allocated devices of this driver and reserved
    /// for at least one consumer (a pod), with this driver's part of its allocation. A claim
    /// whose allocation this driver cannot read is left out (it could not be prepared either).
    /// The caller keeps the claims whose pools are on its node.
    pub async fn reserved_claims(&self) -> Result<Vec<AllocatedClaim>, Error> {
        let api: Api<res::ResourceClaim> = Api::all(self.client.clone());
        let mut out = Vec::new();
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = api.list(&params).await.map_err(|error| Error::ListClaims {
                error: Box::new(error),
            })?;
            for claim in &page.items {
                if let Some(found) = reserved_claim(self, claim) {
                    out.push(found);
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        Ok(out)
    }
}

/// This driver's part of `claim` when it is reserved and has devices of this driver.
fn reserved_claim(reader: &ClaimReader, claim: &res::ResourceClaim) -> Option<AllocatedClaim> {
    let status = claim.status.as_ref()?;
    if status.reserved_for.as_ref().is_none_or(|r| r.is_empty()) {
        return None;
    }
    let meta = &claim.metadata;
    // Kubernetes UIDs always make valid claim UIDs; anything else cannot be prepared here.
    let reference = ClaimRef::new(
        kubedev_core::ClaimUid::new(meta.uid.clone()?).ok()?,
        meta.namespace.clone()?.parse().ok()?,
        meta.name.clone()?.parse().ok()?,
    );
    let allocated = allocated_claim(&reader.driver, &reference, claim).ok()?;
    (!allocated.results.is_empty()).then_some(allocated)
}
