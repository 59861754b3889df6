//! kubedev's API-server side: ResourceSlice publishing and ResourceClaim reading through kube-rs.
//!
//! This is the only crate of kubedev that knows kube-rs and the Kubernetes API types. It offers
//! two things:
//!
//! - [`SlicePublisher`], the [`Publisher`](kubedev_core::Publisher) that makes a node's
//!   inventory visible as `resource.k8s.io/v1` ResourceSlices and keeps them right (chunking,
//!   pool generations, owner reference, drift repair, conflicts, backoff, rate limiting);
//! - [`ClaimReader`], which fetches a ResourceClaim for prepare, checks its UID and allocation,
//!   and returns this driver's devices with the opaque configuration that applies to each, and
//!   which can report per-device conditions in the claim's status.
//!
//! ```no_run
//! use std::time::Duration;
//! use kubedev_apiserver::SlicePublisher;
//! use kubedev_core::{Device, DeviceName, DriverName, Inventory, Pool, PoolName, Publisher};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = kube::Client::try_default().await?;
//! let driver = DriverName::new("gpu.example.com")?;
//! let publisher = SlicePublisher::new(client, driver, "node-a")?;
//! let task = publisher.start()?;
//!
//! let gpu = Device::new(DeviceName::new("gpu-0")?).with_numa_node(0);
//! let inventory = Inventory::new(vec![Pool::new(PoolName::new("node-a")?, vec![gpu])]);
//! publisher.publish(&inventory).await?;
//! publisher.wait_synced(Duration::from_secs(10)).await?;
//!
//! task.stop().await;
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod claim;
mod classes;
mod connect;
mod convert;
mod degrade;
mod error;
mod events;
mod explain_inputs;
mod features;
#[doc(hidden)]
pub mod fuzzing;
mod node_claims;
mod plan;
mod publisher;
mod ratelimit;
mod render;
mod retry;
mod unhealthy;

pub use claim::{
    AllocatedClaim, ClaimReader, ConditionStatus, ConfigSource, DeviceCondition, DeviceResult,
    DeviceStatus, DeviceToleration, OpaqueConfig, base_request,
};
pub use classes::{
    ClassFieldDropped, DeviceClassSpec, FIELD_MANAGER, apply_device_classes,
    apply_device_classes_until_done,
};
pub use connect::{ConnectError, check_kubeconfig, connect, connect_context};
pub use convert::{NUMA_NODE_ATTRIBUTE, UnhealthyDevices};
pub use error::Error;
pub use events::{MAX_EVENT_NOTE, NodeEvents};
pub use explain_inputs::read_explain_inputs;
pub use features::{
    ApiCapabilities, ApiFeature, ApiReport, ApiStatus, CounterLayout, Degradation, ServerVersion,
};
pub use publisher::{PublishStats, PublisherTask, SlicePublisher};
pub use render::render_slices;
