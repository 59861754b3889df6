//! Fake host roots laid out like real machines' sysfs and `/dev`, for backend tests and
//! benchmarks.

pub mod mdev;
pub mod pci;
pub mod usb;
