//! The kubedev daemon and CLI.
fn main() {}
