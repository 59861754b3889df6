//! Readers of API objects without an API server, for kubedev's fuzz targets: the same code a
//! ResourceClaim from the API server goes through. Not part of the stable API.

use kubedev_core::{ClaimRef, DriverName};

use crate::AllocatedClaim;

/// `driver`'s part of the ResourceClaim `json` (as the API server would send it), checked
/// against the claim the kubelet named, `expected`; `Err` says why it cannot be prepared.
pub fn allocated_claim_from_json(
    driver: &DriverName,
    expected: &ClaimRef,
    json: &[u8],
) -> Result<AllocatedClaim, String> {
    let claim: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_slice(json).map_err(|e| e.to_string())?;
    crate::claim::allocation::allocated_claim(driver, expected, &claim).map_err(|e| e.to_string())
}
