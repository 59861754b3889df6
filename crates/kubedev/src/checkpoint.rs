//! The DRA runtime's crash-safe record of prepared claims.
//!
//! Every prepare is two-phase: [`CheckpointStore::start_prepare`] records the claim and its
//! allocated devices as [`ClaimState::PrepareStarted`] before the backend touches the host, and
//! [`CheckpointStore::complete_prepare`] records the prepared devices, their container edits and
//! the CDI spec file as [`ClaimState::PrepareCompleted`]. After a crash the runtime rolls back the
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

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use kubedev_core::{AllocatedDevice, ClaimRef, PreparedDevice};
use kubedev_core::{atomic_file, safefs};

/// The checkpoint's file name inside the plugin data directory.
pub const CHECKPOINT_FILE: &str = "kubedev-checkpoint.json";

/// The node lock's file name inside the plugin data directory.
pub const LOCK_FILE: &str = "kubedev.lock";

/// The directory of instance leases inside the plugin data directory.
pub const INSTANCES_DIR: &str = "instances";

/// Where Linux publishes the current boot's ID.
pub const DEFAULT_BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The major format version this code writes and understands.
const FORMAT_MAJOR: u64 = 1;
/// The minor format version this code writes (1.1: the `owner` of a started prepare).
const FORMAT_MINOR: u64 = 1;

/// Files larger than this are not parsed (and count as corrupt).
const MAX_CHECKPOINT_BYTES: u64 = 64 * 1024 * 1024;

/// Longest boot ID accepted (Linux writes a 36-character UUID).
const MAX_BOOT_ID_LEN: usize = 256;

/// How many `.corrupt-<n>` names are tried before giving up.
const MAX_CORRUPT_COPIES: u32 = 10_000;

/// The checkpoint's mode: it names claims and devices, so only the owner reads it.
const CHECKPOINT_MODE: u32 = 0o600;

/// One change to the checkpoint, for [`CheckpointStore::apply`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Change {
    /// A claim's prepare started (see [`CheckpointStore::start_prepare`]).
    Start {
        /// The claim.
        claim: ClaimRef,
        /// Its allocated devices.
        devices: Vec<AllocatedDevice>,
    },
    /// A claim's prepare completed (see [`CheckpointStore::complete_prepare`]).
    Complete {
        /// The claim's UID.
        uid: String,
        /// The prepared devices.
        prepared: Vec<PreparedDevice>,
        /// The CDI spec file name, if one was written.
        cdi_file: Option<String>,
    },
    /// A claim is forgotten (see [`CheckpointStore::remove`]).
    Remove {
        /// The claim's UID.
        uid: String,
    },
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

/// The part of the file the checksum covers.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Payload {
    #[serde(default)]
    boot_id: String,
    #[serde(default)]
    claims: BTreeMap<String, ClaimRecord>,
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
    /// `complete_prepare` was called for a claim the checkpoint does not hold.
    #[error("claim {uid} has no prepare recorded in checkpoint {path}")]
    UnknownClaim {
        /// The claim UID.
        uid: String,
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

/// An exclusive, node-wide lock on a plugin data directory (`<dir>/kubedev.lock`).
///
/// It serialises the checkpoint's read-modify-write between processes, e.g. the old and the new
/// daemon during a rolling update. The lock is an advisory `flock` held by an open file: it is
/// released when the value is dropped or the process dies. It is not re-entrant: a second
/// `acquire` on the same directory, even from the same process, waits for the first to be
/// dropped — so do not hold it while calling [`CheckpointStore`] methods, which take it
/// themselves. Acquiring blocks the thread; from async code call it in `spawn_blocking`.
#[derive(Debug)]
pub struct NodeLock {
    path: PathBuf,
    // Held for its lock; closing the file releases it.
    _file: File,
}

impl NodeLock {
    /// Takes the lock on `dir`, waiting as long as another holder keeps it.
    pub fn acquire(dir: impl AsRef<Path>) -> Result<NodeLock, CheckpointError> {
        let (path, file) = open_lock_file(dir.as_ref())?;
        file.lock().map_err(|source| CheckpointError::Lock {
            path: path.clone(),
            source,
        })?;
        Ok(NodeLock { path, _file: file })
    }

    /// Takes the lock on `dir` if nobody holds it; `Ok(None)` when somebody does.
    pub fn try_acquire(dir: impl AsRef<Path>) -> Result<Option<NodeLock>, CheckpointError> {
        let (path, file) = open_lock_file(dir.as_ref())?;
        match file.try_lock() {
            Ok(()) => Ok(Some(NodeLock { path, _file: file })),
            Err(fs::TryLockError::WouldBlock) => Ok(None),
            Err(fs::TryLockError::Error(source)) => Err(CheckpointError::Lock { path, source }),
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// One daemon instance's claim on its records: an exclusive `flock` on
/// `<dir>/instances/<id>.lock`, held while the value lives (and so exactly as long as the process
/// does, whatever way it ends). Another instance tells whether the owner of a record is alive
/// with [`InstanceLease::is_held`].
#[derive(Debug)]
pub struct InstanceLease {
    id: String,
    path: PathBuf,
    // Held for its lock; closing the file releases it.
    _file: File,
}

impl InstanceLease {
    /// Takes a fresh lease in `dir`, with an id no other instance has had.
    pub fn acquire(dir: impl AsRef<Path>) -> Result<InstanceLease, CheckpointError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let id = format!(
            "{}-{}-{}",
            std::process::id(),
            now.as_nanos(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let leases = dir.as_ref().join(INSTANCES_DIR);
        safefs::create_private_dir_all(&leases).map_err(|source| CheckpointError::CreateDir {
            path: leases.clone(),
            source,
        })?;
        let path = leases.join(format!("{id}.lock"));
        let file = open_lock_path(&path)?;
        file.try_lock().map_err(|e| CheckpointError::Lock {
            path: path.clone(),
            source: match e {
                fs::TryLockError::Error(e) => e,
                fs::TryLockError::WouldBlock => io::Error::from(io::ErrorKind::WouldBlock),
            },
        })?;
        Ok(InstanceLease {
            id,
            path,
            _file: file,
        })
    }

    /// This lease's id, as recorded in the records it owns.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the instance with lease `id` in `dir` is alive (still holds its lease). A lease
    /// nobody holds any more is removed.
    pub fn is_held(dir: impl AsRef<Path>, id: &str) -> bool {
        if id.is_empty() || id.contains(['/', '\0']) || id.starts_with('.') {
            return false;
        }
        let path = dir.as_ref().join(INSTANCES_DIR).join(format!("{id}.lock"));
        let Ok(Some(file)) = safefs::open_regular(&path, safefs::Access::Read) else {
            return false;
        };
        match file.try_lock() {
            Ok(()) => {
                let _ = fs::remove_file(&path);
                false
            }
            Err(fs::TryLockError::WouldBlock) => true,
            Err(fs::TryLockError::Error(_)) => false,
        }
    }
}

impl Drop for InstanceLease {
    fn drop(&mut self) {
        // Still locked by us: nobody can take it for alive after this.
        let _ = fs::remove_file(&self.path);
    }
}

fn open_lock_file(dir: &Path) -> Result<(PathBuf, File), CheckpointError> {
    let path = dir.join(LOCK_FILE);
    let file = open_lock_path(&path)?;
    Ok((path, file))
}

/// Opens (creating it, private) a file whose `flock` stands for a lock.
fn open_lock_path(path: &Path) -> Result<File, CheckpointError> {
    match safefs::open_regular(path, safefs::Access::ReadWriteCreate { mode: 0o600 }) {
        Ok(Some(file)) => Ok(file),
        Ok(None) => Err(CheckpointError::Lock {
            path: path.to_path_buf(),
            source: io::Error::from(io::ErrorKind::NotFound),
        }),
        Err(e @ safefs::SafeOpenError::NotAFile { .. }) => Err(CheckpointError::NotAFile(e)),
        Err(safefs::SafeOpenError::Io { source, .. }) => Err(CheckpointError::Lock {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The checkpoint of one plugin data directory, loaded in memory and persisted on every change.
///
/// All methods are synchronous and may block on the file system and on [`NodeLock`]; from async
/// code keep the store behind a mutex and call it in `spawn_blocking`.
#[derive(Debug)]
pub struct CheckpointStore {
    dir: PathBuf,
    path: PathBuf,
    boot_id: String,
    claims: BTreeMap<String, ClaimRecord>,
    lease: InstanceLease,
}

impl CheckpointStore {
    /// Opens (or creates) the checkpoint in `dir`, reading this boot's ID from `boot_id_path`
    /// (normally [`DEFAULT_BOOT_ID_PATH`]).
    ///
    /// A checkpoint from another boot is dropped and a corrupt one moved aside; the outcome says
    /// which happened. Temporary files left by an interrupted write are removed.
    pub fn open(
        dir: impl AsRef<Path>,
        boot_id_path: impl AsRef<Path>,
    ) -> Result<(CheckpointStore, LoadOutcome), CheckpointError> {
        let dir = dir.as_ref().to_owned();
        safefs::create_private_dir_all(&dir).map_err(|source| CheckpointError::CreateDir {
            path: dir.clone(),
            source,
        })?;
        let boot_id = read_boot_id(boot_id_path.as_ref())?;
        let lease = InstanceLease::acquire(&dir)?;
        let mut store = CheckpointStore {
            path: dir.join(CHECKPOINT_FILE),
            dir,
            boot_id,
            claims: BTreeMap::new(),
            lease,
        };
        let _lock = NodeLock::acquire(&store.dir)?;
        // Every checkpoint write happens under the lock we hold, so any temporary file is left
        // over from a crash. Failing to remove one only leaves garbage behind.
        let _ = atomic_file::remove_stale_temps(&store.dir, CHECKPOINT_FILE, Duration::ZERO);
        let (outcome, claims, rewrite) = store.read_locked()?;
        if rewrite {
            store.persist(&claims)?;
        }
        store.claims = claims;
        Ok((store, outcome))
    }

    /// Re-reads the file, picking up changes another daemon instance made.
    pub fn reload(&mut self) -> Result<LoadOutcome, CheckpointError> {
        let _lock = NodeLock::acquire(&self.dir)?;
        let (outcome, claims, rewrite) = self.read_locked()?;
        if rewrite {
            self.persist(&claims)?;
        }
        self.claims = claims;
        Ok(outcome)
    }

    /// The checkpoint file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This instance's lease id, recorded as the owner of the prepares it starts.
    pub fn instance(&self) -> &str {
        self.lease.id()
    }

    /// Whether `record` is a prepare another, still running instance has started and not
    /// finished (during a rolling update): recovery must leave it alone. A prepare without an
    /// owner, or whose owner is gone, is not.
    pub fn in_progress_elsewhere(&self, record: &ClaimRecord) -> bool {
        record.state == ClaimState::PrepareStarted
            && record
                .owner
                .as_deref()
                .is_some_and(|o| o != self.lease.id() && InstanceLease::is_held(&self.dir, o))
    }

    /// Whether another daemon instance using this directory is running (holds its lease), as
    /// during a rolling update. Leases of instances that are gone are removed on the way.
    pub fn other_instances_alive(&self) -> bool {
        let Ok(entries) = fs::read_dir(self.dir.join(INSTANCES_DIR)) else {
            return false;
        };
        let mut alive = false;
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".lock")) else {
                continue;
            };
            if id != self.lease.id() && InstanceLease::is_held(&self.dir, id) {
                alive = true;
            }
        }
        alive
    }

    /// Re-reads the file and runs `f` on the claims while still holding the node lock, so no
    /// other instance changes the checkpoint until `f` returns (e.g. while CDI files that no
    /// claim owns are removed). `f` must not call this store.
    pub fn with_fresh_claims<T>(
        &mut self,
        f: impl FnOnce(&BTreeMap<String, ClaimRecord>) -> T,
    ) -> Result<T, CheckpointError> {
        let _lock = NodeLock::acquire(&self.dir)?;
        let (_, claims, rewrite) = self.read_locked()?;
        if rewrite {
            self.persist(&claims)?;
        }
        self.claims = claims;
        Ok(f(&self.claims))
    }

    /// This boot's ID, as recorded in the checkpoint.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// All claims, by UID.
    pub fn claims(&self) -> &BTreeMap<String, ClaimRecord> {
        &self.claims
    }

    /// The claim with this UID, if recorded.
    pub fn get(&self, uid: &str) -> Option<&ClaimRecord> {
        self.claims.get(uid)
    }

    /// Claims whose prepare started but did not complete: what recovery must roll back.
    pub fn started_claims(&self) -> Vec<ClaimRecord> {
        self.claims
            .values()
            .filter(|r| r.state == ClaimState::PrepareStarted)
            .cloned()
            .collect()
    }

    /// Records that `claim`'s prepare started, with the devices allocated to it. Persisted
    /// before it returns. A record for the same UID is replaced.
    pub fn start_prepare(
        &mut self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<(), CheckpointError> {
        self.apply_one(Change::Start {
            claim: claim.clone(),
            devices: devices.to_vec(),
        })
    }

    /// Records that the claim's prepare completed with `prepared` devices and the CDI spec file
    /// `cdi_file` (a file name in the CDI directory; `None` when no file was needed). Persisted
    /// before it returns. Fails if the claim was never started.
    pub fn complete_prepare(
        &mut self,
        uid: &str,
        prepared: &[PreparedDevice],
        cdi_file: Option<&str>,
    ) -> Result<(), CheckpointError> {
        self.apply_one(Change::Complete {
            uid: uid.to_owned(),
            prepared: prepared.to_vec(),
            cdi_file: cdi_file.map(str::to_owned),
        })
    }

    /// Forgets the claim (after unprepare or a rollback). Persisted before it returns. Returns
    /// whether the claim was recorded; removing an unknown claim succeeds.
    pub fn remove(&mut self, uid: &str) -> Result<bool, CheckpointError> {
        let existed = self.claims.contains_key(uid);
        self.apply_one(Change::Remove {
            uid: uid.to_owned(),
        })?;
        Ok(existed)
    }

    fn apply_one(&mut self, change: Change) -> Result<(), CheckpointError> {
        self.apply(vec![change])?.pop().unwrap_or(Ok(()))
    }

    /// Applies several changes with one read-modify-write of the file (one fsync), in order, and
    /// returns one result per change: a change that cannot apply (completing an unknown claim)
    /// fails alone. The outer error means nothing was persisted. This is what lets concurrent
    /// prepares share a write (group commit).
    pub fn apply(
        &mut self,
        changes: Vec<Change>,
    ) -> Result<Vec<Result<(), CheckpointError>>, CheckpointError> {
        let path = self.path.clone();
        let owner = self.lease.id().to_owned();
        let mut results = Vec::with_capacity(changes.len());
        self.mutate(|claims| {
            let mut changed = false;
            for change in changes {
                let r = match change {
                    Change::Start { claim, devices } => {
                        let uid = claim.uid.to_string();
                        claims.insert(
                            uid,
                            ClaimRecord {
                                claim,
                                state: ClaimState::PrepareStarted,
                                devices,
                                prepared: Vec::new(),
                                cdi_file: None,
                                owner: Some(owner.clone()),
                            },
                        );
                        Ok(())
                    }
                    Change::Complete {
                        uid,
                        prepared,
                        cdi_file,
                    } => match claims.get_mut(&uid) {
                        Some(record) => {
                            record.state = ClaimState::PrepareCompleted;
                            record.prepared = prepared;
                            record.cdi_file = cdi_file;
                            Ok(())
                        }
                        None => Err(CheckpointError::UnknownClaim {
                            uid,
                            path: path.clone(),
                        }),
                    },
                    Change::Remove { uid } => {
                        changed |= claims.remove(&uid).is_some();
                        results.push(Ok(()));
                        continue;
                    }
                };
                changed |= r.is_ok();
                results.push(r);
            }
            Ok(changed)
        })?;
        Ok(results)
    }

    /// Read-modify-write under the node lock: re-read the file (another instance may have
    /// changed it), apply `change`, write the result if anything changed.
    fn mutate(
        &mut self,
        change: impl FnOnce(&mut BTreeMap<String, ClaimRecord>) -> Result<bool, CheckpointError>,
    ) -> Result<(), CheckpointError> {
        let _lock = NodeLock::acquire(&self.dir)?;
        let (_, mut claims, rewrite) = self.read_locked()?;
        let changed = change(&mut claims)?;
        if changed || rewrite {
            self.persist(&claims)?;
        }
        self.claims = claims;
        Ok(())
    }

    /// Reads the file; the caller holds the node lock. Returns what was found, the claims to go
    /// on with and whether the file must be rewritten. When the file cannot be used (missing,
    /// corrupt, another boot), the claims this store already holds are kept: they were recorded
    /// during this boot.
    fn read_locked(
        &self,
    ) -> Result<(LoadOutcome, BTreeMap<String, ClaimRecord>, bool), CheckpointError> {
        Ok(match read_checkpoint(&self.path)? {
            FileState::Missing => (LoadOutcome::Created, self.claims.clone(), true),
            FileState::Corrupt(reason) => {
                let moved_to = move_aside(&self.path)?;
                (
                    LoadOutcome::Corrupt { moved_to, reason },
                    self.claims.clone(),
                    true,
                )
            }
            FileState::Valid(payload) if payload.boot_id != self.boot_id => (
                LoadOutcome::BootChanged {
                    previous: payload.boot_id,
                    current: self.boot_id.clone(),
                    dropped: payload.claims.len(),
                },
                self.claims.clone(),
                true,
            ),
            FileState::Valid(payload) => (
                LoadOutcome::Loaded {
                    claims: payload.claims.len(),
                },
                payload.claims,
                false,
            ),
        })
    }

    /// Writes `claims` atomically; the caller holds the node lock.
    fn persist(&self, claims: &BTreeMap<String, ClaimRecord>) -> Result<(), CheckpointError> {
        let bytes = encode(&self.boot_id, claims).map_err(|source| CheckpointError::Serialize {
            path: self.path.clone(),
            source,
        })?;
        atomic_file::replace(&self.path, CHECKPOINT_MODE, |f| f.write_all(&bytes))?;
        Ok(())
    }
}

fn read_boot_id(path: &Path) -> Result<String, CheckpointError> {
    let invalid = |reason: &str| CheckpointError::InvalidBootId {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    let raw = match safefs::read_regular(path, MAX_BOOT_ID_LEN as u64 + 1) {
        Ok(Some(raw)) => raw,
        Ok(None) => {
            return Err(CheckpointError::ReadBootId {
                path: path.to_owned(),
                source: io::Error::from(io::ErrorKind::NotFound),
            });
        }
        Err(e @ safefs::SafeOpenError::NotAFile { .. }) => {
            return Err(CheckpointError::NotAFile(e));
        }
        Err(safefs::SafeOpenError::Io { source, .. }) => {
            return Err(CheckpointError::ReadBootId {
                path: path.to_owned(),
                source,
            });
        }
    };
    let text = String::from_utf8(raw).map_err(|_| invalid("not UTF-8"))?;
    let id = text.trim();
    if id.is_empty() {
        return Err(invalid("empty"));
    }
    if id.len() > MAX_BOOT_ID_LEN {
        return Err(invalid("longer than 256 bytes"));
    }
    if id.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(invalid("contains whitespace or control characters"));
    }
    Ok(id.to_owned())
}

/// What reading the checkpoint file found.
#[derive(Debug)]
enum FileState {
    Missing,
    Corrupt(String),
    Valid(Payload),
}

fn read_checkpoint(path: &Path) -> Result<FileState, CheckpointError> {
    let read_err = |source| CheckpointError::Read {
        path: path.to_owned(),
        source,
    };
    let bytes = match safefs::read_regular(path, MAX_CHECKPOINT_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(FileState::Missing),
        // Never opened (a FIFO would block, a link would be followed): it is moved aside, as
        // the rename does not open it either, and a fresh checkpoint starts.
        Err(safefs::SafeOpenError::NotAFile { found, .. }) => {
            return Ok(FileState::Corrupt(format!("{found}, not a regular file")));
        }
        Err(safefs::SafeOpenError::Io { source, .. }) => return Err(read_err(source)),
    };
    if bytes.len() as u64 > MAX_CHECKPOINT_BYTES {
        return Ok(FileState::Corrupt(format!(
            "larger than {MAX_CHECKPOINT_BYTES} bytes"
        )));
    }
    Ok(match decode(&bytes) {
        Ok(payload) => FileState::Valid(payload),
        Err(reason) => FileState::Corrupt(reason),
    })
}

/// Parses a checkpoint file; the error says what is wrong with it.
fn decode(bytes: &[u8]) -> Result<Payload, String> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(mut doc) = doc else {
        return Err("not a JSON object".into());
    };
    let version = doc
        .get("version")
        .and_then(Value::as_str)
        .ok_or("no \"version\" string")?;
    let major = version
        .split_once('.')
        .and_then(|(major, minor)| {
            minor.parse::<u64>().ok()?;
            major.parse::<u64>().ok()
        })
        .ok_or_else(|| format!("version {version:?} is not MAJOR.MINOR"))?;
    if major != FORMAT_MAJOR {
        return Err(format!(
            "unsupported format version {version:?} (this version reads {FORMAT_MAJOR}.x)"
        ));
    }
    let checksum = doc
        .get("checksum")
        .and_then(Value::as_str)
        .ok_or("no \"checksum\" string")?
        .to_owned();
    let payload = doc.remove("payload").ok_or("no \"payload\"")?;
    let expected = checksum_of(&payload).map_err(|e| format!("payload unreadable: {e}"))?;
    if checksum != expected {
        return Err(format!(
            "checksum mismatch: file says {checksum:?}, payload has {expected:?}"
        ));
    }
    let payload: Payload =
        serde_json::from_value(payload).map_err(|e| format!("payload has the wrong shape: {e}"))?;
    if let Some((key, record)) = payload.claims.iter().find(|(k, r)| **k != r.claim.uid) {
        return Err(format!(
            "claim recorded under UID {key:?} has UID {:?}",
            record.claim.uid
        ));
    }
    Ok(payload)
}

/// Serializes a checkpoint file.
fn encode(
    boot_id: &str,
    claims: &BTreeMap<String, ClaimRecord>,
) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct PayloadRef<'a> {
        boot_id: &'a str,
        claims: &'a BTreeMap<String, ClaimRecord>,
    }
    #[derive(Serialize)]
    struct Envelope<'a> {
        version: String,
        checksum: String,
        payload: &'a Value,
    }
    let payload = serde_json::to_value(PayloadRef { boot_id, claims })?;
    let envelope = Envelope {
        version: format!("{FORMAT_MAJOR}.{FORMAT_MINOR}"),
        checksum: checksum_of(&payload)?,
        payload: &payload,
    };
    let mut bytes = serde_json::to_vec_pretty(&envelope)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The checksum string of a payload: `crc32:` and eight hex digits.
fn checksum_of(payload: &Value) -> Result<String, serde_json::Error> {
    let mut canonical = Vec::new();
    write_canonical(payload, &mut canonical)?;
    Ok(format!("crc32:{:08x}", crc32(&canonical)))
}

/// Writes `value` as compact JSON with object keys sorted, whatever map type serde_json uses.
fn write_canonical(value: &Value, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key)?;
                out.push(b':');
                write_canonical(item, out)?;
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out)?;
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar)?,
    }
    Ok(())
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) lookup table.
const CRC32_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            bit += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = CRC32_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// Renames a corrupt checkpoint to the first free `<name>.corrupt-<n>`.
fn move_aside(path: &Path) -> Result<PathBuf, CheckpointError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| CHECKPOINT_FILE.to_owned());
    let dir = path.parent().unwrap_or(Path::new("."));
    let err = |to: &Path, source| CheckpointError::MoveAside {
        path: path.to_owned(),
        to: to.to_owned(),
        source,
    };
    for n in 1..=MAX_CORRUPT_COPIES {
        let to = dir.join(format!("{name}.corrupt-{n}"));
        match fs::symlink_metadata(&to) {
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(&to, e)),
        }
        fs::rename(path, &to).map_err(|e| err(&to, e))?;
        atomic_file::sync_dir(dir).map_err(|e| err(&to, e))?;
        return Ok(to);
    }
    let to = dir.join(format!("{name}.corrupt-{MAX_CORRUPT_COPIES}"));
    Err(err(
        &to,
        io::Error::other(format!(
            "{MAX_CORRUPT_COPIES} corrupt copies already kept; remove some"
        )),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::test_dir::TestDir;
    use kubedev_core::{ContainerEdits, DeviceName, DeviceNode, DeviceRef, PoolName};

    const BOOT_A: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    const BOOT_B: &str = "11111111-2222-3333-4444-555555555555";

    /// A data directory with a boot ID file outside it.
    struct Fixture {
        dir: TestDir,
        boot_dir: TestDir,
    }

    impl Fixture {
        fn new() -> Self {
            let f = Fixture {
                dir: TestDir::new("ckpt"),
                boot_dir: TestDir::new("boot"),
            };
            f.set_boot(BOOT_A);
            f
        }
        fn set_boot(&self, id: &str) {
            fs::write(self.boot_path(), format!("{id}\n")).unwrap();
        }
        fn boot_path(&self) -> PathBuf {
            self.boot_dir.path().join("boot_id")
        }
        fn open(&self) -> (CheckpointStore, LoadOutcome) {
            CheckpointStore::open(self.dir.path(), self.boot_path()).unwrap()
        }
        fn file(&self) -> PathBuf {
            self.dir.path().join(CHECKPOINT_FILE)
        }
    }

    fn claim(uid: &str) -> ClaimRef {
        ClaimRef::new(uid.parse().unwrap(), "default", format!("claim-{uid}"))
    }

    fn allocated(device: &str) -> AllocatedDevice {
        AllocatedDevice::new(DeviceRef {
            pool: PoolName::new("node-a").unwrap(),
            device: DeviceName::new(device).unwrap(),
        })
        .with_request("gpu")
        .with_config(vec![
            serde_json::json!({"mode": "exclusive", "ratio": 0.25}),
        ])
    }

    fn prepared(device: &str) -> PreparedDevice {
        let mut edits = ContainerEdits::default();
        edits.env.insert("VISIBLE".into(), device.into());
        edits
            .device_nodes
            .push(DeviceNode::new(format!("/dev/{device}"), "rw"));
        PreparedDevice::new(allocated(device), edits)
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn canonical_form_sorts_keys_at_every_level() {
        let v = serde_json::json!({"b": [ {"z": 1, "a": "x"} ], "a": null});
        let mut out = Vec::new();
        write_canonical(&v, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":null,"b":[{"a":"x","z":1}]}"#
        );
    }

    #[test]
    fn a_batch_of_changes_is_one_write_with_per_change_results() {
        let fx = Fixture::new();
        let (mut store, _) = fx.open();
        let results = store
            .apply(vec![
                Change::Start {
                    claim: claim("u1"),
                    devices: vec![allocated("gpu-0")],
                },
                Change::Start {
                    claim: claim("u2"),
                    devices: vec![allocated("gpu-1")],
                },
                Change::Complete {
                    uid: "u1".into(),
                    prepared: vec![prepared("gpu-0")],
                    cdi_file: Some("spec.json".into()),
                },
                Change::Complete {
                    uid: "nope".into(),
                    prepared: vec![],
                    cdi_file: None,
                },
                Change::Remove { uid: "u2".into() },
            ])
            .unwrap();
        assert_eq!(results.len(), 5);
        assert!(results[..3].iter().all(Result::is_ok));
        assert!(matches!(
            results[3],
            Err(CheckpointError::UnknownClaim { .. })
        ));
        assert!(results[4].is_ok());
        let (again, _) = fx.open();
        assert_eq!(again.claims().len(), 1);
        assert_eq!(again.get("u1").unwrap().state, ClaimState::PrepareCompleted);
    }

    #[test]
    fn claims_round_trip_through_the_file() {
        let fx = Fixture::new();
        let (mut store, outcome) = fx.open();
        assert_eq!(outcome, LoadOutcome::Created);
        assert!(fx.file().exists(), "a fresh checkpoint is written at once");
        store
            .start_prepare(&claim("u1"), &[allocated("gpu-0"), allocated("gpu-1")])
            .unwrap();
        store
            .start_prepare(&claim("u2"), &[allocated("gpu-2")])
            .unwrap();
        store
            .complete_prepare(
                "u1",
                &[prepared("gpu-0"), prepared("gpu-1")],
                Some("k8s.gpu.example.com-claim_u1.json"),
            )
            .unwrap();
        let expected = store.claims().clone();
        drop(store);

        let (store, outcome) = fx.open();
        assert_eq!(outcome, LoadOutcome::Loaded { claims: 2 });
        assert_eq!(store.claims(), &expected);
        let u1 = store.get("u1").unwrap();
        assert_eq!(u1.state, ClaimState::PrepareCompleted);
        assert_eq!(u1.claim, claim("u1"));
        assert_eq!(u1.devices, [allocated("gpu-0"), allocated("gpu-1")]);
        assert_eq!(u1.prepared, [prepared("gpu-0"), prepared("gpu-1")]);
        assert_eq!(
            u1.cdi_file.as_deref(),
            Some("k8s.gpu.example.com-claim_u1.json")
        );
        let started = store.started_claims();
        assert_eq!(started.len(), 1);
        assert_eq!(started[0].claim.uid, "u2");
        assert_eq!(started[0].state, ClaimState::PrepareStarted);
        assert!(started[0].prepared.is_empty());
        assert_eq!(store.boot_id(), BOOT_A);
    }

    #[test]
    fn remove_persists_and_unknown_claims_are_fine() {
        let fx = Fixture::new();
        let (mut store, _) = fx.open();
        store
            .start_prepare(&claim("u1"), &[allocated("gpu-0")])
            .unwrap();
        assert!(store.remove("u1").unwrap());
        assert!(!store.remove("u1").unwrap());
        assert!(!store.remove("never-seen").unwrap());
        let (store, outcome) = fx.open();
        assert_eq!(outcome, LoadOutcome::Loaded { claims: 0 });
        assert!(store.claims().is_empty());
    }

    #[test]
    fn completing_an_unknown_claim_is_an_error_naming_it() {
        let fx = Fixture::new();
        let (mut store, _) = fx.open();
        let err = store
            .complete_prepare("ghost", &[prepared("gpu-0")], None)
            .unwrap_err();
        assert!(matches!(err, CheckpointError::UnknownClaim { ref uid, .. } if uid == "ghost"));
        assert!(err.to_string().contains("ghost"), "{err}");
        assert!(store.claims().is_empty());
    }

    #[test]
    fn restarting_a_prepare_replaces_the_record() {
        let fx = Fixture::new();
        let (mut store, _) = fx.open();
        store
            .start_prepare(&claim("u1"), &[allocated("gpu-0")])
            .unwrap();
        store
            .complete_prepare("u1", &[prepared("gpu-0")], Some("f.json"))
            .unwrap();
        store
            .start_prepare(&claim("u1"), &[allocated("gpu-1")])
            .unwrap();
        let r = store.get("u1").unwrap();
        assert_eq!(r.state, ClaimState::PrepareStarted);
        assert_eq!(r.devices, [allocated("gpu-1")]);
        assert!(r.prepared.is_empty());
        assert_eq!(r.cdi_file, None);
    }

    #[test]
    fn no_temporary_file_remains_and_stale_ones_are_removed() {
        let fx = Fixture::new();
        let (mut store, _) = fx.open();
        for i in 0..5 {
            store
                .start_prepare(&claim(&format!("u{i}")), &[allocated("gpu-0")])
                .unwrap();
        }
        assert_eq!(fx.dir.names(), [INSTANCES_DIR, CHECKPOINT_FILE, LOCK_FILE]);
        drop(store);
        let stale = format!(".{CHECKPOINT_FILE}.tmp-99-0-0");
        fs::write(fx.dir.path().join(&stale), b"{\"half").unwrap();
        let (_store, outcome) = fx.open();
        assert_eq!(outcome, LoadOutcome::Loaded { claims: 5 });
        assert_eq!(fx.dir.names(), [INSTANCES_DIR, CHECKPOINT_FILE, LOCK_FILE]);
    }

    /// Re-encodes a file's payload after `edit`, with a valid checksum, as another writer would.
    fn rewrite_payload(path: &Path, version: &str, edit: impl FnOnce(&mut Value)) {
        let mut doc: Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
        edit(&mut doc["payload"]);
        doc["checksum"] = Value::String(checksum_of(&doc["payload"]).unwrap());
        doc["version"] = Value::String(version.into());
        fs::write(path, serde_json::to_vec(&doc).unwrap()).unwrap();
    }

    #[test]
    fn unknown_fields_of_a_newer_minor_version_are_tolerated() {
        let fx = Fixture::new();
        let (mut store, _) = fx.open();
        store
            .start_prepare(&claim("u1"), &[allocated("gpu-0")])
            .unwrap();
        store
            .complete_prepare("u1", &[prepared("gpu-0")], Some("f.json"))
            .unwrap();
        store
            .start_prepare(&claim("u2"), &[allocated("gpu-1")])
            .unwrap();
        let expected = store.claims().clone();
        drop(store);
        rewrite_payload(&fx.file(), "1.9", |p| {
            p["futureTopLevel"] = serde_json::json!({"x": [1, 2]});
            p["claims"]["u1"]["futureField"] = serde_json::json!("hello");
            p["claims"]["u1"]["claim"]["futureRef"] = serde_json::json!(true);
            p["claims"]["u1"]["prepared"][0]["edits"]["futureEdit"] = serde_json::json!(1);
            // A state this version does not know counts as unfinished.
            p["claims"]["u2"]["state"] = serde_json::json!("PrepareVerified");
        });
        let mut doc: Value = serde_json::from_slice(&fs::read(fx.file()).unwrap()).unwrap();
        doc["writtenBy"] = serde_json::json!("kubedev 9.9");
        fs::write(fx.file(), serde_json::to_vec(&doc).unwrap()).unwrap();

        let (store, outcome) = fx.open();
        assert_eq!(outcome, LoadOutcome::Loaded { claims: 2 });
        assert_eq!(store.claims(), &expected);
        assert_eq!(store.get("u2").unwrap().state, ClaimState::PrepareStarted);
        assert_eq!(fx.dir.names(), [INSTANCES_DIR, CHECKPOINT_FILE, LOCK_FILE]);
    }

    fn assert_moved_aside(fx: &Fixture, content: &[u8], reason_part: &str, n: u32) {
        fs::write(fx.file(), content).unwrap();
        let (store, outcome) = fx.open();
        let LoadOutcome::Corrupt { moved_to, reason } = &outcome else {
            panic!("expected corrupt outcome, got {outcome:?}");
        };
        assert!(
            reason.contains(reason_part),
            "reason {reason:?} should mention {reason_part:?}"
        );
        assert_eq!(
            moved_to,
            &fx.dir.path().join(format!("{CHECKPOINT_FILE}.corrupt-{n}"))
        );
        assert_eq!(
            fs::read(moved_to).unwrap(),
            content,
            "corrupt file kept as is"
        );
        assert!(store.claims().is_empty());
        assert!(outcome.to_string().contains("corrupt"), "{outcome}");
        // A fresh, valid checkpoint replaced it: the next open loads cleanly.
        drop(store);
        let (_, again) = fx.open();
        assert_eq!(again, LoadOutcome::Loaded { claims: 0 });
    }

    #[test]
    fn corrupt_files_are_moved_aside_and_a_fresh_checkpoint_starts() {
        let fx = Fixture::new();
        let (mut store, _) = fx.open();
        store
            .start_prepare(&claim("u1"), &[allocated("gpu-0")])
            .unwrap();
        drop(store);
        let good = fs::read(fx.file()).unwrap();

        assert_moved_aside(&fx, b"\x00\xffgarbage", "not valid JSON", 1);
        assert_moved_aside(&fx, &good[..good.len() / 2], "not valid JSON", 2);
        assert_moved_aside(&fx, b"", "not valid JSON", 3);
        assert_moved_aside(&fx, b"[1, 2]", "not a JSON object", 4);

        let tampered = String::from_utf8(good.clone())
            .unwrap()
            .replace("gpu-0", "gpu-9");
        assert_ne!(tampered.as_bytes(), &good[..]);
        assert_moved_aside(&fx, tampered.as_bytes(), "checksum mismatch", 5);

        let future = String::from_utf8(good.clone())
            .unwrap()
            .replace("\"version\": \"1.1\"", "\"version\": \"2.0\"");
        assert!(future.contains("\"2.0\""), "test edits the version");
        assert_moved_aside(&fx, future.as_bytes(), "unsupported format version", 6);

        let no_version = String::from_utf8(good.clone())
            .unwrap()
            .replace("\"version\": \"1.1\"", "\"version\": 1");
        assert_moved_aside(&fx, no_version.as_bytes(), "version", 7);

        // Valid checksum, but the content breaks the model's rules (invalid device name).
        fs::write(fx.file(), &good).unwrap();
        rewrite_payload(&fx.file(), "1.0", |p| {
            p["claims"]["u1"]["devices"][0]["device"]["device"] = serde_json::json!("../GPU");
        });
        let bad_shape = fs::read(fx.file()).unwrap();
        assert_moved_aside(&fx, &bad_shape, "wrong shape", 8);

        // A record filed under another claim's UID.
        fs::write(fx.file(), &good).unwrap();
        rewrite_payload(&fx.file(), "1.0", |p| {
            p["claims"]["u1"]["claim"]["uid"] = serde_json::json!("u2");
        });
        let mismatched = fs::read(fx.file()).unwrap();
        assert_moved_aside(&fx, &mismatched, "UID", 9);
    }

    #[test]
    fn a_checkpoint_from_another_boot_is_dropped() {
        let fx = Fixture::new();
        let (mut store, _) = fx.open();
        store
            .start_prepare(&claim("u1"), &[allocated("gpu-0")])
            .unwrap();
        store
            .start_prepare(&claim("u2"), &[allocated("gpu-1")])
            .unwrap();
        drop(store);
        fx.set_boot(BOOT_B);
        let (store, outcome) = fx.open();
        assert_eq!(
            outcome,
            LoadOutcome::BootChanged {
                previous: BOOT_A.into(),
                current: BOOT_B.into(),
                dropped: 2
            }
        );
        assert!(outcome.to_string().contains(BOOT_A));
        assert!(store.claims().is_empty());
        assert_eq!(store.boot_id(), BOOT_B);
        drop(store);
        let (_, again) = fx.open();
        assert_eq!(again, LoadOutcome::Loaded { claims: 0 });
    }

    #[test]
    fn bad_boot_id_files_are_errors_naming_the_path() {
        let fx = Fixture::new();
        fs::write(fx.boot_path(), "  \n").unwrap();
        let err = CheckpointStore::open(fx.dir.path(), fx.boot_path()).unwrap_err();
        assert!(
            matches!(err, CheckpointError::InvalidBootId { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("boot_id"), "{err}");
        let missing = fx.boot_dir.path().join("missing");
        let err = CheckpointStore::open(fx.dir.path(), &missing).unwrap_err();
        assert!(matches!(err, CheckpointError::ReadBootId { ref path, .. } if *path == missing));
        fs::write(fx.boot_path(), "x".repeat(1000)).unwrap();
        let err = CheckpointStore::open(fx.dir.path(), fx.boot_path()).unwrap_err();
        assert!(err.to_string().contains("256"), "{err}");
    }

    #[test]
    fn this_machines_boot_id_is_readable() {
        // Linux only; the project targets Linux nodes.
        if Path::new(DEFAULT_BOOT_ID_PATH).exists() {
            let id = read_boot_id(Path::new(DEFAULT_BOOT_ID_PATH)).unwrap();
            assert_eq!(id.len(), 36, "{id}");
        }
    }

    #[test]
    fn two_instances_do_not_lose_each_others_records() {
        let fx = Fixture::new();
        let (mut old, _) = fx.open();
        let (mut new, _) = fx.open();
        old.start_prepare(&claim("u1"), &[allocated("gpu-0")])
            .unwrap();
        new.start_prepare(&claim("u2"), &[allocated("gpu-1")])
            .unwrap();
        old.complete_prepare("u1", &[prepared("gpu-0")], None)
            .unwrap();
        // `new` can complete a claim `old` started: it re-reads the file first.
        new.complete_prepare("u1", &[prepared("gpu-0")], Some("f.json"))
            .unwrap();
        assert_eq!(new.claims().len(), 2);
        assert_eq!(old.claims().len(), 2, "old saw u2 when it re-read the file");
        assert_eq!(
            old.get("u1").unwrap().cdi_file,
            None,
            "old has not re-read yet"
        );
        assert_eq!(old.reload().unwrap(), LoadOutcome::Loaded { claims: 2 });
        assert_eq!(old.get("u1").unwrap().cdi_file.as_deref(), Some("f.json"));
        let (fresh, _) = fx.open();
        assert_eq!(fresh.claims(), new.claims());
    }

    #[test]
    fn node_lock_excludes_a_second_holder() {
        let dir = TestDir::new("lock");
        let first = NodeLock::try_acquire(dir.path())
            .unwrap()
            .expect("free lock");
        assert_eq!(first.path(), dir.path().join(LOCK_FILE));
        assert!(NodeLock::try_acquire(dir.path()).unwrap().is_none());

        // A blocking acquirer in another thread gets the lock only after `first` is dropped.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_owned();
        let waiter = std::thread::spawn(move || {
            let lock = NodeLock::acquire(&path).unwrap();
            tx.send(()).unwrap();
            drop(lock);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            rx.try_recv().is_err(),
            "acquire must wait while the lock is held"
        );
        drop(first);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("waiter gets the lock after drop");
        waiter.join().unwrap();

        let again = NodeLock::try_acquire(dir.path()).unwrap();
        assert!(again.is_some(), "free again after all holders dropped");
    }

    #[test]
    fn a_prepare_is_in_progress_elsewhere_only_while_its_instance_lives() {
        let fx = Fixture::new();
        // Two instances side by side, as during a rolling update.
        let (mut old, _) = fx.open();
        let (mut new, _) = fx.open();
        assert_ne!(old.instance(), new.instance());
        old.start_prepare(&claim("u1"), &[allocated("gpu-0")])
            .unwrap();
        new.reload().unwrap();
        let record = new.get("u1").unwrap().clone();
        assert_eq!(record.owner.as_deref(), Some(old.instance()));
        assert!(new.in_progress_elsewhere(&record));
        // Its own prepares and completed ones are not.
        assert!(!old.in_progress_elsewhere(&record));
        old.complete_prepare("u1", &[], None).unwrap();
        new.reload().unwrap();
        assert!(!new.in_progress_elsewhere(new.get("u1").unwrap()));

        // The old instance goes away (its process dies: the lease is released).
        old.start_prepare(&claim("u2"), &[allocated("gpu-1")])
            .unwrap();
        let lease = fx
            .dir
            .path()
            .join(INSTANCES_DIR)
            .join(format!("{}.lock", old.instance()));
        assert!(lease.exists());
        drop(old);
        new.reload().unwrap();
        assert!(!new.in_progress_elsewhere(new.get("u2").unwrap()));
        assert!(!lease.exists());
        // A record without an owner (format 1.0) or with a made-up one is never in progress.
        let mut r = new.get("u2").unwrap().clone();
        r.owner = None;
        assert!(!new.in_progress_elsewhere(&r));
        r.owner = Some("../kubedev".into());
        assert!(!new.in_progress_elsewhere(&r));
    }

    #[test]
    fn a_dead_instances_lease_file_is_not_alive() {
        let fx = Fixture::new();
        let (store, _) = fx.open();
        // A lease file left by a process that died (nobody holds its lock).
        let dir = fx.dir.path().join(INSTANCES_DIR);
        fs::write(dir.join("4242-1-0.lock"), b"").unwrap();
        assert!(!InstanceLease::is_held(fx.dir.path(), "4242-1-0"));
        assert!(
            !dir.join("4242-1-0.lock").exists(),
            "the dead lease is cleaned up"
        );
        assert!(InstanceLease::is_held(fx.dir.path(), store.instance()));
        assert!(!store.other_instances_alive());
        let (other, _) = fx.open();
        assert!(store.other_instances_alive());
        drop(other);
        assert!(!store.other_instances_alive());
    }

    #[test]
    fn lock_errors_name_the_path() {
        let dir = TestDir::new("lock");
        let missing = dir.path().join("no-such-dir");
        let err = NodeLock::acquire(&missing).unwrap_err();
        assert!(err.to_string().contains("no-such-dir"), "{err}");
    }

    #[test]
    fn open_creates_the_directory_and_file_mode_is_private() {
        let fx = Fixture::new();
        let nested = fx.dir.path().join("plugins").join("gpu.example.com");
        let (store, outcome) = CheckpointStore::open(&nested, fx.boot_path()).unwrap();
        assert_eq!(outcome, LoadOutcome::Created);
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(store.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        for dir in [nested.clone(), nested.join(INSTANCES_DIR)] {
            let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", dir.display());
        }
    }

    /// Special files where the checkpoint, the lock or the boot ID belong are refused at once
    /// (a FIFO used to block `open` forever while the node lock was held).
    #[test]
    fn special_files_in_place_of_our_files_are_refused_without_blocking() {
        let mkfifo = |p: &Path| {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                p,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o600),
                0,
            )
            .unwrap()
        };
        for target in [LOCK_FILE, "boot"] {
            let fx = Fixture::new();
            let path = if target == "boot" {
                fs::remove_file(fx.boot_path()).unwrap();
                fx.boot_path()
            } else {
                fx.dir.path().join(target)
            };
            mkfifo(&path);
            let started = std::time::Instant::now();
            let err = CheckpointStore::open(fx.dir.path(), fx.boot_path()).unwrap_err();
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{target}: blocked"
            );
            let text = err.to_string();
            assert!(
                text.contains(&path.display().to_string()) && text.contains("FIFO"),
                "{target}: {text}"
            );
        }
        // At the checkpoint's own path a FIFO, a link or a directory is never opened: it is
        // moved aside like a corrupt file (a link is not followed, and what it points at is left
        // alone), and a fresh checkpoint starts.
        let fx = Fixture::new();
        let elsewhere = fx.boot_dir.path().join("elsewhere.json");
        fs::write(&elsewhere, "not ours").unwrap();
        type Plant<'a> = Box<dyn Fn(&Path) + 'a>;
        let plants: Vec<(&str, Plant)> = vec![
            ("FIFO", Box::new(mkfifo)),
            (
                "symbolic link",
                Box::new(|p: &Path| std::os::unix::fs::symlink(&elsewhere, p).unwrap()),
            ),
            ("directory", Box::new(|p: &Path| fs::create_dir(p).unwrap())),
        ];
        for (n, (what, plant)) in plants.into_iter().enumerate() {
            plant(&fx.file());
            let started = std::time::Instant::now();
            let (store, outcome) = CheckpointStore::open(fx.dir.path(), fx.boot_path()).unwrap();
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{what}: blocked"
            );
            match outcome {
                LoadOutcome::Corrupt { moved_to, reason } => {
                    assert!(reason.contains(what), "{what}: {reason}");
                    let aside = format!(".corrupt-{}", n + 1);
                    assert!(moved_to.to_string_lossy().ends_with(&aside), "{moved_to:?}");
                }
                other => panic!("{what}: {other:?}"),
            }
            drop(store);
            assert!(fs::symlink_metadata(fx.file()).unwrap().is_file(), "{what}");
            fs::remove_file(fx.file()).unwrap();
        }
        assert_eq!(fs::read_to_string(&elsewhere).unwrap(), "not ours");
    }

    #[test]
    fn the_file_says_its_version_and_checksum() {
        let fx = Fixture::new();
        let (mut store, _) = fx.open();
        store
            .start_prepare(&claim("u1"), &[allocated("gpu-0")])
            .unwrap();
        let doc: Value = serde_json::from_slice(&fs::read(fx.file()).unwrap()).unwrap();
        assert_eq!(doc["version"], "1.1");
        assert_eq!(doc["payload"]["bootId"], BOOT_A);
        assert_eq!(doc["payload"]["claims"]["u1"]["state"], "PrepareStarted");
        assert_eq!(
            doc["payload"]["claims"]["u1"]["claim"]["namespace"],
            "default"
        );
        let checksum = doc["checksum"].as_str().unwrap();
        assert!(
            checksum.starts_with("crc32:") && checksum.len() == 14,
            "{checksum}"
        );
        let mut map = BTreeMap::new();
        map.insert("u1".to_string(), store.get("u1").unwrap().clone());
        assert_eq!(fs::read(fx.file()).unwrap(), encode(BOOT_A, &map).unwrap());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_file_content_loads_without_panicking(content in proptest::collection::vec(any::<u8>(), 0..512)) {
            let fx = Fixture::new();
            fs::write(fx.file(), &content).unwrap();
            let (store, outcome) = fx.open();
            prop_assert!(matches!(outcome, LoadOutcome::Corrupt { .. }), "{:?}", outcome);
            prop_assert!(store.claims().is_empty());
        }

        #[test]
        fn mangled_json_never_panics(cut in 0usize..2000, flip in 0usize..2000) {
            let fx = Fixture::new();
            let (mut store, _) = fx.open();
            store.start_prepare(&claim("u1"), &[allocated("gpu-0")]).unwrap();
            store.complete_prepare("u1", &[prepared("gpu-0")], Some("f.json")).unwrap();
            drop(store);
            let mut good = fs::read(fx.file()).unwrap();
            let len = good.len();
            if flip < len {
                good[flip] ^= 0x20;
            }
            good.truncate(cut.min(len));
            fs::write(fx.file(), &good).unwrap();
            // Either it still loads (the change hit only formatting) or it is moved aside.
            let (store, outcome) = fx.open();
            match outcome {
                LoadOutcome::Loaded { claims } => prop_assert_eq!(claims, store.claims().len()),
                LoadOutcome::Corrupt { .. } => prop_assert!(store.claims().is_empty()),
                other => prop_assert!(false, "unexpected outcome {:?}", other),
            }
        }
    }
}
