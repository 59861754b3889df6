//! Locks in the plugin data directory: the node-wide lock that serialises every
//! read-modify-write of the checkpoint, and the per-instance leases that tell whether the
//! instance that started a prepare is still alive.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use kubedev_core::safefs;

use super::{CheckpointError, INSTANCES_DIR, LOCK_FILE};

/// An exclusive, node-wide lock on a plugin data directory (`<dir>/kubedev.lock`).
///
/// It serialises the checkpoint's read-modify-write between processes, e.g. the old and the new
/// daemon during a rolling update. The lock is an advisory `flock` held by an open file: it is
/// released when the value is dropped or the process dies. It is not re-entrant: a second
/// `acquire` on the same directory, even from the same process, waits for the first to be
/// dropped — so do not hold it while calling [`CheckpointStore`](super::CheckpointStore)
/// methods, which take it themselves. Acquiring blocks the thread; from async code call it in
/// `spawn_blocking`.
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
