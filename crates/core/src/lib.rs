//! kubedev core: the device model and the traits every backend implements.
