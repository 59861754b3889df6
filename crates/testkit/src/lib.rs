//! kubedev's test kit: emulators of the kubelet and the API server that behave like the real
//! ones, builders for fake host roots, and a harness that applies CDI specs with a real container
//! runtime (`podman`). Used by tests and `cargo xtask`, never by the daemon.
#![warn(missing_docs)]

pub mod apiserver;
pub mod hostroot;
pub mod kubelet;
pub mod machines;
pub mod podman;
