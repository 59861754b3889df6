//! kubedev integration tests: one binary, a module per topic, sharing the harness in `common`.
//!
//! A module run on its own: `cargo test -p kubedev --test all <module>::`, e.g. `cli::`. Modules
//! that need a backend are built with its cargo feature only. The daemon's tests run it as a
//! child process or in-process on a runtime of their own; none changes process-wide state (the
//! environment, the current directory, a global tracing subscriber): fail points are armed in a
//! child daemon's environment, never in this process's.
#![allow(clippy::unwrap_used)]

mod common;

#[cfg(feature = "nvidia")]
mod api_versions;
mod apiserver_down;
// Every test of it needs one backend or more; with only some, some of its helpers go unused.
#[cfg(any(
    feature = "nvidia",
    feature = "vfio",
    feature = "usb",
    feature = "host"
))]
#[cfg_attr(
    not(all(
        feature = "nvidia",
        feature = "vfio",
        feature = "usb",
        feature = "host"
    )),
    allow(dead_code, unused_imports)
)]
mod backends;
mod check_config;
mod claim_status;
mod cli;
#[cfg(feature = "host")]
mod consumable_capacity;
mod containers;
mod crash;
mod device_classes;
mod device_metadata;
mod device_plugin;
mod docs_commands;
mod dra;
mod explain;
#[cfg(feature = "nvidia")]
mod gpu_sharing;
mod health_in_cluster;
mod kubectl_plugin;
#[cfg(feature = "nvidia")]
mod nvidia_containers;
mod observability;
mod operator_messages;
mod reload;
mod slice_repair;
mod startup;
