//! Everything a backend is written with, under one path: `use kubedev::backend::*;`.
//!
//! - the traits a backend implements: [`DeviceSource`] (what devices exist, how their health
//!   changes) and [`Preparer`], or [`StatelessPreparer`] for a backend whose preparing is a
//!   device's container edits;
//! - how the daemon learns the backend: [`typed`] makes a [`BackendFactory`] from a
//!   configuration [`Section`] and a constructor given a [`BuildContext`], whose
//!   [`pool`](BuildContext::pool) is the pool the backend publishes;
//! - the device model ([`Device`], [`Pool`], [`Health`], the checked names such as
//!   [`DeviceName`]), container edits ([`ContainerEdits`], [`DeviceNode`], [`Mount`]) and the
//!   host's file system as a backend reads it ([`HostFs`]);
//! - the bodies of a `watch`: [`watch_health`] from snapshots of the devices' health,
//!   [`watch_by_polling`] and [`watch_by_rescan`] from the changes a backend finds itself;
//! - [`async_trait`](macro@async_trait), the attribute the two traits' implementations carry.
//!
//! The daemon's own machinery (publishing, checkpoints, rate limits, the kubelet APIs) is not
//! here: a backend never calls it.
//!
//! The [crate documentation](crate) walks through a whole driver.

// The traits a backend implements, and the attribute their implementations carry.
pub use async_trait::async_trait;
pub use kubedev_core::{DeviceSource, Preparer, StatelessPreparer};

// How the daemon learns and builds a backend.
pub use kubedev_core::BackendContext;
pub use kubedev_core::factory::{
    BackendFactory, BuildContext, BuildMode, BuiltBackend, InvalidValue, Section, SectionError,
    typed,
};

// The device model a backend publishes.
pub use kubedev_core::{
    AttributeValue, Capacity, CounterConsumption, CounterName, CounterSet, Device, DeviceName,
    DeviceRef, Health, HealthState, NameError, Pool, PoolName, QualifiedName, Quantity,
    RequestPolicy, RequestRange, Taint, TaintEffect, Version,
};

// How health and device changes reach the daemon.
pub use kubedev_core::{EventSender, SourceEvent, watch_by_polling, watch_by_rescan, watch_health};

// What preparing takes and gives: the claim's devices and their configuration, and what a
// container gets.
pub use kubedev_core::{
    AllocatedDevice, ClaimRef, ClaimUid, ConfigError, ConfigSource, Consumer, ContainerEdits,
    DeviceConfig, DeviceNode, DeviceNodeType, Hook, Mount, NetworkData, PreparedDevice,
    ValidateConfig, base_request, config_kind, effective_config, join_env_value,
};

// The errors a backend returns.
pub use kubedev_core::{BlockingError, HostFsError, PrepareError, SourceError};

// The host as a backend reads it, blocking work off the async threads, watched directories,
// records that survive a crash, and values quoted safely into messages.
pub use kubedev_core::{HostFs, blocking, dedicated, dirwatch, durable, echo, hostfs};
