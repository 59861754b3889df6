//! The backend's own errors.

use std::path::PathBuf;

/// Why the NVIDIA backend could not be built or could not act.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NvidiaError {
    /// A configuration field has a value the backend cannot use.
    #[error("nvidia configuration: {0}")]
    Config(#[source] kubedev_core::factory::InvalidValue),
    /// The backend's state directory cannot be used.
    #[error("nvidia: state directory {path}: {error}")]
    StateDir {
        /// The directory or file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// NVML could not be loaded or initialised.
    #[error("NVML unavailable: {0}")]
    Unavailable(String),
    /// An NVML call failed.
    #[error("NVML {call} on {target}: {message}")]
    Nvml {
        /// The NVML function or operation, e.g. `nvmlDeviceGetUUID`.
        call: &'static str,
        /// What it was called on, e.g. `GPU 0`.
        target: String,
        /// NVML's error.
        message: String,
        /// True when NVML said the GPU has fallen off the bus.
        gpu_lost: bool,
    },
}
