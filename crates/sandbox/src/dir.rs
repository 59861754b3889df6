//! [`PolicyDir`]: a directory of `.wasm` policies, reloaded when files change. A new module
//! replaces the old one only after it passes the contract check and the sample requests.

use parking_lot::RwLock;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::error::PolicyError;
use crate::policy::WasmPolicy;
use crate::sandbox::{Sandbox, check_magic, read_module};

/// The policies of one directory (`<name>.wasm` each), by name.
#[derive(Debug)]
pub struct PolicyDir {
    sandbox: Sandbox,
    dir: PathBuf,
    state: RwLock<DirState>,
}

#[derive(Debug, Default)]
struct DirState {
    policies: BTreeMap<String, WasmPolicy>,
    /// Digests of the files in use, and of files rejected (so they are not retried until
    /// they change).
    seen: HashMap<String, [u8; 32]>,
}

/// What one [`PolicyDir::reload`] did.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ReloadReport {
    /// Policies loaded for the first time.
    pub added: Vec<String>,
    /// Policies replaced by a new module.
    pub replaced: Vec<String>,
    /// Policies whose file is gone.
    pub removed: Vec<String>,
    /// New modules refused; the old policy (if any) stays.
    pub rejected: Vec<(String, PolicyError)>,
}

impl ReloadReport {
    /// True when nothing changed and nothing was refused.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.replaced.is_empty()
            && self.removed.is_empty()
            && self.rejected.is_empty()
    }
}

/// A valid policy name: what a file stem may be.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !name.starts_with('.')
}

impl PolicyDir {
    /// Loads every policy in `dir`. The directory must be readable; modules that fail are
    /// in the report and are retried when their file changes.
    pub fn open(
        sandbox: &Sandbox,
        dir: impl Into<PathBuf>,
    ) -> Result<(PolicyDir, ReloadReport), PolicyError> {
        let dir = PolicyDir {
            sandbox: sandbox.clone(),
            dir: dir.into(),
            state: RwLock::new(DirState::default()),
        };
        let report = dir.try_reload()?;
        Ok((dir, report))
    }

    /// The directory, with no policy loaded yet: checks only that it can be listed, so a
    /// caller's start-up does not wait on compiling its modules. Until the first
    /// [`reload`](PolicyDir::reload), [`PolicyDir::get`] finds nothing.
    pub fn open_deferred(
        sandbox: &Sandbox,
        dir: impl Into<PathBuf>,
    ) -> Result<PolicyDir, PolicyError> {
        let dir = PolicyDir {
            sandbox: sandbox.clone(),
            dir: dir.into(),
            state: RwLock::new(DirState::default()),
        };
        dir.scan()?;
        Ok(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The policy named `name`, if loaded.
    pub fn get(&self, name: &str) -> Option<WasmPolicy> {
        self.read().policies.get(name).cloned()
    }

    /// Names of the loaded policies, sorted.
    pub fn names(&self) -> Vec<String> {
        self.read().policies.keys().cloned().collect()
    }

    fn read(&self) -> parking_lot::RwLockReadGuard<'_, DirState> {
        self.state.read()
    }

    /// Looks at the directory again: new and changed modules are checked and swapped in;
    /// a module that fails leaves the old policy in place; removed files drop their policy.
    /// An unreadable directory changes nothing and is reported as a rejection of `"."`.
    pub fn reload(&self) -> ReloadReport {
        match self.try_reload() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %kubedev_core::echo::Chain(&e), "policy directory unreadable; policies unchanged");
                ReloadReport {
                    rejected: vec![(".".to_string(), e)],
                    ..ReloadReport::default()
                }
            }
        }
    }

    fn try_reload(&self) -> Result<ReloadReport, PolicyError> {
        let files = self.scan()?;
        let mut report = ReloadReport::default();
        // Check new modules without holding the lock: a sample run takes milliseconds.
        let mut fresh: Vec<(String, [u8; 32], Result<WasmPolicy, PolicyError>)> = Vec::new();
        {
            let state = self.read();
            for (name, path) in &files {
                let bytes = match read_module(path, self.sandbox.limits().max_module_bytes) {
                    Ok(b) => b,
                    Err(e) => {
                        // Unreadable now (perhaps being replaced): keep what we have.
                        report.rejected.push((name.clone(), e));
                        continue;
                    }
                };
                let digest: [u8; 32] = Sha256::digest(&bytes).into();
                if state.seen.get(name) == Some(&digest) {
                    continue;
                }
                // A file that is not WebAssembly is recorded like any bad module: reported
                // once, not again until it changes.
                let loaded = check_magic(path, &bytes)
                    .and_then(|()| self.sandbox.load(name, &bytes))
                    .and_then(|p| {
                        crate::check::validate(&p)?;
                        Ok(p)
                    });
                fresh.push((name.clone(), digest, loaded));
            }
        }
        let mut state = self.state.write();
        for (name, digest, loaded) in fresh {
            state.seen.insert(name.clone(), digest);
            match loaded {
                Ok(p) => {
                    if state.policies.insert(name.clone(), p).is_some() {
                        tracing::info!(policy = %name, "selection policy replaced");
                        report.replaced.push(name);
                    } else {
                        tracing::info!(policy = %name, "selection policy loaded");
                        report.added.push(name);
                    }
                }
                Err(e) => {
                    if state.policies.contains_key(&name) {
                        tracing::warn!(policy = %name, error = %kubedev_core::echo::Chain(&e), "new module refused; the previous policy stays");
                    } else {
                        tracing::warn!(policy = %name, error = %kubedev_core::echo::Chain(&e), "policy module refused");
                    }
                    report.rejected.push((name, e));
                }
            }
        }
        let gone: Vec<String> = state
            .seen
            .keys()
            .filter(|n| !files.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            state.seen.remove(&name);
            if state.policies.remove(&name).is_some() {
                tracing::info!(policy = %name, "selection policy removed with its file");
                report.removed.push(name);
            }
        }
        Ok(report)
    }

    /// `name → path` of the `.wasm` files with valid names.
    fn scan(&self) -> Result<BTreeMap<String, PathBuf>, PolicyError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| PolicyError::io(&self.dir, e))?;
        let mut files = BTreeMap::new();
        for entry in entries {
            let entry = entry.map_err(|e| PolicyError::io(&self.dir, e))?;
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("wasm") {
                continue;
            }
            let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if !valid_name(name) {
                continue;
            }
            // Follows symlinks (ConfigMap volumes are symlinks into a data directory).
            if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                files.insert(name.to_string(), path);
            }
        }
        Ok(files)
    }
}
