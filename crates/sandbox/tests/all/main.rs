//! kubedev-sandbox integration tests: one binary, a module per topic. The example policies
//! come from `cargo xtask build-plugins` (target/plugins/wasm/).
#![allow(clippy::unwrap_used)]

mod check;
mod common;
mod determinism;
mod hostile;
mod plugins;
mod reload;
