#![allow(clippy::unwrap_used, clippy::expect_used)]
//! kubedev-allocator integration tests, one binary with a module per topic.

mod conformance;
mod nodes;
mod policy;
mod properties;
mod search_work;
mod shares;
