//! `ClaimReader`: fetching a ResourceClaim (its names checked before they reach a request path,
//! its UID checked against the one asked for) and writing this driver's device status with
//! conditional, retried merge patches.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kubedev_core::{ClaimRef, DriverName};

use super::status::{DeviceStatus, merge_device_status};
use super::{AllocatedClaim, allocated_claim};
use crate::error::Error;
use crate::error::api_code;

/// Reads ResourceClaims for prepare and writes this driver's device status, with a few dozen
/// requests to the API server at a time at most (shared by its clones), however many claims the
/// kubelet hands over at once.
#[derive(Clone)]
pub struct ClaimReader {
    pub(crate) client: Client,
    pub(crate) driver: DriverName,
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// The most claim requests a [`ClaimReader`] (and its clones) has at the API server at once:
/// a `NodePrepareResources` call of thousands of claims reads them over this many reused
/// connections, instead of opening one per claim.
pub(crate) const MAX_IN_FLIGHT: usize = 32;

/// Pauses before each retry of a request the API server's flow control turned away (`429`):
/// about 15 s in all, well within the kubelet's 45 s for a call.
const THROTTLED_PAUSES: [Duration; 6] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

impl fmt::Debug for ClaimReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimReader")
            .field("driver", &self.driver)
            .finish_non_exhaustive()
    }
}

/// How many times a status write is tried when it keeps conflicting.
const STATUS_ATTEMPTS: u32 = 5;

impl ClaimReader {
    /// A reader for `driver`, talking through `client`.
    pub fn new(client: Client, driver: DriverName) -> Self {
        ClaimReader {
            client,
            driver,
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
        }
    }

    /// Sends one request made by `request` once a slot of [`MAX_IN_FLIGHT`] is free, and again
    /// after a pause while the API server answers `429 Too Many Requests`.
    async fn send<T, F>(&self, mut request: impl FnMut() -> F) -> Result<T, kube::Error>
    where
        F: Future<Output = Result<T, kube::Error>>,
    {
        let mut pauses = THROTTLED_PAUSES.iter();
        loop {
            let answer = {
                // The semaphore is never closed, so a permit always comes.
                let _slot = self.in_flight.acquire().await;
                request().await
            };
            match (answer, pauses.next()) {
                (Err(error), Some(pause)) if api_code(&error) == Some(429) => {
                    tracing::debug!(%error, "the API server asks to slow down; trying again");
                    tokio::time::sleep(*pause).await;
                }
                (answer, _) => return answer,
            }
        }
    }

    fn api(&self, namespace: &str) -> Api<res::ResourceClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn fetch(&self, claim: &ClaimRef) -> Result<res::ResourceClaim, Error> {
        let api = self.api(claim.namespace.as_str());
        match self.send(|| api.get(claim.name.as_str())).await {
            Ok(found) => Ok(found),
            Err(error) if api_code(&error) == Some(404) => Err(Error::ClaimNotFound {
                namespace: claim.namespace.to_string(),
                name: claim.name.to_string(),
            }),
            Err(error) => Err(Error::Claim {
                operation: "reading",
                namespace: claim.namespace.to_string(),
                name: claim.name.to_string(),
                error: Box::new(error),
            }),
        }
    }

    /// Fetches the claim, checks it is the one asked for (same UID) and allocated, and returns
    /// this driver's part of the allocation.
    pub async fn get(&self, claim: &ClaimRef) -> Result<AllocatedClaim, Error> {
        let found = self.fetch(claim).await?;
        allocated_claim(&self.driver, claim, &found)
    }

    /// Writes `devices` into the claim's `status.devices` (a merge patch of the status
    /// subresource, conditional on the claim's resourceVersion and UID; none when the entries
    /// are already as they would be): entries of this driver for the same device and share ID
    /// are replaced, everything else is kept. A condition keeps
    /// its transition time when its status did not change. Conflicts are retried after
    /// re-reading the claim. A name or namespace that breaks Kubernetes' naming rules is refused
    /// before any request.
    pub async fn set_device_status(
        &self,
        claim: &ClaimRef,
        devices: &[DeviceStatus],
    ) -> Result<(), Error> {
        self.update_device_status(claim, |entries| {
            // A repeated prepare finds its entries as written (transition times kept): nothing
            // to patch.
            let before = entries.clone();
            merge_device_status(entries, &self.driver, devices, Timestamp::now());
            *entries != before
        })
        .await
    }

    /// Removes every entry of this driver from the claim's `status.devices` (after unprepare),
    /// as [`set_device_status`](Self::set_device_status) writes them; a claim without any is
    /// left alone. A claim that is gone is success: there is nothing left to clear.
    pub async fn clear_device_status(&self, claim: &ClaimRef) -> Result<(), Error> {
        let driver = self.driver.as_str().to_owned();
        match self
            .update_device_status(claim, |entries| {
                let before = entries.len();
                entries.retain(|e| e.driver != driver);
                entries.len() != before
            })
            .await
        {
            Err(Error::ClaimNotFound { .. } | Error::ClaimUidMismatch { .. }) => Ok(()),
            other => other,
        }
    }

    /// Reads the claim, lets `change` edit its `status.devices` (returning whether it changed
    /// anything) and writes them back conditionally, under this driver's field manager;
    /// conflicts are retried after re-reading.
    async fn update_device_status(
        &self,
        claim: &ClaimRef,
        mut change: impl FnMut(&mut Vec<res::AllocatedDeviceStatus>) -> bool,
    ) -> Result<(), Error> {
        let api = self.api(claim.namespace.as_str());
        let params = PatchParams {
            field_manager: Some(self.field_manager()),
            ..PatchParams::default()
        };
        for _ in 0..STATUS_ATTEMPTS {
            let found = self.fetch(claim).await?;
            check_uid(claim, &found)?;
            let mut entries = found.status.and_then(|s| s.devices).unwrap_or_default();
            if !change(&mut entries) {
                return Ok(());
            }
            // A merge patch of the status alone: the spec (and any status field this client's
            // API types do not know) is left as the server has it. The resourceVersion and UID
            // make it conditional on the claim being the one just read.
            let patch = serde_json::json!({
                "metadata": {
                    "uid": found.metadata.uid,
                    "resourceVersion": found.metadata.resource_version,
                },
                "status": {"devices": entries},
            });
            let patch = Patch::Merge(&patch);
            match self
                .send(|| api.patch_status(claim.name.as_str(), &params, &patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(error) if api_code(&error) == Some(409) => continue,
                Err(error) if api_code(&error) == Some(404) => {
                    return Err(Error::ClaimNotFound {
                        namespace: claim.namespace.to_string(),
                        name: claim.name.to_string(),
                    });
                }
                Err(error) => {
                    return Err(Error::Claim {
                        operation: "writing the status of",
                        namespace: claim.namespace.to_string(),
                        name: claim.name.to_string(),
                        error: Box::new(error),
                    });
                }
            }
        }
        Err(Error::ClaimConflict {
            claim: claim.to_string(),
            attempts: STATUS_ATTEMPTS,
        })
    }

    /// The field manager of this driver's status writes: `kubedev-<driver>`, within the 128
    /// characters the API server allows.
    fn field_manager(&self) -> String {
        let mut name = format!("kubedev-{}", self.driver);
        name.truncate(128);
        name
    }
}

pub(super) fn check_uid(expected: &ClaimRef, found: &res::ResourceClaim) -> Result<(), Error> {
    let actual = found.metadata.uid.clone().unwrap_or_default();
    if actual != expected.uid {
        return Err(Error::ClaimUidMismatch {
            namespace: expected.namespace.to_string(),
            name: expected.name.to_string(),
            expected: expected.uid.to_string(),
            actual,
        });
    }
    Ok(())
}
