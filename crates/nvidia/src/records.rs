//! Crash-safe records of the MIG instances kubedev creates (partitionable strategy).
//!
//! A record is written *before* the GPU instance is created and removed only *after* it is
//! destroyed, so after a crash every instance kubedev made has a record, and a record in state
//! `Creating` or `Destroying` marks work that did not finish. One file per placement device,
//! `<state_dir>/mig-<device>.json`: device names are DNS labels, safe as file names.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::NvidiaError;
use crate::snapshot::Placement;

/// How far the work on one instance got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum RecordState {
    /// About to create (or creating) the GPU and compute instance.
    Creating,
    /// Both exist and were handed to the claim.
    Created,
    /// About to destroy (or destroying) them.
    Destroying,
}

/// One MIG instance kubedev owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MigRecord {
    /// The claim it was created for.
    pub(crate) claim_uid: String,
    /// The placement device (name in the pool).
    pub(crate) device: String,
    /// The parent GPU.
    pub(crate) gpu_uuid: String,
    /// NVML GPU instance profile index (`NVML_GPU_INSTANCE_PROFILE_*`).
    pub(crate) profile_index: u32,
    /// NVML GPU instance profile id.
    pub(crate) profile_id: u32,
    /// Placement start (memory slice).
    pub(crate) start: u32,
    /// Placement size (memory slices).
    pub(crate) size: u32,
    /// Progress.
    pub(crate) state: RecordState,
    /// GPU instance id, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) gi_id: Option<u32>,
    /// Compute instance id, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ci_id: Option<u32>,
    /// The MIG device UUID, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) mig_uuid: Option<String>,
}

impl MigRecord {
    pub(crate) fn placement(&self) -> Placement {
        Placement {
            start: self.start,
            size: self.size,
        }
    }
}

/// The directory of records.
#[derive(Debug, Clone)]
pub(crate) struct RecordStore {
    dir: PathBuf,
}

/// The largest MIG record read; a record is a few hundred bytes.
const MAX_RECORD_BYTES: u64 = 1 << 20;
const PREFIX: &str = "mig-";
const SUFFIX: &str = ".json";

impl RecordStore {
    /// Records in `dir`, which is created when missing.
    pub(crate) fn open(dir: &Path) -> Result<Self, NvidiaError> {
        kubedev_core::safefs::create_private_dir_all(dir).map_err(|error| {
            NvidiaError::StateDir {
                path: dir.to_owned(),
                error,
            }
        })?;
        Ok(RecordStore {
            dir: dir.to_owned(),
        })
    }

    fn path(&self, device: &str) -> PathBuf {
        self.dir.join(format!("{PREFIX}{device}{SUFFIX}"))
    }

    /// The record of a placement device, if any. A record that cannot be read is an error
    /// naming the file.
    pub(crate) fn get(&self, device: &str) -> Result<Option<MigRecord>, NvidiaError> {
        let path = self.path(device);
        // Never blocks on a FIFO or follows a link planted in the state directory.
        match kubedev_core::safefs::read_regular(&path, MAX_RECORD_BYTES) {
            Ok(Some(bytes)) => parse(&path, &bytes).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(NvidiaError::StateDir {
                path,
                error: e.into(),
            }),
        }
    }

    /// Writes (replaces) a record durably.
    pub(crate) fn put(&self, rec: &MigRecord) -> Result<(), NvidiaError> {
        let path = self.path(&rec.device);
        let bytes = serde_json::to_vec_pretty(rec).map_err(|e| NvidiaError::StateDir {
            path: path.clone(),
            error: std::io::Error::other(e),
        })?;
        kubedev_core::durable::write(&path, &bytes)
            .map_err(|error| NvidiaError::StateDir { path, error })
    }

    /// Removes a record durably; a missing record is fine.
    pub(crate) fn remove(&self, device: &str) -> Result<(), NvidiaError> {
        let path = self.path(device);
        kubedev_core::durable::remove(&path).map_err(|error| NvidiaError::StateDir { path, error })
    }

    /// Every readable record; unreadable files are logged and skipped (they name no instance
    /// kubedev can act on safely).
    pub(crate) fn all(&self) -> Result<Vec<MigRecord>, NvidiaError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|error| NvidiaError::StateDir {
            path: self.dir.clone(),
            error,
        })?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !(name.starts_with(PREFIX) && name.ends_with(SUFFIX)) {
                continue;
            }
            let path = entry.path();
            match kubedev_core::safefs::read_regular(&path, MAX_RECORD_BYTES)
                .map_err(|e| NvidiaError::StateDir {
                    path: path.clone(),
                    error: e.into(),
                })
                .and_then(|b| match b {
                    Some(b) => parse(&path, &b),
                    None => Err(NvidiaError::StateDir {
                        path: path.clone(),
                        error: std::io::ErrorKind::NotFound.into(),
                    }),
                }) {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::warn!(error = %kubedev_core::echo::Chain(&e), "skipping unreadable MIG record")
                }
            }
        }
        out.sort_by(|a, b| a.device.cmp(&b.device));
        Ok(out)
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<MigRecord, NvidiaError> {
    serde_json::from_slice(bytes).map_err(|e| NvidiaError::StateDir {
        path: path.to_owned(),
        error: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn put_get_all_remove() {
        let d = tempfile::tempdir().unwrap();
        let store = RecordStore::open(&d.path().join("nvidia")).unwrap();
        let rec = MigRecord {
            claim_uid: "uid-1".into(),
            device: "gpu-0-mig-1g5gb-3".into(),
            gpu_uuid: "GPU-x".into(),
            profile_index: 0,
            profile_id: 19,
            start: 3,
            size: 1,
            state: RecordState::Creating,
            gi_id: None,
            ci_id: None,
            mig_uuid: None,
        };
        assert_eq!(store.get(&rec.device).unwrap(), None);
        store.put(&rec).unwrap();
        assert_eq!(store.get(&rec.device).unwrap(), Some(rec.clone()));
        std::fs::write(d.path().join("nvidia/mig-broken.json"), b"{").unwrap();
        std::fs::write(d.path().join("nvidia/other.txt"), b"x").unwrap();
        assert_eq!(store.all().unwrap(), vec![rec.clone()]);
        let err = store.get("broken").unwrap_err().to_string();
        assert!(err.contains("mig-broken.json"), "{err}");
        store.remove(&rec.device).unwrap();
        store.remove(&rec.device).unwrap();
        assert_eq!(store.get(&rec.device).unwrap(), None);
    }
}
