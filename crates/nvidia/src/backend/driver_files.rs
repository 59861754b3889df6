//! The NVIDIA driver's user-space files for the running driver version: found at discovery,
//! found again when the kernel module changes version, and what prepared devices get of them.

use std::sync::Arc;

use kubedev_core::{ContainerEdits, PreparedDevice};

use super::Inner;
use crate::driver::{DriverFiles, DriverLocation};
use crate::edits::EditSource;

/// The version of the loaded NVIDIA kernel module.
const MODULE_VERSION: &str = "/sys/module/nvidia/version";

/// The driver files of one driver version and what they give a container.
#[derive(Debug, Default)]
pub(super) struct DriverState {
    /// The files found.
    pub(super) files: DriverFiles,
    /// Their mounts and hooks.
    pub(super) edits: ContainerEdits,
    /// The host directory whose `dev/` holds the device nodes.
    pub(super) dev_root: std::path::PathBuf,
}

impl Inner {
    /// The driver files in use now.
    pub(super) fn driver(&self) -> Arc<DriverState> {
        self.driver.read().clone()
    }

    /// Finds the driver files of `version` when it is not the version found last (the first
    /// discovery, a driver upgrade or reload); what is missing is logged once per version.
    pub(super) fn refresh_driver(&self, version: Option<&str>) {
        let Some(version) = version else { return };
        let current = self.driver();
        if current.files.version == version {
            return;
        }
        let root = self.config.driver_root.as_path();
        let dev_root = match &self.config.dev_root {
            Some(d) => d.clone(),
            None if root != std::path::Path::new("/")
                && self.ctx.host.exists(root.join("dev/nvidiactl")) =>
            {
                root.to_path_buf()
            }
            None => "/".into(),
        };
        let files = DriverLocation {
            host: &self.ctx.host,
            root,
            layout: self.config.library_layout,
            hook: self.config.cdi_hook_path.as_deref(),
        }
        .find(version);
        if !current.files.version.is_empty() {
            tracing::warn!(
                from = %current.files.version, to = %version,
                "the NVIDIA driver version changed; containers get the new version's files"
            );
        }
        tracing::info!(
            version = %version,
            driver_root = %root.display(),
            libraries = files.libraries.len(),
            binaries = files.binaries.len(),
            firmware = files.firmware.is_some(),
            sockets = files.ipc.len(),
            hooks = files.hook.is_some(),
            "NVIDIA driver files found"
        );
        for m in &files.missing {
            tracing::warn!(driver_root = %root.display(), "NVIDIA driver file not found: {m}");
        }
        let edits = files.edits();
        *self.driver.write() = Arc::new(DriverState {
            files,
            edits,
            dev_root,
        });
    }

    /// `prepared`'s edits with the current driver files in place of those it was prepared
    /// with: every mount but the claim's MPS pipe directory and every hook are the driver's.
    /// `None` when nothing changes or no driver version is known yet.
    pub(super) fn refreshed(&self, prepared: &PreparedDevice) -> Option<ContainerEdits> {
        if prepared.device.device.pool != self.pool {
            return None;
        }
        let driver = self.driver();
        if driver.files.version.is_empty() {
            return None;
        }
        let old = &prepared.edits;
        let mut new = old.clone();
        let own: Vec<_> = old
            .mounts
            .iter()
            .filter(|m| m.container_path == crate::sharing::MPS_CONTAINER_PIPE_DIR)
            .cloned()
            .collect();
        new.mounts = driver.edits.mounts.clone();
        new.mounts.extend(own);
        new.hooks = driver.edits.hooks.clone();
        (new != *old).then_some(new)
    }

    /// The version of the loaded kernel module, from sysfs (`None` when it cannot be read).
    pub(super) fn module_version(&self) -> Option<String> {
        self.ctx
            .host
            .read_attr_opt(MODULE_VERSION)
            .ok()
            .flatten()
            .filter(|v| !v.is_empty())
    }

    /// True when the kernel module now runs another version than the one NVML was loaded for
    /// (the driver was upgraded or reloaded): the NVML handle is stale.
    pub(super) fn module_changed(&self) -> bool {
        let known = self.driver();
        !known.files.version.is_empty()
            && self
                .module_version()
                .is_some_and(|v| v != known.files.version)
    }

    pub(super) fn edit_source<'a>(&'a self, driver: &'a DriverState) -> EditSource<'a> {
        EditSource {
            host: &self.ctx.host,
            dev_root: &driver.dev_root,
            driver: &driver.edits,
        }
    }
}
