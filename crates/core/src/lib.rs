//! kubedev core: the device model and the traits every backend implements.
//!
//! A backend implements [`DeviceSource`] (what devices exist, and how their health changes) and
//! [`Preparer`] (what a container needs to use them). The runtime owns publishing
//! ([`Publisher`]), checkpoints, CDI files and the kubelet conversations, so a backend stays
//! small. Nothing here knows gRPC, the API server, WebAssembly or a vendor library.
//!
//! ```
//! use kubedev_core::{Device, DeviceName, Inventory, Pool, PoolName, QualifiedName, AttributeValue};
//!
//! let gpu = Device::new(DeviceName::new("gpu-0")?)
//!     .with_attribute(QualifiedName::new("model")?, AttributeValue::String("x1".into()))
//!     .with_numa_node(0);
//! let inventory = Inventory::new(vec![Pool::new(PoolName::new("node-a")?, vec![gpu])]);
//! assert!(inventory.validate().is_ok());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod atomic_file;
mod attribute;
mod blocking;
pub mod dirwatch;
pub mod durable;
pub mod echo;
mod edits;
mod error;
pub mod factory;
pub mod hostfs;
mod model;
mod names;
mod opaque;
mod prepare;
mod publish;
mod quantity;
pub mod ratelimit;
mod rescan;
pub mod safefs;
mod source;
mod stateless;
mod version;

pub use attribute::{AttributeError, AttributeValue};
pub use blocking::{BlockingError, blocking, dedicated};
pub use edits::{ContainerEdits, DeviceNode, DeviceNodeType, Hook, Mount, join_env_value};
pub use error::{ModelError, PrepareError, PublishError, SourceError};
pub use hostfs::{BackendContext, HostFs, HostFsError};
pub use model::{
    AttributeMatch, Capacity, CounterConsumption, CounterSet, Device, DeviceFilter, DeviceRef,
    Health, HealthState, Inventory, Pool, RequestPolicy, RequestRange, Taint, TaintEffect,
};
pub use names::{
    ClaimName, ClaimUid, CounterName, DeviceName, DriverName, ExtendedResourceName,
    MAX_CLAIM_UID_LEN, NameError, Namespace, PoolName, QualifiedName, check_dns_label,
    check_dns_subdomain,
};
pub use opaque::{
    ConfigError, ConfigSource, DeviceConfig, ValidateConfig, config_kind, effective_config,
};
pub use prepare::{
    AllocatedDevice, ClaimRef, Consumer, NetworkData, PreparedDevice, Preparer, base_request,
};
pub use publish::{Publisher, SyncState, WriteCounts};
pub use quantity::{Format, Quantity, QuantityError};
pub use rescan::{watch_by_polling, watch_by_rescan, watch_health};
pub use source::{DeviceSource, EventSender, SourceEvent};
pub use stateless::StatelessPreparer;
pub use version::{Version, VersionError};
