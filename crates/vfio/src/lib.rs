//! kubedev's VFIO backend: PCI passthrough and mediated devices (mdev / vGPU).
//!
//! # What is offered
//!
//! - **PCI functions** under `/sys/bus/pci/devices` that match a configured `vendor:device`
//!   selector and are bound to `vfio-pci` (with `bindOnPrepare`: bound to anything; they are
//!   bound to `vfio-pci` when prepared), and NVIDIA vGPU virtual functions (driver `nvidia`, not
//!   a physical function, `nvidia/current_vgpu_type` non-zero). All offered functions of one
//!   IOMMU group form **one device**, named after its lowest address (`0000:3b:00.0` →
//!   `pci-0000-3b-00-0`), because VFIO hands out whole groups. A group that also holds a
//!   function bound to a host driver (other than `pcieport` / `pci-stub`, or a bridge) is not
//!   offered. Every function left out is logged at debug level with the reason; [`scan`] lists
//!   all functions before any filtering.
//! - **mdev instances** under `/sys/bus/mdev/devices` whose type matches a configured
//!   selector, named `mdev-<uuid>`.
//!
//! One pool, `<node>-vfio`, holds both.
//!
//! # Attributes
//!
//! | attribute | PCI | mdev |
//! |---|---|---|
//! | `type` | `"pci"` | `"mdev"` |
//! | `pciAddress` | first function, `0000:3b:00.0` | – |
//! | `vendorID`, `deviceID` | `"10de"`, `"2236"` | – |
//! | `class` | `"030200"` | – |
//! | `iommuGroup` | int | int |
//! | `numaNode` | int (absent when the kernel says -1) | parent's |
//! | `driver` | driver at discovery | – |
//! | `resourceName` | from the selector | from the selector |
//! | `sriovRole` | `pf`, `vf`, `none` | – |
//! | `physfn` | PF address of a VF | – |
//! | `functions` | functions in the device | – |
//! | `vgpuType` | vGPU VFs only | – |
//! | `uuid`, `mdevType`, `mdevTypeID`, `parentAddress` | – | instance UUID, type name (spaces → `_`), type directory, parent address |
//! | `resource.kubernetes.io/pciBusID` | first function's address (4-digit domains only, as Kubernetes requires) | – |
//! | `resource.kubernetes.io/pcieRoot` | `pci<domain>:<bus>` | parent's |
//!
//! # Prepare
//!
//! Device nodes `/dev/vfio/vfio` and `/dev/vfio/<group>` with `mrw`, and the variable KubeVirt's
//! launcher reads: `PCI_RESOURCE_<NAME>=<addr>,<addr>` (all functions of the device) or
//! `MDEV_PCI_RESOURCE_<NAME>=<uuid>`. NAME is the resource name upper-cased with `/` and `.`
//! replaced by `_` ([`resource_env_name`]); through the device-plugin API it is the extended
//! resource the kubelet allocated, through DRA the device's configured resource name (its
//! `resourceName` attribute).
//!
//! # Mediated device types
//!
//! [`MdevTypeManager`] (from [`VfioBackend::type_manager`], for the daemon to run on start) keeps
//! `desiredMdevTypes` created: one type per parent GPU, spread round-robin, all available
//! instances; instances of other types on governed parents are removed.
//!
//! # Bind on prepare
//!
//! With `bindOnPrepare`, selected functions on other drivers are offered too and bound to
//! `vfio-pci` when prepared (`driver_override`, unbind, `drivers_probe`); the original driver is
//! recorded in `<state_dir>/bind/<device>.json` before anything changes and restored on
//! unprepare, also by a daemon restarted after a crash. Physical functions with enabled VFs are
//! never rebound. Through the device-plugin API there is no unprepare: functions stay bound.
//!
//! # Health
//!
//! `watch` follows `/dev/vfio` with inotify: a group node removed makes the device Unhealthy,
//! its return Healthy again; a new group node no device knows triggers a rediscovery.
#![warn(missing_docs)]

mod backend;
mod bind;
mod config;
mod error;
pub mod factory;
mod mdev;
mod naming;
mod pci;
mod settle;

pub use naming::BACKEND_NAME;

pub use backend::{Offered, VfioBackend};
pub use bind::{BindRecord, OriginalBinding};
pub use config::{DesiredMdevTypes, MdevSelector, PciSelector, VendorDevice, VfioConfig};
pub use error::VfioError;
pub use mdev::{
    MDEV_BUS, MDEV_DEVICES, MdevInstance, MdevParent, MdevPlan, MdevReport, MdevType,
    MdevTypeManager, MdevUnit, ParentPlan, scan_mdev_parents, scan_mdevs,
};
pub use naming::{
    MDEV_PCI_RESOURCE_PREFIX, PCI_RESOURCE_PREFIX, PciAddress, is_mdev_uuid, mdev_device_name,
    normalize_type_name, resource_env_name,
};
pub use pci::{
    PCI_DEVICES, PciFunction, PciKind, PciUnit, SriovRole, VFIO_CONTAINER, VFIO_PCI, attrs,
    pcie_root_of, read_function, scan,
};
