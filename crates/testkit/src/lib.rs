//! kubedev test kit.
