//! A client of the kubelet's pod resources API: which pod and container hold which device, in
//! both kubelet APIs (device-plugin resources and DRA claims).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::Error;
use crate::pb::podresources::v1 as pr;
use crate::uds;

/// Where the kubelet serves the pod resources API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The largest answer accepted: a dense node's `List` is big (every pod on the node is in it).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// How a device came to a container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(tag = "api", rename_all = "camelCase")]
pub enum Holding {
    /// Through a device plugin: an extended resource and the device ID it advertised.
    #[serde(rename_all = "camelCase")]
    DevicePlugin {
        /// The extended resource name.
        resource: String,
        /// The device ID.
        device: String,
    },
    /// Through a ResourceClaim.
    #[serde(rename_all = "camelCase")]
    Dra {
        /// The claim's namespace.
        claim_namespace: String,
        /// The claim's name.
        claim_name: String,
        /// The DRA driver.
        driver: String,
        /// The pool.
        pool: String,
        /// The device.
        device: String,
        /// The share, for devices allocated more than once.
        #[serde(skip_serializing_if = "Option::is_none")]
        share_id: Option<String>,
    },
}

/// One device held by one container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceUse {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// What it holds and through which API.
    #[serde(flatten)]
    pub holding: Holding,
}

/// Flattens a `List` (or `Get`) answer into one row per device held, sorted.
pub fn device_uses(pods: &[pr::PodResources]) -> Vec<DeviceUse> {
    let mut out = Vec::new();
    for pod in pods {
        for c in &pod.containers {
            let row = |holding| DeviceUse {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                container: c.name.clone(),
                holding,
            };
            for d in &c.devices {
                for id in &d.device_ids {
                    out.push(row(Holding::DevicePlugin {
                        resource: d.resource_name.clone(),
                        device: id.clone(),
                    }));
                }
            }
            for claim in &c.dynamic_resources {
                for r in &claim.claim_resources {
                    out.push(row(Holding::Dra {
                        claim_namespace: claim.claim_namespace.clone(),
                        claim_name: claim.claim_name.clone(),
                        driver: r.driver_name.clone(),
                        pool: r.pool_name.clone(),
                        device: r.device_name.clone(),
                        share_id: r.share_id.clone(),
                    }));
                }
            }
        }
    }
    out.sort();
    out
}

/// A connection to the kubelet's pod resources socket.
#[derive(Debug, Clone)]
pub struct PodResourcesClient {
    path: PathBuf,
    client: pr::pod_resources_lister_client::PodResourcesListerClient<tonic::transport::Channel>,
}

impl PodResourcesClient {
    /// Connects to the socket at `path` (usually [`DEFAULT_SOCKET`]).
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self, Error> {
        let channel = uds::dial(path, timeout).await?;
        Ok(PodResourcesClient {
            path: path.to_path_buf(),
            client: pr::pod_resources_lister_client::PodResourcesListerClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE),
        })
    }

    fn failed(&self, call: &str, status: &tonic::Status) -> Error {
        Error::Dial {
            path: self.path.clone(),
            message: format!("{call}: {} ({:?})", status.message(), status.code()),
        }
    }

    /// Every active pod with what its containers hold.
    pub async fn list(&mut self) -> Result<Vec<pr::PodResources>, Error> {
        self.client
            .list(pr::ListPodResourcesRequest {})
            .await
            .map(|r| r.into_inner().pod_resources)
            .map_err(|s| self.failed("List", &s))
    }

    /// One pod's resources; `None` when the kubelet does not know the pod.
    pub async fn get(
        &mut self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<pr::PodResources>, Error> {
        match self
            .client
            .get(pr::GetPodResourcesRequest {
                pod_name: name.to_string(),
                pod_namespace: namespace.to_string(),
            })
            .await
        {
            Ok(r) => Ok(r.into_inner().pod_resources),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) if s.message().contains("not found") => Ok(None),
            Err(s) => Err(self.failed("Get", &s)),
        }
    }

    /// The devices the node can hand out, by extended resource (healthy ones only).
    pub async fn allocatable(&mut self) -> Result<Vec<pr::ContainerDevices>, Error> {
        self.client
            .get_allocatable_resources(pr::AllocatableResourcesRequest {})
            .await
            .map(|r| r.into_inner().devices)
            .map_err(|s| self.failed("GetAllocatableResources", &s))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rows_cover_both_apis_and_are_sorted() {
        let pods = vec![pr::PodResources {
            name: "trainer".into(),
            namespace: "ml".into(),
            containers: vec![pr::ContainerResources {
                name: "main".into(),
                devices: vec![pr::ContainerDevices {
                    resource_name: "nvidia.com/gpu".into(),
                    device_ids: vec!["gpu-3".into(), "gpu-1".into()],
                    topology: None,
                }],
                dynamic_resources: vec![pr::DynamicResource {
                    claim_name: "nic".into(),
                    claim_namespace: "ml".into(),
                    claim_resources: vec![pr::ClaimResource {
                        cdi_devices: vec![],
                        driver_name: "net.example.com".into(),
                        pool_name: "node-a".into(),
                        device_name: "vf-2".into(),
                        share_id: None,
                    }],
                }],
                ..Default::default()
            }],
            ..Default::default()
        }];
        let rows = device_uses(&pods);
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[0].holding,
            Holding::DevicePlugin {
                resource: "nvidia.com/gpu".into(),
                device: "gpu-1".into()
            }
        );
        assert!(matches!(&rows[2].holding, Holding::Dra { device, .. } if device == "vf-2"));
        let json = serde_json::to_value(&rows[2]).unwrap();
        assert_eq!(json["api"], "dra");
        assert_eq!(json["claimName"], "nic");
        assert_eq!(json["pod"], "trainer");
    }
}
