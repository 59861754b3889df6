//! Container Device Interface (CDI) spec files for prepared DRA claims.
//!
//! Each prepared claim gets one spec file in the CDI directory (default `/var/run/cdi`), which
//! the container runtime reads when the kubelet hands it the claim's CDI device IDs:
//!
//! - kind `k8s.<driver>/claim` (vendor `k8s.<driver>`, class `claim`);
//! - one CDI device per prepared device, named `<claim UID>-<device>`, plus `-<share ID>` when
//!   the device is shared; its qualified ID is `k8s.<driver>/claim=<name>`;
//! - file name `k8s.<driver>-claim_<claim UID>.json` (vendor, class and claim UID);
//! - `cdiVersion` is the lowest version whose features the content uses, so older container
//!   runtimes can read it;
//! - written atomically (temporary file, fsync, rename, directory fsync) with mode 0644.
//!
//! Claim UIDs, device names and share IDs come from outside; they are checked against the CDI
//! name rules before any of them becomes part of a path or a spec.
//!
//! A CDI device must change the container somehow (the CDI libraries reject a device whose
//! `containerEdits` are empty), so a prepared device without environment, device nodes, mounts
//! or hooks gets no CDI device and no CDI ID, and a claim with no such device gets no file.
//!
//! This file holds the constants and errors; `spec` is the spec's content and its lowest
//! version, `validate` checks it as a container runtime's CDI library would, `names` holds the
//! naming rules, and `writer` writes, verifies, repairs and removes the files.

use std::io;
use std::path::PathBuf;

use kubedev_core::atomic_file;

mod names;
mod spec;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
mod validate;
mod writer;

pub use names::validate_device_name;
pub use spec::{CdiContainerEdits, CdiDevice, CdiSpec};
pub use writer::{CdiClaimSpec, CdiWriter, SpecCheck, write_spec_file};

/// The CDI directory container runtimes read by default for dynamic specs.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

/// The CDI class of claim specs.
pub const CLAIM_CLASS: &str = "claim";

pub use kubedev_core::MAX_CLAIM_UID_LEN;

/// Longest share ID accepted.
pub const MAX_SHARE_ID_LEN: usize = 128;

/// A CDI operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CdiError {
    /// A name breaks the CDI naming rules (or is unsafe in a path).
    #[error("invalid CDI {what} {0}: {reason}", kubedev_core::echo::echo(.value))]
    InvalidName {
        /// What kind of name: "vendor", "class", "device name", "claim UID", "share ID", "kind".
        what: &'static str,
        /// The rejected value.
        value: String,
        /// The rule it broke.
        reason: String,
    },
    /// The spec's content would be rejected by a container runtime.
    #[error("invalid CDI spec content in {scope}: {reason}")]
    InvalidContent {
        /// Where: `spec` or `device <name>`.
        scope: String,
        /// What is wrong.
        reason: String,
    },
    /// Two devices of one claim get the same CDI device name.
    #[error("two devices get the CDI device name {0}", kubedev_core::echo::echo(.name))]
    DuplicateDevice {
        /// The name.
        name: String,
    },
    /// A file-system operation failed.
    #[error("CDI: {op} {path} failed")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The spec could not be serialized.
    #[error("cannot serialize CDI spec {path}")]
    Serialize {
        /// The spec file.
        path: PathBuf,
        /// The serializer's error.
        source: serde_json::Error,
    },
}

impl From<atomic_file::WriteFailure> for CdiError {
    fn from(f: atomic_file::WriteFailure) -> Self {
        CdiError::Io {
            op: f.step,
            path: f.path,
            source: f.source,
        }
    }
}
