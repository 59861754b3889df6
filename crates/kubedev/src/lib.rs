//! The kubedev daemon: configuration and runtime, shared by the `kubedev` binary and its tests.
#![warn(missing_docs)]

pub mod config;
pub mod runtime;
