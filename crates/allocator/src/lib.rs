//! kubedev allocator (work in progress).
pub mod api;
pub mod cel;
pub mod scenario;
