//! kubedev's NVIDIA backend: GPUs and MIG devices through NVML (nvml-wrapper), with Xid health
//! events and NVLink topology.
//!
//! [`NvidiaBackend`] implements [`DeviceSource`] and [`Preparer`]:
//!
//! - **Discovery** publishes one pool, `<node>-nvidia`. Every GPU is a device `gpu-<index>` with
//!   attributes in the `gpu.nvidia.com` domain (see [`attr`]): `type` (`gpu`), `uuid`, `index`,
//!   `minor`, `productName`, `brand`, `architecture`, `cudaComputeCapability`, `driverVersion`
//!   and `cudaDriverVersion` (versions), `pcieBusID`, `migCapable`, `migEnabled`, and the
//!   topology attributes `nvlinkGroup` (the smallest NVML index of the GPUs joined to it by
//!   NVLink, directly or through an NVSwitch), `nvlinkPeers` and `pcieSwitchGroup`; plus the
//!   standard `resource.kubernetes.io/pciBusID` and, when sysfs shows it,
//!   `resource.kubernetes.io/pcieRoot`; capacity `gpu.nvidia.com/memory`; the NUMA node.
//! - **MIG**, by [`MigStrategy`]: `none` ignores it; `static` publishes the existing compute
//!   instances (`gpu-<index>-mig-<profile>-<start>`, type `mig`, with `profile`, `parentUUID`,
//!   `placementStart`/`placementSize`, the instance ids and the profile's memory and engines as
//!   capacities) instead of their GPU; `partitionable` follows KEP-4815: each GPU with MIG on
//!   gets a counter set `gpu-<index>-counters` (one counter per memory slice, the engines, the
//!   memory), every placement of every profile is a device consuming its slices and its
//!   profile's engines and memory, and the whole GPU is a device consuming all of them. The
//!   scheduler then picks placements; preparing one creates the GPU instance and a compute
//!   instance spanning it, unpreparing destroys both. Instances kubedev did not create stay
//!   static devices and take their slices out of the model.
//! - **Topology** (NVLink peers, PCIe common ancestors) is read once per discovery and cached:
//!   [`NvidiaBackend::topology`].
//! - **Health**: [`DeviceSource::watch`] waits on an NVML event set for Xid critical errors on a
//!   blocking thread (in short waits, so dropping the future stops it). An Xid that is not in
//!   `ignoredXids` makes every device of the GPU unhealthy with `Xid <n>: ...` as the reason
//!   (an Xid NVML scopes to one MIG GPU instance only that instance's MIG devices); a GPU that
//!   NVML reports lost is unhealthy (and stays published under its name); a GPU that answers
//!   again after `healthRecheckSeconds` without a new Xid is healthy again. GPUs are probed
//!   every `healthPollMillis`.
//! - **Prepare** gives `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools` and
//!   `/dev/nvidia-modeset` (when the host has them), `/dev/nvidia<minor>`, for MIG devices the
//!   capability nodes `/dev/nvidia-caps/nvidia-cap<N>` numbered from the host's
//!   `/proc/driver/nvidia-caps/mig-minors` (nodes from `devRoot`), the user-space driver of the
//!   running version found under `driverRoot` ([`driver`]: libraries under their SONAMEs,
//!   tools, firmware, sockets, optionally NVIDIA's CDI hooks), so a container made of only the
//!   CDI spec runs CUDA; and `NVIDIA_VISIBLE_DEVICES=<uuid>` (the MIG UUID for MIG devices) for
//!   nodes that still run NVIDIA's legacy runtime hook. A driver reloaded or upgraded under the
//!   daemon (`/sys/module/nvidia/version` changes) makes the backend load NVML again, find the
//!   new version's files and give prepared devices new edits
//!   ([`Preparer::refreshed_edits`]).
//! - **Time-slicing**: with `replicas: N` every GPU (and static MIG device) is published N
//!   times, `<device>-replica-<r>` with attribute `replica`, all preparing to the same GPU. The
//!   inventory is shared by both kubelet APIs, so in DRA too each replica is a separately
//!   allocatable handle on a shared GPU; no exclusive whole-GPU device is published then.
//!   `replicas > 1` cannot be combined with `partitionable`.
//!
//! ## When NVML is missing
//!
//! [`NvidiaBackend::new`] fails only on bad configuration or an unusable state directory. When
//! the library cannot be loaded or initialised, `new` succeeds and `discover`/`watch` return
//! [`SourceError::Unavailable`], whose message contains `NVML unavailable: <reason>`, so the
//! daemon keeps serving its other backends; every `discover` tries to load NVML again (a driver
//! installed after the daemon started is picked up).
//!
//! ## Crash safety of dynamic MIG
//!
//! Before a GPU instance is created a record is written to the backend's state directory
//! (state `creating`), updated to `created` after both instances exist, set to `destroying`
//! before unprepare destroys them and removed after. When NVML is first loaded the backend
//! reconciles: unfinished creations and destructions are rolled back or finished (the runtime
//! calls `unprepare` or `prepare` again for such claims, which is then a no-op or a fresh
//! create).
//!
//! ```no_run
//! use kubedev_core::{BackendContext, DeviceSource, HostFs};
//! use kubedev_nvidia::{NvidiaBackend, NvidiaConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = BackendContext::new(HostFs::new("/"), "/var/lib/kubedev/nvidia", "node-a");
//! let backend = NvidiaBackend::new(NvidiaConfig::default(), &ctx)?;
//! for pool in backend.discover().await? {
//!     println!("{}: {} devices", pool.name, pool.devices.len());
//! }
//! # Ok(())
//! # }
//! ```

mod backend;
mod config;
mod devices;
pub mod driver;
mod edits;
mod error;
pub mod factory;
#[allow(unsafe_code)]
mod ffi;
mod health;
mod records;
pub mod sharing;
mod snapshot;
mod topology;

pub use backend::NvidiaBackend;
pub use config::{DEFAULT_IGNORED_XIDS, MAX_REPLICAS, MigStrategy, NvidiaConfig};
pub use devices::{
    DOMAIN, STANDARD_PCI_BUS_ID, STANDARD_PCIE_ROOT, TYPE_GPU, TYPE_MIG, attr, counters,
};
pub use driver::{DriverFiles, LibraryLayout};
pub use edits::{MIG_MINORS_FILE, NVIDIA_VISIBLE_DEVICES};
pub use error::NvidiaError;
pub use topology::{PcieLevel, Topology};

#[doc(no_inline)]
pub use kubedev_core::{DeviceSource, Preparer, SourceError};
