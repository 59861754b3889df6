//! Spec files installed in [`SPEC_DIR`] for the length of a test: [`Podman::install_spec`] and
//! the [`InstalledSpec`] guard that removes them.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

use super::tools::parse_version;
use super::{Podman, PodmanError, SPEC_DIR, io_err};

/// Spec files installed by this process: how many are live, and whether the harness created
/// [`SPEC_DIR`] (then it is removed again, when empty, once the last one is gone).
static INSTALLED: Mutex<(usize, bool)> = Mutex::new((0, false));
static NEXT_SPEC: AtomicU32 = AtomicU32::new(0);

/// A spec file in [`SPEC_DIR`], removed when dropped.
#[derive(Debug)]
pub struct InstalledSpec {
    path: PathBuf,
    kind: String,
    names: Vec<String>,
}

impl InstalledSpec {
    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The spec's kind (`vendor/class`).
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The names of the spec's devices, in its order.
    pub fn device_names(&self) -> Vec<String> {
        self.names.clone()
    }

    /// The qualified IDs (`kind=name`) of the spec's devices, in its order.
    pub fn device_ids(&self) -> Vec<String> {
        self.names
            .iter()
            .map(|n| format!("{}={n}", self.kind))
            .collect()
    }
}

impl Drop for InstalledSpec {
    fn drop(&mut self) {
        let mut state = INSTALLED.lock();
        let _ = std::fs::remove_file(&self.path);
        state.0 = state.0.saturating_sub(1);
        if state.0 == 0 && state.1 {
            // Only when empty: another process's specs keep it.
            if std::fs::remove_dir(SPEC_DIR).is_ok() {
                state.1 = false;
            }
        }
    }
}

impl Podman {
    /// Installs the spec `json` in [`SPEC_DIR`] (created when missing) as
    /// `kubedev-test-<pid>-<n>-<vendor>_<class>.json`, unchanged; it is removed when the
    /// returned guard is dropped. Refuses a `cdiVersion` newer than this podman reads.
    pub fn install_spec(&self, json: &str) -> Result<InstalledSpec, PodmanError> {
        let spec: Value = serde_json::from_str(json).map_err(|e| {
            PodmanError::Spec(format!("not JSON: {}", kubedev_core::echo::chain(&e)))
        })?;
        let kind = spec["kind"]
            .as_str()
            .ok_or_else(|| PodmanError::Spec("no kind".into()))?
            .to_string();
        let version = spec["cdiVersion"]
            .as_str()
            .ok_or_else(|| PodmanError::Spec(format!("kind {kind}: no cdiVersion")))?
            .to_string();
        if let Some(max) = self.tools.max_cdi_version() {
            let newer = match (parse_version(&version), parse_version(max)) {
                (Some(v), Some(m)) => v > m,
                _ => true,
            };
            if newer {
                return Err(PodmanError::UnsupportedCdiVersion {
                    kind,
                    version,
                    max: max.to_string(),
                    podman: self.tools.podman_version.clone(),
                });
            }
        }
        let names = spec["devices"]
            .as_array()
            .map(|ds| {
                ds.iter()
                    .filter_map(|d| d["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let safe: String = kind
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let n = NEXT_SPEC.fetch_add(1, Ordering::Relaxed);
        let name = format!("kubedev-test-{}-{n}-{safe}.json", std::process::id());
        let path = Path::new(SPEC_DIR).join(&name);
        let tmp = Path::new(SPEC_DIR).join(format!(".{name}.tmp"));
        let mut state = INSTALLED.lock();
        if !Path::new(SPEC_DIR).is_dir() {
            std::fs::create_dir_all(SPEC_DIR).map_err(io_err(format!("creating {SPEC_DIR}")))?;
            state.1 = true;
        }
        std::fs::write(&tmp, json).map_err(io_err(format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(io_err(format!("renaming to {}", path.display())))?;
        state.0 += 1;
        Ok(InstalledSpec { path, kind, names })
    }

    /// [`Podman::install_spec`] with the content of the file at `path`.
    pub fn install_spec_file(&self, path: &Path) -> Result<InstalledSpec, PodmanError> {
        let json = std::fs::read_to_string(path)
            .map_err(io_err(format!("reading the spec {}", path.display())))?;
        self.install_spec(&json)
    }
}
