//! The cluster side of DRA mode, through the API server.

use std::sync::Arc;

use async_trait::async_trait;
use kubedev_apiserver::DeviceStatus;
use kubedev_apiserver::{ClaimReader, NodeEvents, PublisherTask, SlicePublisher, connect};
use kubedev_core::{AllocatedDevice, ClaimRef, PreparedDevice, Publisher};
use kubedev_kubelet_grpc::dra::{ClaimError, Retry};

use crate::config::DraSpec;
use crate::dra_driver::{CLAIM_GONE, ClaimAllocation, ClaimSource, ReservedClaim};

/// What the DRA mode needs from the cluster: where claims are read and where slices are written.
/// The binary builds them from the API server; tests pass their own.
#[derive(Clone)]
pub struct ClusterServices {
    /// Reads the allocation of a claim.
    pub claims: Arc<dyn ClaimSource>,
    /// Publishes the inventory as ResourceSlices.
    pub slices: Arc<dyn Publisher>,
    /// Records Kubernetes Events about the node (what recovery lost and rebuilt), when the API
    /// server is reachable.
    pub events: Option<kubedev_apiserver::NodeEvents>,
    /// What the API server keeps of what kubedev writes (its version, the gated features it
    /// drops and what was published instead), when the slices go to an API server.
    pub api: Option<kubedev_apiserver::ApiStatus>,
}

impl std::fmt::Debug for ClusterServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterServices")
    }
}

/// Claims through the API server; `status` says whether their device status is written.
struct ApiClaims {
    reader: ClaimReader,
    status: bool,
    /// This node's name, which an allocation of its devices names.
    node: String,
}

#[async_trait]
impl ClaimSource for ApiClaims {
    async fn allocated_devices(
        &self,
        claim: &ClaimRef,
    ) -> Result<Vec<AllocatedDevice>, ClaimError> {
        self.allocation(claim).await.map(|a| a.devices)
    }

    async fn allocation(&self, claim: &ClaimRef) -> Result<ClaimAllocation, ClaimError> {
        let found = self.reader.get(claim).await.map_err(|e| {
            ClaimError::new(
                "claim_lookup",
                Retry::from_retryable(e.is_retryable()),
                kubedev_core::echo::chain(&e),
            )
        })?;
        let mut out = ClaimAllocation::new(found.devices());
        out.pod_claim_name = found.pod_claim_name;
        Ok(out)
    }

    async fn report_prepared(
        &self,
        claim: &ClaimRef,
        prepared: &[PreparedDevice],
    ) -> Result<(), ClaimError> {
        if !self.status {
            return Ok(());
        }
        let devices: Vec<DeviceStatus> = prepared.iter().map(DeviceStatus::prepared).collect();
        self.reader
            .set_device_status(claim, &devices)
            .await
            .map_err(|e| status_error(&e))
    }

    async fn report_unprepared(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        if !self.status {
            return Ok(());
        }
        self.reader
            .clear_device_status(claim)
            .await
            .map_err(|e| status_error(&e))
    }

    async fn reserved_claims(&self) -> Result<Vec<ReservedClaim>, String> {
        self.reader
            .reserved_claims()
            .await
            .map(|list| {
                list.into_iter()
                    .map(|c| {
                        let here = (!c.node_names.is_empty()).then(|| c.names_node(&self.node));
                        ReservedClaim::new(c.claim.clone(), c.devices(), here)
                    })
                    .collect()
            })
            .map_err(|e| kubedev_core::echo::chain(&e))
    }
}

/// A failed status write: [`CLAIM_GONE`] when the claim was deleted or replaced, otherwise
/// retryable as the API server's answer says.
fn status_error(e: &kubedev_apiserver::Error) -> ClaimError {
    let message = kubedev_core::echo::chain(e);
    match e {
        kubedev_apiserver::Error::ClaimNotFound { .. }
        | kubedev_apiserver::Error::ClaimUidMismatch { .. } => {
            ClaimError::permanent(CLAIM_GONE, message)
        }
        _ => ClaimError::new(
            "claim_status",
            Retry::from_retryable(e.is_retryable()),
            message,
        ),
    }
}

/// Connects to the API server for `spec`'s driver and node and starts slice publishing; the task
/// must be stopped when the daemon stops.
pub async fn connect_cluster(spec: &DraSpec) -> anyhow::Result<(ClusterServices, PublisherTask)> {
    let client = connect(spec.kubeconfig.as_deref()).await?;
    let publisher = SlicePublisher::new(client.clone(), spec.driver.clone(), &spec.node_name)?
        .with_unhealthy_devices(spec.unhealthy_devices)
        .with_rate_limit(spec.slice_requests.qps, spec.slice_requests.burst);
    let api = publisher.api_status();
    if !spec.device_classes.is_empty() {
        tokio::spawn(kubedev_apiserver::apply_device_classes_until_done(
            client.clone(),
            spec.device_classes.clone(),
            std::time::Duration::from_secs(30),
            api.clone(),
        ));
    }
    let task = publisher.start()?;
    // The reporting instance names this daemon (its pod, when the chart says) within the
    // 128 characters the API server allows.
    let mut instance = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("kubedev@{}", spec.node_name));
    if instance.len() > 128 {
        let mut end = 128;
        while !instance.is_char_boundary(end) {
            end -= 1;
        }
        instance.truncate(end);
    }
    let events = NodeEvents::new(client.clone(), spec.node_name.to_string(), instance);
    let services = ClusterServices {
        claims: Arc::new(ApiClaims {
            reader: ClaimReader::new(client, spec.driver.clone()),
            status: spec.claim_status,
            node: spec.node_name.to_string(),
        }),
        slices: Arc::new(publisher),
        events: Some(events),
        api: Some(api),
    };
    Ok((services, task))
}
