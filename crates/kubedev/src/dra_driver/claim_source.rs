//! Where the driver reads a claim's allocation from, and where it reports what it prepared:
//! the API server in the daemon, a table in tests.

use async_trait::async_trait;
use kubedev_core::{AllocatedDevice, ClaimRef, PreparedDevice};
use kubedev_kubelet_grpc::dra::ClaimError;

/// The reason of a status report's error when the claim is gone: deleted, or replaced by a
/// claim of the same name with another UID. Nothing is left to write, so it is not tried again.
pub const CLAIM_GONE: &str = "claim_gone";

/// Where the allocation of a claim comes from (the API server, or a test's table).
#[async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    /// The devices allocated to `claim` for this driver, with their requests, share IDs and
    /// opaque configuration. Errors say why the claim cannot be prepared (not found, UID
    /// mismatch, not allocated, nothing for this driver).
    async fn allocated_devices(&self, claim: &ClaimRef)
    -> Result<Vec<AllocatedDevice>, ClaimError>;

    /// [`ClaimSource::allocated_devices`] with what else the claim says that prepare uses (the
    /// pod's name for a claim made from a template). By default only the devices.
    async fn allocation(&self, claim: &ClaimRef) -> Result<ClaimAllocation, ClaimError> {
        Ok(ClaimAllocation {
            devices: self.allocated_devices(claim).await?,
            pod_claim_name: None,
        })
    }

    /// Every claim the cluster says is allocated devices of this driver and reserved for a
    /// consumer, with those devices: what recovery rebuilds from when the checkpoint was lost.
    /// `Err` says why the source cannot tell (then nothing may be judged orphaned).
    async fn reserved_claims(&self) -> Result<Vec<ReservedClaim>, String> {
        Err("this claim source cannot list the cluster's claims".into())
    }

    /// Reports `prepared`, the claim's devices as the backend prepared them, in the claim's
    /// status (`status.devices`: `Ready`, the backend's data). Called in the background after
    /// each successful prepare; by default nothing is reported. A retryable error is tried
    /// again a few times; an error with the reason [`CLAIM_GONE`] (the claim was deleted or
    /// replaced) is not.
    async fn report_prepared(
        &self,
        claim: &ClaimRef,
        prepared: &[PreparedDevice],
    ) -> Result<(), ClaimError> {
        let _ = (claim, prepared);
        Ok(())
    }

    /// Takes this driver's devices out of the claim's status after an unprepare; by default
    /// nothing is reported. Errors are treated as [`ClaimSource::report_prepared`]'s are.
    async fn report_unprepared(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        let _ = claim;
        Ok(())
    }
}

/// A claim the cluster says is allocated devices of this driver and reserved for a consumer
/// (see [`ClaimSource::reserved_claims`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ReservedClaim {
    /// The claim.
    pub claim: ClaimRef,
    /// Its devices of this driver.
    pub devices: Vec<AllocatedDevice>,
    /// Whether the allocation's node selector names this node: `Some(true)` when it picks this
    /// node by name (its devices are this node's even while no backend serves their pool),
    /// `Some(false)` when it names other nodes only, `None` when it names no node.
    pub on_this_node: Option<bool>,
}

impl ReservedClaim {
    /// `claim` with `devices`, on this node as `on_this_node` says.
    pub fn new(claim: ClaimRef, devices: Vec<AllocatedDevice>, on_this_node: Option<bool>) -> Self {
        ReservedClaim {
            claim,
            devices,
            on_this_node,
        }
    }
}

/// A claim's allocation for this driver, as a [`ClaimSource`] reads it.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ClaimAllocation {
    /// The devices allocated by this driver, with requests, share IDs and configuration.
    pub devices: Vec<AllocatedDevice>,
    /// The claim's `resource.kubernetes.io/pod-claim-name` annotation: the pod's name for a
    /// claim made from a template.
    pub pod_claim_name: Option<String>,
}

impl ClaimAllocation {
    /// `devices`, for a claim not made from a template.
    pub fn new(devices: Vec<AllocatedDevice>) -> Self {
        ClaimAllocation {
            devices,
            pod_claim_name: None,
        }
    }
}
