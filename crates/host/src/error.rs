//! Errors of the host backend.

use std::path::PathBuf;

use kubedev_core::HostFsError;

/// What can go wrong in the host backend. Every variant names the value or path it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// A configuration value is wrong.
    #[error("host configuration: {0}")]
    Config(#[source] kubedev_core::factory::InvalidValue),
    /// The pool name made from the node name is not a valid pool name.
    #[error("host: pool name {0} made from the node name is invalid: {reason}", kubedev_core::echo::echo(.pool))]
    PoolName {
        /// The rejected pool name.
        pool: String,
        /// Why.
        reason: String,
    },
    /// A line of the cgroup `misc.capacity` file is not `<resource> <count>`.
    #[error("{}: line {line}: {1}: {reason}", path.display(), kubedev_core::echo::echo(.content))]
    MiscCapacity {
        /// The file, as a host path.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// The line (cut to 64 characters).
        content: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading or resolving a host path failed.
    #[error(transparent)]
    HostFs(#[from] HostFsError),
    /// A path that must not be a symbolic link is one; nothing was changed.
    #[error("refusing to follow the symbolic link {}", path.display())]
    Symlink {
        /// The host path.
        path: PathBuf,
    },
    /// A host operation failed.
    #[error("{operation} {}: {error}", path.display())]
    Io {
        /// What was being done, e.g. "changing the owner of".
        operation: &'static str,
        /// The host path.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}
