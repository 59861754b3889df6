//! The DRA runtime's crash-safe record of prepared claims.
//!
//! Every prepare is two-phase: [`Change::Start`] records the claim and its allocated devices as
//! [`ClaimState::PrepareStarted`] before the backend touches the host, and [`Change::Complete`]
//! records the prepared devices, their container edits and the CDI spec file as
//! [`ClaimState::PrepareCompleted`]; [`CheckpointStore::apply`] persists changes, several in one
//! write. After a crash the runtime rolls back the
//! claims in [`CheckpointStore::started_claims`] and trusts the completed ones.
//!
//! The checkpoint is one JSON file in the plugin's data directory:
//!
//! ```json
//! {
//!   "version": "1.0",
//!   "checksum": "crc32:1c291ca3",
//!   "payload": { "bootId": "…", "claims": { "<claim uid>": { … } } }
//! }
//! ```
//!
//! - `version` is `MAJOR.MINOR`. A file with another major version is not understood and is
//!   treated as corrupt; a newer minor version loads, and fields this version does not know are
//!   ignored.
//! - `checksum` is the CRC-32 (IEEE) of the payload serialized canonically (compact, object keys
//!   sorted), so it does not depend on how the file is formatted.
//! - `payload.bootId` is the node's boot ID when the file was written: a checkpoint from an
//!   earlier boot describes devices and CDI files that no longer exist and is dropped.
//!
//! A file that cannot be read as a checkpoint (not JSON, truncated, checksum mismatch, unknown
//! major version, content of the wrong shape) is renamed to `<name>.corrupt-<n>` and a fresh
//! checkpoint starts; [`LoadOutcome`] says so, with the reason, so the runtime can log it. Nothing
//! in a file's content can make loading panic.
//!
//! Two daemon instances can run side by side during a rolling update. Every read-modify-write
//! of the file happens under [`NodeLock`], and each mutation re-reads the file first, so neither
//! instance overwrites the other's records. Each store also holds an instance lease (a `flock`
//! on `instances/<id>.lock`, released when the process dies) and stamps the prepares it starts
//! with its id, so that recovery rolls back only the unfinished prepares of instances that are
//! gone ([`CheckpointStore::in_progress_elsewhere`]), never one the other instance is still in
//! the middle of.
//!
//! This file holds the records and errors; `store` is [`CheckpointStore`], `lock` the node lock
//! and the instance leases, and `file` the file's format (version, checksum, canonical JSON) and
//! what happens to a corrupt one.

use std::fmt;
use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize};

use kubedev_core::atomic_file;
use kubedev_core::{AllocatedDevice, ClaimRef, ClaimUid, PreparedDevice};

mod file;
mod lock;
mod store;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

pub use lock::{InstanceLease, NodeLock};
pub use store::{CheckpointStore, Claims};

/// A checkpoint file holding `payload` with a valid version and checksum, as a writer would make
/// it: lets kubedev's fuzz targets reach the payload's reader. Not part of the stable API.
#[doc(hidden)]
pub fn seal_for_fuzzing(payload: &serde_json::Value) -> Vec<u8> {
    file::seal(payload).unwrap_or_default()
}

/// The checkpoint's file name inside the plugin data directory.
pub const CHECKPOINT_FILE: &str = "kubedev-checkpoint.json";

/// The node lock's file name inside the plugin data directory.
pub const LOCK_FILE: &str = "kubedev.lock";

/// The directory of instance leases inside the plugin data directory.
pub const INSTANCES_DIR: &str = "instances";

/// Where Linux publishes the current boot's ID.
pub const DEFAULT_BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// One change to the checkpoint, for [`CheckpointStore::apply`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Change {
    /// A claim's prepare started, with the devices allocated to it; a record of the same UID
    /// is replaced.
    Start {
        /// The claim.
        claim: ClaimRef,
        /// Its allocated devices.
        devices: Vec<AllocatedDevice>,
    },
    /// A claim's prepare completed; fails alone ([`CheckpointError::UnknownClaim`]) when the
    /// claim was never started.
    Complete {
        /// The claim's UID.
        uid: ClaimUid,
        /// The prepared devices.
        prepared: Vec<PreparedDevice>,
        /// The CDI spec file name, if one was written.
        cdi_file: Option<String>,
        /// The pod's name for the claim when it was made from a template (where its device
        /// metadata appears in containers).
        pod_claim_name: Option<String>,
    },
    /// A claim is forgotten (after unprepare or a rollback); forgetting an unknown claim
    /// succeeds.
    Remove {
        /// The claim's UID.
        uid: ClaimUid,
    },
}

impl Change {
    /// The UID of the claim the change is about.
    pub fn uid(&self) -> &ClaimUid {
        match self {
            Change::Start { claim, .. } => &claim.uid,
            Change::Complete { uid, .. } | Change::Remove { uid } => uid,
        }
    }
}

/// Where a claim's prepare stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClaimState {
    /// Prepare began; the host may be partly changed. Recovery rolls it back.
    PrepareStarted,
    /// Prepare finished; the prepared devices and the CDI file are recorded.
    PrepareCompleted,
}

/// What the checkpoint knows about one claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ClaimRecord {
    /// The claim (UID, namespace, name).
    pub claim: ClaimRef,
    /// Where its prepare stands.
    #[serde(deserialize_with = "lenient_state")]
    pub state: ClaimState,
    /// The devices allocated to the claim for this driver, as given to prepare.
    #[serde(default)]
    pub devices: Vec<AllocatedDevice>,
    /// The prepared devices with their container edits (empty until completed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prepared: Vec<PreparedDevice>,
    /// The CDI spec file name written for the claim, if any (set when completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdi_file: Option<String>,
    /// The instance (lease id) that started the prepare; absent in files of format 1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The pod's name for the claim when it was made from a template (set when completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
}

/// A state written by a newer version that this one does not know is treated as an unfinished
/// prepare: rolling it back is always safe, trusting it is not.
fn lenient_state<'de, D: Deserializer<'de>>(d: D) -> Result<ClaimState, D::Error> {
    let s = String::deserialize(d)?;
    Ok(match s.as_str() {
        "PrepareCompleted" => ClaimState::PrepareCompleted,
        _ => ClaimState::PrepareStarted,
    })
}

/// How a checkpoint file was found when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadOutcome {
    /// There was no checkpoint file; one was created.
    Created,
    /// The checkpoint was read as it is.
    Loaded {
        /// How many claims it holds.
        claims: usize,
    },
    /// The checkpoint was written during another boot of the node; its claims were dropped.
    BootChanged {
        /// The boot ID recorded in the file.
        previous: String,
        /// This boot's ID.
        current: String,
        /// How many claims the file held.
        dropped: usize,
    },
    /// The file could not be read as a checkpoint; it was moved aside and a fresh one started.
    Corrupt {
        /// Where the corrupt file is now.
        moved_to: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
}

impl fmt::Display for LoadOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadOutcome::Created => f.write_str("no checkpoint found, created a new one"),
            LoadOutcome::Loaded { claims } => write!(f, "loaded checkpoint with {claims} claims"),
            LoadOutcome::BootChanged {
                previous,
                current,
                dropped,
            } => write!(
                f,
                "checkpoint is from boot {previous:?}, this is boot {current:?}: dropped its {dropped} claims"
            ),
            LoadOutcome::Corrupt { moved_to, reason } => write!(
                f,
                "checkpoint is corrupt ({reason}); moved it to {} and started afresh",
                moved_to.display()
            ),
        }
    }
}

/// A checkpoint operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The checkpoint directory could not be created.
    #[error("cannot create checkpoint directory {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The boot ID could not be read.
    #[error("cannot read the node's boot ID from {path}")]
    ReadBootId {
        /// The boot ID file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The boot ID file held something that is not a boot ID.
    #[error("invalid boot ID in {path}: {reason}")]
    InvalidBootId {
        /// The boot ID file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The node lock could not be taken.
    #[error("cannot lock {path}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The checkpoint file exists but could not be read.
    #[error("cannot read checkpoint {path}")]
    Read {
        /// The checkpoint file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A corrupt checkpoint could not be moved aside.
    #[error("cannot move corrupt checkpoint {path} to {to}")]
    MoveAside {
        /// The checkpoint file.
        path: PathBuf,
        /// Where it was to go.
        to: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The checkpoint could not be serialized.
    #[error("cannot serialize checkpoint {path}")]
    Serialize {
        /// The checkpoint file.
        path: PathBuf,
        /// The serializer's error.
        source: serde_json::Error,
    },
    /// Writing the checkpoint failed; the previous content is still in place.
    #[error("cannot write checkpoint: {step} {path}")]
    Write {
        /// What was being done.
        step: &'static str,
        /// The file or directory the step failed on.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Something other than a regular file is where the checkpoint, the boot ID or a lock file
    /// belongs.
    #[error(transparent)]
    NotAFile(kubedev_core::safefs::SafeOpenError),
    /// [`Change::Complete`] of a claim the checkpoint does not hold.
    #[error("claim {uid} has no prepare recorded in checkpoint {path}")]
    UnknownClaim {
        /// The claim UID.
        uid: ClaimUid,
        /// The checkpoint file.
        path: PathBuf,
    },
}

impl From<atomic_file::WriteFailure> for CheckpointError {
    fn from(f: atomic_file::WriteFailure) -> Self {
        CheckpointError::Write {
            step: f.step,
            path: f.path,
            source: f.source,
        }
    }
}
