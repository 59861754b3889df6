//! The backend's factory: its section under `backends.host` and how it is built.

use kubedev_core::factory::{
    BackendFactory, BuildContext, BuildMode, Section, SectionError, typed,
};

use crate::HostBackend;
use crate::config::HostConfig;

impl Section for HostConfig {
    fn validate(&self) -> Result<(), SectionError> {
        HostConfig::validate(self).map_err(|e| SectionError::of(&e))
    }
}

/// The factory of the `host` backend, to register with the daemon.
pub fn factory() -> impl BackendFactory {
    typed(
        "host",
        |config: HostConfig, ctx: &BuildContext| -> Result<HostBackend, SectionError> {
            let backend =
                HostBackend::new(config, &ctx.backend).map_err(|e| SectionError::of(&e))?;
            if ctx.mode == BuildMode::Serve {
                for error in backend.pre_open() {
                    tracing::warn!(%error, "pre-opening a device node failed; continuing");
                }
            }
            Ok(backend)
        },
    )
}
