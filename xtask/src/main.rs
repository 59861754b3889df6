//! kubedev's task runner.
fn main() {}
