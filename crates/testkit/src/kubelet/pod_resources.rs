//! The kubelet's pod resources service: answers `List`, `Get` and `GetAllocatableResources`
//! from what a test says the pods hold, on a Unix socket, as the kubelet does on
//! `/var/lib/kubelet/pod-resources/kubelet.sock`.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kubedev_kubelet_grpc::pb::podresources::v1 as pr;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Default)]
struct State {
    pods: Vec<pr::PodResources>,
    allocatable: Vec<pr::ContainerDevices>,
}

/// A running pod resources service.
#[derive(Debug)]
pub struct PodResourcesEmulator {
    path: PathBuf,
    state: Arc<Mutex<State>>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl PodResourcesEmulator {
    /// Serves on `path` (the socket is created; its directory must exist).
    pub fn start(path: &Path) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let state = Arc::new(Mutex::new(State::default()));
        let cancel = CancellationToken::new();
        let svc = Service(state.clone());
        let stop = cancel.clone();
        // The kubelet's grpc-go server takes any :authority, as the layer does.
        let incoming = kubedev_kubelet_grpc::authority::incoming(listener, path);
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(pr::pod_resources_lister_server::PodResourcesListerServer::new(svc))
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await;
        });
        Ok(PodResourcesEmulator {
            path: path.to_path_buf(),
            state,
            cancel,
            task,
        })
    }

    /// The socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn container<'a>(
        state: &'a mut State,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> &'a mut pr::ContainerResources {
        let p = match state
            .pods
            .iter()
            .position(|p| p.namespace == namespace && p.name == pod)
        {
            Some(i) => i,
            None => {
                state.pods.push(pr::PodResources {
                    name: pod.to_string(),
                    namespace: namespace.to_string(),
                    ..Default::default()
                });
                state.pods.len() - 1
            }
        };
        let pod = &mut state.pods[p];
        let c = match pod.containers.iter().position(|c| c.name == container) {
            Some(i) => i,
            None => {
                pod.containers.push(pr::ContainerResources {
                    name: container.to_string(),
                    ..Default::default()
                });
                pod.containers.len() - 1
            }
        };
        &mut pod.containers[c]
    }

    /// Records that a container got `ids` of a device-plugin resource (as after `Allocate`).
    pub fn assign_devices(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        resource: &str,
        ids: &[&str],
    ) {
        let mut st = self.state.lock();
        Self::container(&mut st, namespace, pod, container)
            .devices
            .push(pr::ContainerDevices {
                resource_name: resource.to_string(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            });
    }

    /// Records that a container uses claim `namespace/claim` holding `devices` (pool, device) of
    /// `driver` (as after NodePrepareResources).
    pub fn assign_claim(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        claim: &str,
        driver: &str,
        devices: &[(&str, &str)],
    ) {
        let mut st = self.state.lock();
        Self::container(&mut st, namespace, pod, container)
            .dynamic_resources
            .push(pr::DynamicResource {
                claim_name: claim.to_string(),
                claim_namespace: namespace.to_string(),
                claim_resources: devices
                    .iter()
                    .map(|(pool, device)| pr::ClaimResource {
                        cdi_devices: vec![pr::CdiDevice {
                            name: format!("{driver}/claim={device}"),
                        }],
                        driver_name: driver.to_string(),
                        pool_name: pool.to_string(),
                        device_name: device.to_string(),
                        share_id: None,
                    })
                    .collect(),
            });
    }

    /// A pod that holds nothing (every pod on the node is listed, device or not).
    pub fn add_pod(&self, namespace: &str, pod: &str, container: &str) {
        let mut st = self.state.lock();
        Self::container(&mut st, namespace, pod, container);
    }

    /// Sets what `GetAllocatableResources` answers for `resource`.
    pub fn set_allocatable(&self, resource: &str, ids: &[&str]) {
        let mut st = self.state.lock();
        st.allocatable.retain(|d| d.resource_name != resource);
        st.allocatable.push(pr::ContainerDevices {
            resource_name: resource.to_string(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
            topology: None,
        });
    }

    /// Stops serving and removes the socket.
    pub async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
        let _ = std::fs::remove_file(&self.path);
    }
}

#[derive(Debug, Clone)]
struct Service(Arc<Mutex<State>>);

#[tonic::async_trait]
impl pr::pod_resources_lister_server::PodResourcesLister for Service {
    async fn list(
        &self,
        _: tonic::Request<pr::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<pr::ListPodResourcesResponse>, tonic::Status> {
        let st = self.0.lock();
        Ok(tonic::Response::new(pr::ListPodResourcesResponse {
            pod_resources: st.pods.clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<pr::AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<pr::AllocatableResourcesResponse>, tonic::Status> {
        let st = self.0.lock();
        Ok(tonic::Response::new(pr::AllocatableResourcesResponse {
            devices: st.allocatable.clone(),
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: tonic::Request<pr::GetPodResourcesRequest>,
    ) -> Result<tonic::Response<pr::GetPodResourcesResponse>, tonic::Status> {
        let r = request.into_inner();
        let st = self.0.lock();
        // The kubelet answers an unknown pod with this message and code Unknown.
        let pod = st
            .pods
            .iter()
            .find(|p| p.name == r.pod_name && p.namespace == r.pod_namespace)
            .cloned()
            .ok_or_else(|| {
                tonic::Status::unknown(format!(
                    "pod {} in namespace {} not found",
                    r.pod_name, r.pod_namespace
                ))
            })?;
        Ok(tonic::Response::new(pr::GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}
