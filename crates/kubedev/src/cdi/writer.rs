//! Writing spec files: `write_spec_file` for any spec, and `CdiWriter` for one driver's claim
//! specs (built, written atomically, verified byte for byte and repaired, removed, listed, and
//! their stale temporary files cleaned up).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use kubedev_core::atomic_file;
use kubedev_core::{ClaimUid, DriverName, PreparedDevice};

use super::names::device_name;
use super::{CLAIM_CLASS, CdiContainerEdits, CdiDevice, CdiError, CdiSpec};

/// Mode of spec files: container runtimes may run as another user.
const SPEC_MODE: u32 = 0o644;
/// The mode of a CDI directory kubedev creates. Unlike kubedev's other directories it is not
/// private: the container runtime and CDI tools (`nvidia-ctk cdi list`, podman run by a user)
/// read the specs in it, as they do in `/etc/cdi` and `/var/run/cdi`.
const SPEC_DIR_MODE: u32 = 0o755;

/// Writes a CDI spec file atomically (temporary file, fsync, rename, directory fsync) with the
/// mode container runtimes expect (0644), creating its directory. The content is written as
/// given: container runtimes read `.json` files as JSON and `.yaml` files as YAML.
pub fn write_spec_file(path: &Path, content: &[u8]) -> Result<(), CdiError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        kubedev_core::safefs::create_dir_all_mode(dir, SPEC_DIR_MODE).map_err(|source| {
            CdiError::Io {
                op: "creating directory",
                path: dir.to_path_buf(),
                source,
            }
        })?;
    }
    Ok(atomic_file::replace(path, SPEC_MODE, |f| {
        f.write_all(content)
    })?)
}

/// A claim's spec file, its bytes (`None`: no device needs edits) and its CDI device IDs.
type ClaimBytes = (PathBuf, Option<Vec<u8>>, Vec<Option<String>>);

/// Renames a directory found where a spec file belongs to the first free
/// `<name>.damaged-<n>` (container runtimes read only `.json` and `.yaml` files).
fn move_dir_aside(path: &Path) -> Result<PathBuf, CdiError> {
    let aside = (1..=1000)
        .map(|n| path.with_extension(format!("json.damaged-{n}")))
        .find(|p| fs::symlink_metadata(p).is_err())
        .unwrap_or_else(|| path.with_extension("json.damaged"));
    fs::rename(path, &aside).map_err(|source| CdiError::Io {
        op: "moving a directory aside from",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(aside)
}

/// What [`CdiWriter::write_claim`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CdiClaimSpec {
    /// The spec file, or `None` when no device needed container edits (then no file exists).
    pub file: Option<PathBuf>,
    /// For each prepared device, in the order given: its qualified CDI device ID
    /// (`k8s.<driver>/claim=<name>`), or `None` when it needs no container edits.
    pub device_ids: Vec<Option<String>>,
}

/// What [`CdiWriter::ensure_claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpecCheck {
    /// The spec file was exactly as it should be (or correctly absent).
    Intact,
    /// The spec file was missing or damaged and was written again.
    Repaired {
        /// What was at the path: `no file`, `a symbolic link`, `a truncated or different file`, ...
        found: String,
    },
}

/// Writes and removes one driver's claim spec files in a CDI directory.
#[derive(Debug, Clone)]
pub struct CdiWriter {
    dir: PathBuf,
    kind: String,
    /// `k8s.<driver>-claim_`: every claim file of this driver starts with it.
    file_prefix: String,
    /// Whether a variable several devices set carries the joined value of all of them (a
    /// claim's devices go to one container together); false when each CDI device is used on its
    /// own.
    join_env: bool,
}

impl CdiWriter {
    /// A writer for `driver`'s claim specs in `cdi_dir` (normally
    /// [`DEFAULT_CDI_DIR`](super::DEFAULT_CDI_DIR)). The directory is created when the first spec
    /// is written.
    pub fn new(cdi_dir: impl Into<PathBuf>, driver: &DriverName) -> Self {
        Self::with_class(cdi_dir, driver, CLAIM_CLASS)
    }

    /// A writer for `driver`'s per-claim specs of CDI class `class` (kind `k8s.<driver>/<class>`,
    /// files `k8s.<driver>-<class>_<uid>.json`), e.g. the device metadata specs.
    pub fn with_class(cdi_dir: impl Into<PathBuf>, driver: &DriverName, class: &str) -> Self {
        let vendor = format!("k8s.{driver}");
        CdiWriter {
            dir: cdi_dir.into(),
            kind: format!("{vendor}/{class}"),
            file_prefix: format!("{vendor}-{class}_"),
            join_env: true,
        }
    }

    /// The same writer for specs whose CDI devices are given to containers independently (the
    /// device plugin's, one CDI device per `Allocate`): each device keeps its own variables,
    /// nothing is joined across devices.
    pub fn with_independent_devices(mut self) -> Self {
        self.join_env = false;
        self
    }

    /// The CDI directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CDI kind of this driver's claim specs, `k8s.<driver>/claim`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The spec file of a claim, `<dir>/k8s.<driver>-claim_<uid>.json`.
    pub fn claim_file(&self, claim_uid: &ClaimUid) -> Result<PathBuf, CdiError> {
        Ok(self
            .dir
            .join(format!("{}{claim_uid}.json", self.file_prefix)))
    }

    /// The spec for a claim's prepared devices, without writing it: `None` when no device needs
    /// container edits. Every name is checked and the content validated.
    pub fn claim_spec(
        &self,
        claim_uid: &ClaimUid,
        prepared: &[PreparedDevice],
    ) -> Result<(Option<CdiSpec>, Vec<Option<String>>), CdiError> {
        // A variable several devices set (e.g. the list of visible GPUs) would otherwise be
        // overwritten device by device when a container gets them all: each device that sets
        // it carries the joined value of the whole claim, as the device-plugin path merges it.
        let mut joined: BTreeMap<String, String> = BTreeMap::new();
        let mut setters: BTreeMap<&str, usize> = BTreeMap::new();
        if self.join_env {
            for p in prepared {
                for (k, v) in &p.edits.env {
                    kubedev_core::join_env_value(&mut joined, k, v);
                    *setters.entry(k.as_str()).or_default() += 1;
                }
            }
        }
        joined.retain(|k, _| setters.get(k.as_str()).is_some_and(|n| *n > 1));
        let mut devices = Vec::new();
        let mut ids = Vec::with_capacity(prepared.len());
        let mut seen = BTreeSet::new();
        for p in prepared {
            let mut p = p.clone();
            for (k, v) in p.edits.env.iter_mut() {
                if let Some(all) = joined.get(k) {
                    v.clone_from(all);
                }
            }
            let p = &p;
            let name = device_name(claim_uid, &p.device)?;
            if !seen.insert(name.clone()) {
                return Err(CdiError::DuplicateDevice { name });
            }
            if let Some(key) = p.edits.env.keys().find(|k| k.contains('=')) {
                return Err(CdiError::InvalidContent {
                    scope: format!("device {name}"),
                    reason: format!("environment variable name {key:?} contains '='"),
                });
            }
            let container_edits = CdiContainerEdits::from_edits(&p.edits);
            if container_edits.is_empty() {
                ids.push(None);
                continue;
            }
            ids.push(Some(format!("{}={name}", self.kind)));
            devices.push(CdiDevice {
                name,
                annotations: p.edits.annotations.clone(),
                container_edits,
            });
        }
        if devices.is_empty() {
            return Ok((None, ids));
        }
        let mut spec = CdiSpec {
            cdi_version: String::new(),
            kind: self.kind.clone(),
            annotations: BTreeMap::new(),
            devices,
            container_edits: CdiContainerEdits::default(),
        };
        spec.hoist_common_edits();
        spec.cdi_version = spec.minimum_version().to_owned();
        spec.validate()?;
        Ok((Some(spec), ids))
    }

    /// The spec file of a claim and its exact bytes as [`CdiWriter::write_claim`] writes them
    /// (`None` when no device needs container edits), with the CDI device IDs.
    fn claim_bytes(
        &self,
        claim_uid: &ClaimUid,
        prepared: &[PreparedDevice],
    ) -> Result<ClaimBytes, CdiError> {
        let path = self.claim_file(claim_uid)?;
        let (spec, device_ids) = self.claim_spec(claim_uid, prepared)?;
        let Some(spec) = spec else {
            return Ok((path, None, device_ids));
        };
        let mut bytes = serde_json::to_vec_pretty(&spec).map_err(|source| CdiError::Serialize {
            path: path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        Ok((path, Some(bytes), device_ids))
    }

    /// Writes the spec file for a claim's prepared devices (replacing an earlier one atomically)
    /// and returns the CDI device IDs for the kubelet. Nothing is written when a name or the
    /// content is invalid. When no device needs container edits, an earlier file is removed.
    pub fn write_claim(
        &self,
        claim_uid: &ClaimUid,
        prepared: &[PreparedDevice],
    ) -> Result<CdiClaimSpec, CdiError> {
        let (path, bytes, device_ids) = self.claim_bytes(claim_uid, prepared)?;
        let Some(bytes) = bytes else {
            self.remove_claim(claim_uid)?;
            return Ok(CdiClaimSpec {
                file: None,
                device_ids,
            });
        };
        self.put(&path, &bytes)?;
        Ok(CdiClaimSpec {
            file: Some(path),
            device_ids,
        })
    }

    /// Writes `bytes` at `path` atomically. A rename replaces a link, a FIFO or a damaged file in
    /// place (never writing through it); a directory in the way is moved aside first, to a name
    /// container runtimes do not read.
    fn put(&self, path: &Path, bytes: &[u8]) -> Result<(), CdiError> {
        kubedev_core::safefs::create_dir_all_mode(&self.dir, SPEC_DIR_MODE).map_err(|source| {
            CdiError::Io {
                op: "creating directory",
                path: self.dir.clone(),
                source,
            }
        })?;
        if fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
            move_dir_aside(path)?;
        }
        atomic_file::replace(path, SPEC_MODE, |f| f.write_all(bytes))?;
        Ok(())
    }

    /// Makes sure a claim's spec file holds exactly what [`CdiWriter::write_claim`] would write
    /// for `prepared`, rewriting it atomically when it is missing, differs, or is not a regular
    /// file (a link is replaced, never followed). Says what it found.
    pub fn ensure_claim(
        &self,
        claim_uid: &ClaimUid,
        prepared: &[PreparedDevice],
    ) -> Result<SpecCheck, CdiError> {
        self.ensure_claim_ids(claim_uid, prepared)
            .map(|(check, _)| check)
    }

    /// [`CdiWriter::ensure_claim`], also giving the CDI device IDs for the kubelet, as
    /// [`CdiWriter::write_claim`] does (the spec is built once).
    pub fn ensure_claim_ids(
        &self,
        claim_uid: &ClaimUid,
        prepared: &[PreparedDevice],
    ) -> Result<(SpecCheck, Vec<Option<String>>), CdiError> {
        let (path, bytes, ids) = self.claim_bytes(claim_uid, prepared)?;
        let Some(bytes) = bytes else {
            let check = match self.remove_claim(claim_uid)? {
                true => SpecCheck::Repaired {
                    found: "a spec file for a claim whose devices need none".into(),
                },
                false => SpecCheck::Intact,
            };
            return Ok((check, ids));
        };
        let found = match kubedev_core::safefs::read_regular(&path, bytes.len() as u64) {
            Ok(Some(current)) if current == bytes => return Ok((SpecCheck::Intact, ids)),
            Ok(Some(current)) if current.len() > bytes.len() => {
                "a longer file with other content".to_string()
            }
            Ok(Some(current)) if current.len() < bytes.len() => {
                format!(
                    "a truncated or different file ({} of {} bytes)",
                    current.len(),
                    bytes.len()
                )
            }
            Ok(Some(_)) => "a file with different content".to_string(),
            Ok(None) => "no file".to_string(),
            Err(kubedev_core::safefs::SafeOpenError::NotAFile { found, .. }) => found.to_string(),
            Err(kubedev_core::safefs::SafeOpenError::Io { source, .. }) => {
                format!("a file that cannot be read ({source})")
            }
        };
        self.put(&path, &bytes)?;
        Ok((SpecCheck::Repaired { found }, ids))
    }

    /// Removes a claim's spec file. Returns whether there was one; a missing file is success.
    pub fn remove_claim(&self, claim_uid: &ClaimUid) -> Result<bool, CdiError> {
        let path = self.claim_file(claim_uid)?;
        self.remove_spec_path(&path)
    }

    /// Removes whatever is at the spec path `path` (a link itself, never its target); a
    /// directory, which kubedev never makes there, is moved aside to a name container runtimes
    /// do not read. Returns whether something was there.
    pub fn remove_spec_path(&self, path: &Path) -> Result<bool, CdiError> {
        let path = path.to_path_buf();
        if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            move_dir_aside(&path)?;
            return Ok(true);
        }
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(source) => {
                return Err(CdiError::Io {
                    op: "removing",
                    path,
                    source,
                });
            }
        }
        atomic_file::sync_dir(&self.dir).map_err(|source| CdiError::Io {
            op: "fsyncing directory",
            path: self.dir.clone(),
            source,
        })?;
        Ok(true)
    }

    /// This driver's claim spec files in the CDI directory, as (claim UID, path), sorted by UID.
    /// Other drivers' files, temporary files and names with an invalid UID are not listed; a
    /// missing directory lists nothing.
    pub fn list_claim_files(&self) -> Result<Vec<(String, PathBuf)>, CdiError> {
        let list_err = |source| CdiError::Io {
            op: "listing",
            path: self.dir.clone(),
            source,
        };
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(list_err(e)),
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(list_err)?;
            let name = entry.file_name();
            let Some(uid) = name
                .to_str()
                .and_then(|n| n.strip_prefix(&self.file_prefix))
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            if ClaimUid::new(uid).is_ok() {
                files.push((uid.to_owned(), entry.path()));
            }
        }
        files.sort();
        Ok(files)
    }

    /// Removes temporary files that interrupted writes of this driver's specs left behind, if
    /// they are at least `older_than` old (another daemon instance may be writing right now, so
    /// pass a margin unless no other instance can run). Returns the files removed.
    pub fn remove_stale_temp_files(&self, older_than: Duration) -> Result<Vec<PathBuf>, CdiError> {
        atomic_file::remove_stale_temps(&self.dir, &self.file_prefix, older_than).map_err(
            |source| CdiError::Io {
                op: "removing stale temporary files in",
                path: self.dir.clone(),
                source,
            },
        )
    }
}
