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
//! The [crate documentation](crate) walks through a whole driver.

pub use async_trait::async_trait;
pub use kubedev_core::factory::{
    BackendFactory, BuildContext, BuildMode, BuiltBackend, Section, SectionError, typed,
};
pub use kubedev_core::*;
