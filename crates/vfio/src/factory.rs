//! The backend's factory: its section under `backends.vfio` and how it is built.

use kubedev_core::factory::{
    BackendFactory, BuildContext, BuildMode, Section, SectionError, typed,
};

use crate::backend::VfioBackend;
use crate::config::VfioConfig;

impl Section for VfioConfig {
    fn validate(&self) -> Result<(), SectionError> {
        VfioConfig::validate(self).map_err(|e| SectionError::of(&e))
    }
}

/// The factory of the `vfio` backend, to register with the daemon.
pub fn factory() -> impl BackendFactory {
    typed(
        "vfio",
        |config: VfioConfig, ctx: &BuildContext| -> Result<VfioBackend, SectionError> {
            let desired = config.desired_mdev_types.clone();
            let backend =
                VfioBackend::new(config, &ctx.backend).map_err(|e| SectionError::of(&e))?;
            if ctx.mode == BuildMode::Serve && !desired.is_empty() {
                // Before discovery, so the mediated devices it creates are offered at once.
                match backend.type_manager().apply() {
                    Ok(report) => {
                        tracing::info!(
                            created = report.created.len(),
                            removed = report.removed.len(),
                            "mediated device types applied"
                        );
                        for e in &report.errors {
                            tracing::error!(error = %e, "mediated device type change failed");
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %kubedev_core::echo::Chain(&e), "applying backends.vfio.desiredMdevTypes failed")
                    }
                }
            }
            Ok(backend)
        },
    )
}
