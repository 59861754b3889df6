//! kubedev's test kit: emulators of the kubelet (and, later, the API server) that behave like the
//! real ones, and builders for fake host roots. Used by tests and `cargo xtask`, never by the
//! daemon.
#![warn(missing_docs)]

pub mod apiserver;
pub mod hostroot;
pub mod kubelet;
pub mod machines;
