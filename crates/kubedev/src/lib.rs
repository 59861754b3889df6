//! kubedev: write a Kubernetes device driver once, in Rust, and serve it both as a Device
//! Plugin (kubelet API v1beta1) and as a Dynamic Resource Allocation driver.
//!
//! A driver is a *backend* and a `main` that registers it. The backend says what devices the
//! node has and how their health changes ([`DeviceSource`](backend::DeviceSource)), and what a
//! container needs to use one ([`StatelessPreparer`](backend::StatelessPreparer), or
//! [`Preparer`](backend::Preparer) when preparing needs more). The [`Daemon`] does the rest:
//! both kubelet APIs with device ownership, ResourceSlices and DeviceClasses, CDI specs,
//! the checkpoint that survives restarts, live configuration, metrics and probes, and the
//! command line (`run`, `check-config`, `discover`, `cdi generate`, `who-uses`, `simulate`,
//! `policy check`).
//!
//! Everything a backend is written with is in [`backend`]; a driver depends on this crate
//! alone. With `default-features = false` none of kubedev's own backends (NVIDIA, VFIO, USB,
//! host devices) is linked.
//!
//! # A whole driver
//!
//! Raw HID devices `/dev/hidraw*`, configured as `backends.hidraw` and published in the pool
//! `<node>-hidraw`:
//!
//! ```
//! use std::time::Duration;
//!
//! use kubedev::backend::{
//!     BackendFactory, BuildContext, ContainerEdits, Device, DeviceName, DeviceNode, DeviceRef,
//!     DeviceSource, EventSender, HostFs, Pool, PoolName, PrepareError, Section, SectionError,
//!     SourceError, StatelessPreparer, async_trait, typed, watch_health,
//! };
//!
//! /// The section `backends.hidraw`: nothing to configure.
//! #[derive(serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct HidrawConfig {}
//!
//! impl Section for HidrawConfig {}
//!
//! struct Hidraw {
//!     host: HostFs,
//!     pool: PoolName,
//! }
//!
//! impl Hidraw {
//!     fn new(_config: HidrawConfig, ctx: &BuildContext) -> Result<Self, SectionError> {
//!         let host = ctx.backend.host.clone();
//!         Ok(Hidraw { host, pool: ctx.pool()? })
//!     }
//!
//!     /// The devices there are now; all healthy.
//!     fn pool_now(&self) -> Pool {
//!         let names = self.host.list_dir("/dev").unwrap_or_default().into_iter();
//!         let hidraw = names.filter(|n| n.starts_with("hidraw"));
//!         let hidraw = hidraw.filter_map(|n| DeviceName::new(n).ok());
//!         Pool::new(self.pool.clone(), hidraw.map(Device::new).collect())
//!     }
//! }
//!
//! #[async_trait]
//! impl DeviceSource for Hidraw {
//!     async fn discover(&self) -> Result<Vec<Pool>, SourceError> {
//!         Ok(vec![self.pool_now()])
//!     }
//!
//!     /// Looks again every second; a device that comes or goes is noticed.
//!     async fn watch(&self, events: EventSender) -> Result<(), SourceError> {
//!         let now = || self.pool_now().device_health();
//!         watch_health(events, Duration::from_secs(1), now).await
//!     }
//! }
//!
//! impl StatelessPreparer for Hidraw {
//!     fn device_edits(&self, device: &DeviceRef) -> Result<ContainerEdits, PrepareError> {
//!         let node = DeviceNode::new(format!("/dev/{}", device.device), "rw");
//!         Ok(ContainerEdits::new().with_device_node(node))
//!     }
//! }
//!
//! fn factory() -> impl BackendFactory {
//!     typed("hidraw", Hidraw::new)
//! }
//!
//! // The driver's `main` is one statement:
//! fn main() -> std::process::ExitCode {
//! #   if true { return check().map_or(std::process::ExitCode::FAILURE, |()| std::process::ExitCode::SUCCESS) }
//!     kubedev::Daemon::builder()
//!         .program("hidraw-driver", "0.1.0")
//!         .backend(factory())
//!         .main()
//! }
//! # fn check() -> Result<(), Box<dyn std::error::Error>> {
//! #     use kubedev::backend::{BackendContext, BuildMode, Preparer};
//! #     let root = tempfile::tempdir()?;
//! #     std::fs::create_dir(root.path().join("dev"))?;
//! #     for port in ["hidraw0", "hidraw1", "tty0"] {
//! #         std::fs::write(root.path().join("dev").join(port), "")?;
//! #     }
//! #     let host = BackendContext::new(HostFs::new(root.path()), root.path(), "node-a");
//! #     let ctx = BuildContext::new(host, BuildMode::Inspect);
//! #     let built = factory().build(&serde_json::json!({}), &ctx)?;
//! #     assert_eq!(&*built.kind, "hidraw");
//! #     let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! #     let pools = rt.block_on(built.source.discover())?;
//! #     assert_eq!(pools[0].name.as_str(), "node-a-hidraw");
//! #     let names: Vec<_> = pools[0].devices.iter().map(|d| d.name.as_str()).collect();
//! #     assert_eq!(names, ["hidraw0", "hidraw1"]);
//! #     let port = DeviceRef::new(pools[0].name.clone(), pools[0].devices[1].name.clone());
//! #     let edits = rt.block_on(built.preparer.planned_edits(&port))?.unwrap();
//! #     assert_eq!(edits.device_nodes[0].path, "/dev/hidraw1");
//! #     Ok(())
//! # }
//! ```
//!
//! `docs/writing-a-backend.md` in the repository walks through a larger driver (FPGA cards
//! with health, configuration and both kubelet APIs) and its tests, and
//! `examples/vendor-driver` is that driver.
#![warn(missing_docs)]

pub mod backend;
mod backends;
#[doc(hidden)]
pub mod cdi;
#[doc(hidden)]
pub mod cdi_generate;
#[doc(hidden)]
pub mod checkpoint;
#[doc(hidden)]
pub mod cli;
#[doc(hidden)]
pub mod cluster;
#[doc(hidden)]
pub mod config;
mod daemon;
#[doc(hidden)]
pub mod discover;
#[doc(hidden)]
pub mod dra_driver;
#[cfg(test)]
mod error_chains;
#[doc(hidden)]
pub mod failpoint;
mod http;
#[doc(hidden)]
pub mod metadata;
mod metrics;
mod policy;
pub mod registry;
#[doc(hidden)]
pub mod runtime;
mod selector;
pub mod static_backend;
mod table;
#[cfg(test)]
mod test_dir;
mod who_uses;

pub use config::ConfigError as ConfigFileError;
pub use daemon::{Daemon, DaemonError};
pub use tokio_util::sync::CancellationToken;
