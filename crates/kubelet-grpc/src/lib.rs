//! kubedev's kubelet gRPC servers.
