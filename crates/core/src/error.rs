//! Errors of the core model and of the three traits.

/// A problem with the device model itself: something Kubernetes would reject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// Two devices of one pool have the same name.
    #[error("pool {pool}: device name {0} is used twice", crate::echo::echo(.device))]
    DuplicateDevice {
        /// The pool.
        pool: String,
        /// The repeated name.
        device: String,
    },
    /// Two pools have the same name.
    #[error("pool name {0} is used twice", crate::echo::echo(.pool))]
    DuplicatePool {
        /// The repeated name.
        pool: String,
    },
    /// Two counter sets of one pool have the same name.
    #[error("pool {pool}: counter set {0} is defined twice", crate::echo::echo(.set))]
    DuplicateCounterSet {
        /// The pool.
        pool: String,
        /// The repeated name.
        set: String,
    },
    /// A device consumes a counter that its pool does not define.
    #[error(
        "pool {pool}: device {device} consumes counter {counter:?}, which the pool does not define"
    )]
    UnknownCounter {
        /// The pool.
        pool: String,
        /// The device.
        device: String,
        /// The missing counter set or `set/counter`.
        counter: String,
    },
    /// A selector failed on a device.
    #[error("selector failed on device {device}: {message}")]
    Selector {
        /// The device (`pool/device`).
        device: String,
        /// What went wrong.
        message: String,
    },
}

/// A backend could not discover or watch its devices.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The backend's host interface is missing (no driver, no library, no sysfs tree).
    #[error("{backend} unavailable: {reason}")]
    Unavailable {
        /// The backend's name.
        backend: String,
        /// Why.
        reason: String,
    },
    /// Reading a host file failed.
    #[error("{backend}: reading {path}: {error}")]
    Io {
        /// The backend's name.
        backend: String,
        /// The file or directory.
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// A host file held something the backend cannot parse.
    #[error("{backend}: {path}: {message}")]
    Parse {
        /// The backend's name.
        backend: String,
        /// The file.
        path: String,
        /// What was wrong.
        message: String,
    },
    /// The backend's configuration is wrong.
    #[error("{backend}: invalid configuration: {message}")]
    Config {
        /// The backend's name.
        backend: String,
        /// What was wrong.
        message: String,
    },
    /// What the backend found breaks the model's rules.
    #[error("{backend}: {error}")]
    Model {
        /// The backend's name.
        backend: String,
        /// The rule that broke.
        error: ModelError,
    },
}

impl SourceError {
    /// `backend` cannot reach its host interface because of `cause`, given with its causes
    /// ([`chain`](crate::echo::chain)).
    pub fn unavailable(backend: &str, cause: &(dyn std::error::Error + 'static)) -> Self {
        SourceError::Unavailable {
            backend: backend.to_string(),
            reason: crate::echo::chain(cause),
        }
    }
}

/// Preparing or unpreparing devices failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrepareError {
    /// The device is not known to this backend.
    #[error("unknown device {device}")]
    UnknownDevice {
        /// The device (`pool/device` or a device-plugin ID).
        device: String,
    },
    /// The device is known but cannot be used now.
    #[error("device {device} is unhealthy: {reason}")]
    Unhealthy {
        /// The device.
        device: String,
        /// Why.
        reason: String,
    },
    /// The claim's configuration for this driver is invalid.
    #[error("invalid configuration for claim {claim}: {message}")]
    Config {
        /// The claim (`namespace/name` or UID).
        claim: String,
        /// What was wrong.
        message: String,
    },
    /// A host operation failed.
    #[error("{operation} for device {device}: {error}")]
    Host {
        /// What was being done, e.g. "creating mdev".
        operation: String,
        /// The device.
        device: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// Anything else, with a message that says what.
    #[error("{0}")]
    Other(String),
}

impl PrepareError {
    /// A configuration entry of `claim` that was refused.
    pub fn config(claim: impl std::fmt::Display, error: crate::opaque::ConfigError) -> Self {
        PrepareError::Config {
            claim: claim.to_string(),
            message: crate::echo::chain(&error),
        }
    }

    /// Whether preparing again can succeed without anything changing in the claim or the
    /// configuration: a device that is unhealthy or busy, a host operation that failed, or an
    /// unclassified error may pass; an unknown device or an invalid configuration cannot.
    pub fn is_retryable(&self) -> bool {
        match self {
            PrepareError::UnknownDevice { .. } | PrepareError::Config { .. } => false,
            PrepareError::Unhealthy { .. } | PrepareError::Host { .. } | PrepareError::Other(_) => {
                true
            }
        }
    }
}

/// Publishing an inventory failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The inventory cannot be published as it is.
    #[error("cannot publish: {0}")]
    Invalid(String),
    /// The receiving side is gone or failed; publishing again later may work.
    #[error("publishing failed: {0}")]
    Transport(String),
}
