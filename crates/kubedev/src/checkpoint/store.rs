//! `CheckpointStore`: the checkpoint of one plugin data directory held in memory, every change a
//! read-modify-write of the file under the node lock, and this boot's ID read to tell a stale
//! checkpoint.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use kubedev_core::ClaimUid;
use kubedev_core::{atomic_file, safefs};

use super::file::{FileState, canonical_record, move_aside, read_checkpoint, write_records};
use super::{
    CHECKPOINT_FILE, Change, CheckpointError, ClaimRecord, ClaimState, INSTANCES_DIR,
    InstanceLease, LoadOutcome, NodeLock,
};

/// Longest boot ID accepted (Linux writes a 36-character UUID).
const MAX_BOOT_ID_LEN: usize = 256;

/// The checkpoint's mode: it names claims and devices, so only the owner reads it.
const CHECKPOINT_MODE: u32 = 0o600;

/// The checkpoint of one plugin data directory, loaded in memory and persisted on every change.
///
/// All methods are synchronous and may block on the file system and on [`NodeLock`]; from async
/// code keep the store behind a mutex and call it in `spawn_blocking`.
#[derive(Debug)]
pub struct CheckpointStore {
    dir: PathBuf,
    path: PathBuf,
    boot_id: String,
    claims: Claims,
    lease: InstanceLease,
    /// Each record of `claims` as last written (canonical JSON), so a write encodes only the
    /// records that changed.
    encoded: BTreeMap<ClaimUid, Vec<u8>>,
    /// The file as this store last wrote or read it; while the file still matches, it holds
    /// `claims` and is not read again.
    known_file: Option<FileIdentity>,
    /// How many times the file was read (and its records taken as they were found).
    file_reads: u64,
}

/// What tells one version of the checkpoint file from another: a write replaces the file (a
/// new inode) and changes its times; an edit in place changes its size or times.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileIdentity {
    /// The identity of the file at `path` now; `None` when it cannot be read.
    fn of(path: &Path) -> Option<FileIdentity> {
        use std::os::unix::fs::MetadataExt as _;
        let m = fs::symlink_metadata(path).ok()?;
        Some(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

impl CheckpointStore {
    /// Opens (or creates) the checkpoint in `dir`, reading this boot's ID from `boot_id_path`
    /// (normally [`DEFAULT_BOOT_ID_PATH`](super::DEFAULT_BOOT_ID_PATH)).
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
            encoded: BTreeMap::new(),
            known_file: None,
            file_reads: 0,
        };
        let _lock = NodeLock::acquire(&store.dir)?;
        // Every checkpoint write happens under the lock we hold, so any temporary file is left
        // over from a crash. Failing to remove one only leaves garbage behind.
        let _ = atomic_file::remove_stale_temps(&store.dir, CHECKPOINT_FILE, Duration::ZERO);
        let outcome = store.refresh_locked()?;
        Ok((store, outcome))
    }

    /// Re-reads the file, picking up changes another daemon instance made.
    pub fn reload(&mut self) -> Result<LoadOutcome, CheckpointError> {
        let _lock = NodeLock::acquire(&self.dir)?;
        self.refresh_locked()
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
        f: impl FnOnce(&Claims) -> T,
    ) -> Result<T, CheckpointError> {
        let _lock = NodeLock::acquire(&self.dir)?;
        self.refresh_locked()?;
        Ok(f(&self.claims))
    }

    /// This boot's ID, as recorded in the checkpoint.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// All claims, by UID.
    pub fn claims(&self) -> &Claims {
        &self.claims
    }

    /// How many times the file has been read, rather than known to hold what this store last
    /// wrote: when it changes, records other than those a change named may have changed too.
    pub fn file_reads(&self) -> u64 {
        self.file_reads
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

    /// Forgets the claim (after unprepare or a rollback). Persisted before it returns. Returns
    /// whether the claim was recorded; removing an unknown claim succeeds.
    pub fn remove(&mut self, uid: &ClaimUid) -> Result<bool, CheckpointError> {
        let existed = self.claims.contains_key(uid);
        let change = Change::Remove { uid: uid.clone() };
        self.apply(vec![change])?.pop().unwrap_or(Ok(()))?;
        Ok(existed)
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
        // Read-modify-write under the node lock: another instance may have changed the file.
        let _lock = NodeLock::acquire(&self.dir)?;
        let (_, fresh, rewrite) = self.read_locked()?;
        if let Some(fresh) = fresh {
            self.claims = fresh;
        }
        // The records as they were before each change, newest last: what a failed write puts
        // back, so only the records changed are copied, not the whole checkpoint.
        let mut undo: Vec<(ClaimUid, Option<ClaimRecord>)> = Vec::with_capacity(changes.len());
        let claims = &mut self.claims;
        let mut touched = Vec::with_capacity(changes.len());
        let mut changed = false;
        for change in changes {
            let r = match change {
                Change::Start { claim, devices } => {
                    let uid = claim.uid.clone();
                    touched.push(uid.clone());
                    let before = claims.insert(
                        uid.clone(),
                        ClaimRecord {
                            claim,
                            state: ClaimState::PrepareStarted,
                            devices,
                            prepared: Vec::new(),
                            cdi_file: None,
                            owner: Some(owner.clone()),
                            pod_claim_name: None,
                        },
                    );
                    undo.push((uid, before));
                    Ok(())
                }
                Change::Complete {
                    uid,
                    prepared,
                    cdi_file,
                    pod_claim_name,
                } => match claims.get_mut(uid.as_str()) {
                    Some(record) => {
                        undo.push((uid.clone(), Some(record.clone())));
                        record.state = ClaimState::PrepareCompleted;
                        record.prepared = prepared;
                        record.cdi_file = cdi_file;
                        record.pod_claim_name = pod_claim_name;
                        touched.push(uid);
                        Ok(())
                    }
                    None => Err(CheckpointError::UnknownClaim {
                        uid,
                        path: path.clone(),
                    }),
                },
                Change::Remove { uid } => {
                    if let Some(before) = claims.remove(uid.as_str()) {
                        changed = true;
                        undo.push((uid, Some(before)));
                    }
                    results.push(Ok(()));
                    continue;
                }
            };
            changed |= r.is_ok();
            results.push(r);
        }
        if changed || rewrite {
            let touched = if rewrite { None } else { Some(&touched[..]) };
            if let Err(e) = self.persist(touched) {
                for (uid, before) in undo.into_iter().rev() {
                    match before {
                        Some(record) => self.claims.insert(uid, record),
                        None => self.claims.remove(uid.as_str()),
                    };
                }
                return Err(e);
            }
        }
        Ok(results)
    }

    /// Reads the file (the caller holds the node lock), takes its records when they are to be
    /// gone on with, and writes the file again when it must be.
    fn refresh_locked(&mut self) -> Result<LoadOutcome, CheckpointError> {
        let (outcome, fresh, rewrite) = self.read_locked()?;
        if let Some(fresh) = fresh {
            self.claims = fresh;
        }
        if rewrite {
            self.persist(None)?;
        }
        Ok(outcome)
    }

    /// Reads the file; the caller holds the node lock. Returns what was found, the claims to go
    /// on with (`None`: those this store holds) and whether the file must be rewritten. When
    /// the file is what this store last wrote, it is not read again; when it cannot be used
    /// (missing, corrupt, another boot), the claims this store already holds are kept: they
    /// were recorded during this boot.
    fn read_locked(&mut self) -> Result<(LoadOutcome, Option<Claims>, bool), CheckpointError> {
        if self.known_file.is_some() && self.known_file == FileIdentity::of(&self.path) {
            let outcome = LoadOutcome::Loaded {
                claims: self.claims.len(),
            };
            return Ok((outcome, None, false));
        }
        // Another writer's records: none of the encodings kept applies.
        self.encoded.clear();
        self.known_file = None;
        self.file_reads += 1;
        let identity = FileIdentity::of(&self.path);
        Ok(match read_checkpoint(&self.path)? {
            FileState::Missing => (LoadOutcome::Created, None, true),
            FileState::Corrupt(reason) => {
                let moved_to = move_aside(&self.path)?;
                (LoadOutcome::Corrupt { moved_to, reason }, None, true)
            }
            FileState::Valid(payload) if payload.boot_id != self.boot_id => (
                LoadOutcome::BootChanged {
                    previous: payload.boot_id,
                    current: self.boot_id.clone(),
                    dropped: payload.claims.len(),
                },
                None,
                true,
            ),
            FileState::Valid(payload) => {
                // Unchanged since before it was read (the node lock is held): what was read is
                // what the file holds.
                if identity.is_some() && identity == FileIdentity::of(&self.path) {
                    self.known_file = identity;
                }
                (
                    LoadOutcome::Loaded {
                        claims: payload.claims.len(),
                    },
                    Some(payload.claims),
                    false,
                )
            }
        })
    }

    /// Writes this store's claims atomically; the caller holds the node lock. `touched` lists
    /// the records that changed since the last write (`None`: any may have); the others'
    /// encodings are reused.
    fn persist(&mut self, touched: Option<&[ClaimUid]>) -> Result<(), CheckpointError> {
        let claims = &self.claims;
        self.known_file = None;
        let serialize = |source| CheckpointError::Serialize {
            path: self.path.clone(),
            source,
        };
        // On any failure below `known_file` stays unset, so the next change reads the file
        // again and drops these encodings: they never outlive a write that did not happen.
        match touched {
            Some(touched) => {
                for uid in touched {
                    self.encoded.remove(uid.as_str());
                }
            }
            None => self.encoded.clear(),
        }
        self.encoded.retain(|uid, _| claims.contains_key(uid));
        for (uid, record) in claims {
            if !self.encoded.contains_key(uid) {
                let bytes = canonical_record(record).map_err(serialize)?;
                self.encoded.insert(uid.clone(), bytes);
            }
        }
        let records = self
            .encoded
            .iter()
            .map(|(uid, r)| (uid.as_str(), r.as_slice()));
        atomic_file::replace(&self.path, CHECKPOINT_MODE, |f| {
            let mut out = std::io::BufWriter::with_capacity(64 << 10, f);
            write_records(&mut out, &self.boot_id, records)?;
            out.flush()
        })?;
        self.known_file = FileIdentity::of(&self.path);
        Ok(())
    }
}

/// A checkpoint's records by claim UID.
pub type Claims = BTreeMap<ClaimUid, ClaimRecord>;

pub(super) fn read_boot_id(path: &Path) -> Result<String, CheckpointError> {
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
