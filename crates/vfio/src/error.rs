//! The backend's errors.

use std::path::PathBuf;

use kubedev_core::{HostFsError, PrepareError, SourceError};

/// What went wrong in the VFIO backend. Every variant names the value, field or path at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VfioError {
    /// A configuration field holds a bad value.
    #[error("vfio configuration: {0}")]
    Config(#[source] kubedev_core::factory::InvalidValue),
    /// A host path could not be read, resolved or written.
    #[error("vfio: {0}")]
    Host(#[from] HostFsError),
    /// A record in the state directory could not be read or written.
    #[error("vfio: state record {}: {error}", path.display())]
    State {
        /// The record's path.
        path: PathBuf,
        /// What failed.
        error: String,
    },
    /// The kernel did not do what a write asked for within the settle timeout.
    #[error("vfio: {what} did not happen within {timeout_ms} ms")]
    Timeout {
        /// What was waited for, e.g. "0000:3b:00.0 bound to vfio-pci".
        what: String,
        /// The timeout.
        timeout_ms: u64,
    },
    /// The host cannot do what was asked, e.g. `vfio-pci` is not loaded.
    #[error("vfio: {0}")]
    Unsupported(String),
}

impl VfioError {
    pub(crate) fn into_source(self) -> SourceError {
        match self {
            VfioError::Config(_) => SourceError::Config {
                backend: crate::naming::BACKEND_NAME.into(),
                message: self.to_string(),
            },
            other => SourceError::unavailable(crate::naming::BACKEND_NAME, &other),
        }
    }

    pub(crate) fn into_prepare(self, operation: &str, device: &str) -> PrepareError {
        PrepareError::Host {
            operation: operation.to_owned(),
            device: device.to_owned(),
            error: std::io::Error::other(self.to_string()),
        }
    }
}
