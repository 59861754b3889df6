//! The `DevicePlugin` gRPC service: the kubelet's calls, checked and answered.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use kubedev_core::HealthState;
use prost::Message;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::preferred::{PreferenceRequest, check_preference, default_preference};
use super::{Allocation, DevicePluginHandler, MAX_MESSAGE_BYTES, PluginDevice};
use crate::pb::deviceplugin::v1beta1 as api;

/// The service behind one resource's socket.
#[allow(missing_debug_implementations)] // holds the handler, a trait object
pub struct Service {
    pub(crate) resource: String,
    pub(crate) devices: watch::Receiver<Vec<PluginDevice>>,
    pub(crate) handler: Arc<dyn DevicePluginHandler>,
    pub(crate) pre_start_timeout: Duration,
    pub(crate) shutdown: CancellationToken,
}

/// The ListAndWatch message for a device list.
pub(crate) fn snapshot(devices: &[PluginDevice]) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: devices
            .iter()
            .map(|d| api::Device {
                id: d.id.clone(),
                health: match d.health.state {
                    HealthState::Healthy => "Healthy",
                    _ => "Unhealthy",
                }
                .to_string(),
                topology: d.numa_node.map(|n| api::TopologyInfo {
                    nodes: vec![api::NumaNode { id: n }],
                }),
            })
            .collect(),
    }
}

fn too_big(resource: &str, n: usize, bytes: usize) -> Status {
    Status::resource_exhausted(format!(
        "ListAndWatch snapshot of {resource} with {n} devices is {bytes} bytes, over the kubelet's \
         {MAX_MESSAGE_BYTES}-byte message limit; split the devices over more resources"
    ))
}

impl Service {
    fn current(&self) -> Vec<PluginDevice> {
        self.devices.borrow().clone()
    }

    /// Looks up `ids` (field `field`), rejecting unknown, unhealthy, duplicate or no IDs.
    fn resolve(&self, field: &str, ids: &[String]) -> Result<Vec<PluginDevice>, Status> {
        if ids.is_empty() {
            return Err(Status::invalid_argument(format!(
                "{field}: no device IDs given"
            )));
        }
        let current = self.devices.borrow();
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if !seen.insert(id.as_str()) {
                return Err(Status::invalid_argument(format!(
                    "{field}: device ID {id} is listed twice",
                    id = kubedev_core::echo::echo(id)
                )));
            }
            let Some(dev) = current.iter().find(|d| &d.id == id) else {
                return Err(Status::invalid_argument(format!(
                    "{field}: unknown device ID {id} for resource {}",
                    self.resource,
                    id = kubedev_core::echo::echo(id)
                )));
            };
            if !dev.health.is_healthy() {
                let why = dev.health.reason.as_deref().unwrap_or("no reason given");
                return Err(Status::invalid_argument(format!(
                    "{field}: device {id} is unhealthy: {why}",
                    id = kubedev_core::echo::echo(id)
                )));
            }
            out.push(dev.clone());
        }
        Ok(out)
    }
}

fn to_response(a: Allocation) -> api::ContainerAllocateResponse {
    let e = a.edits;
    api::ContainerAllocateResponse {
        envs: e.env.into_iter().collect(),
        mounts: e
            .mounts
            .iter()
            .map(|m| api::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                read_only: m.is_read_only(),
            })
            .collect(),
        devices: e
            .device_nodes
            .iter()
            .map(|n| api::DeviceSpec {
                container_path: n.path.clone(),
                host_path: n.host_path().to_string(),
                permissions: n.permissions.clone().unwrap_or_else(|| "rw".into()),
            })
            .collect(),
        annotations: e.annotations.into_iter().collect(),
        cdi_devices: a
            .cdi_devices
            .into_iter()
            .map(|name| api::CdiDevice { name })
            .collect(),
    }
}

type SnapshotStream =
    Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: self.handler.needs_pre_start(),
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = SnapshotStream;

    async fn list_and_watch(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.devices.clone();
        let shutdown = self.shutdown.clone();
        let resource = self.resource.clone();
        // State: (receiver, first-message-sent, stream-finished).
        let stream = futures::stream::unfold((rx, false, false), move |(mut rx, sent, done)| {
            let shutdown = shutdown.clone();
            let resource = resource.clone();
            async move {
                if done {
                    return None;
                }
                if sent {
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        changed = rx.changed() => if changed.is_err() { return None },
                    }
                }
                let devices = rx.borrow_and_update().clone();
                let msg = snapshot(&devices);
                let bytes = msg.encoded_len();
                if bytes > MAX_MESSAGE_BYTES {
                    tracing::error!(%resource, devices = devices.len(), bytes, "snapshot too big for the kubelet");
                    return Some((
                        Err(too_big(&resource, devices.len(), bytes)),
                        (rx, true, true),
                    ));
                }
                Some((Ok(msg), (rx, true, false)))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let devices = self.current();
        let mut responses = Vec::new();
        for (i, req) in request.into_inner().container_requests.iter().enumerate() {
            let size = usize::try_from(req.allocation_size).map_err(|_| {
                Status::invalid_argument(format!(
                    "container_requests[{i}].allocation_size is negative ({})",
                    req.allocation_size
                ))
            })?;
            let pref = PreferenceRequest::new(
                &req.available_device_i_ds,
                &req.must_include_device_i_ds,
                size,
                &devices,
            )
            .map_err(|e| Status::invalid_argument(format!("container_requests[{i}]: {e}")))?;
            let chosen = match self.handler.preferred_allocation(&pref) {
                Some(ids) => match check_preference(&pref, &ids) {
                    Ok(()) => ids,
                    Err(why) => {
                        tracing::warn!(resource = %self.resource, %why, "selection policy answer rejected; using NUMA packing");
                        default_preference(&pref)
                    }
                },
                None => default_preference(&pref),
            };
            responses.push(api::ContainerPreferredAllocationResponse {
                device_i_ds: chosen,
            });
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses: responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let req = request.into_inner();
        let mut resolved = Vec::with_capacity(req.container_requests.len());
        for (i, c) in req.container_requests.iter().enumerate() {
            resolved.push(self.resolve(
                &format!("container_requests[{i}].devices_ids"),
                &c.devices_ids,
            )?);
        }
        let mut responses = Vec::with_capacity(resolved.len());
        for (i, devs) in resolved.iter().enumerate() {
            let allocation = self.handler.allocate(devs).await.map_err(|e| {
                tracing::warn!(resource = %self.resource, error = %kubedev_core::echo::Chain(&e), "allocate failed");
                Status::internal(format!("container_requests[{i}]: {}", kubedev_core::echo::chain(&e)))
            })?;
            responses.push(to_response(allocation));
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses: responses,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        let req = request.into_inner();
        let devs = self.resolve("devices_ids", &req.devices_ids)?;
        if !self.handler.needs_pre_start() {
            return Ok(Response::new(api::PreStartContainerResponse {}));
        }
        match tokio::time::timeout(self.pre_start_timeout, self.handler.pre_start(&devs)).await {
            Ok(Ok(())) => Ok(Response::new(api::PreStartContainerResponse {})),
            Ok(Err(e)) => Err(Status::internal(format!(
                "pre-start failed: {}",
                kubedev_core::echo::chain(&e)
            ))),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "pre-start did not finish within {:?}",
                self.pre_start_timeout
            ))),
        }
    }
}
