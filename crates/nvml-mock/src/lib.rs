//! A stand-in for `libnvidia-ml.so`, driven by a machine description file, so kubedev's NVIDIA
//! backend is tested through the real `nvml-wrapper` without a GPU.
//!
//! The crate builds twice: as a `cdylib` (`target/<profile>/libnvml_mock.so`, the library
//! nvml-wrapper loads) and as an `rlib` whose helpers tests of other crates use:
//! [`library_path`], [`machine_path`], [`isolated_library`], and the [`machine`] types.
//!
#![doc = include_str!("../README.md")]

mod codes;
mod exports;
mod locate;
pub mod machine;
mod state;
pub mod tools;

pub use locate::{LIBRARY_FILE, isolated_library, library_path, machine_path};
