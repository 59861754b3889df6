//! The backend's factory: its section under `backends.nvidia` and how it is built.

use kubedev_core::factory::{BackendFactory, BuildContext, Section, SectionError, typed};

use crate::backend::NvidiaBackend;
use crate::config::NvidiaConfig;

impl Section for NvidiaConfig {
    fn validate(&self) -> Result<(), SectionError> {
        NvidiaConfig::validate(self).map_err(|e| SectionError::of(&e))
    }
}

/// The factory of the `nvidia` backend, to register with the daemon.
pub fn factory() -> impl BackendFactory {
    typed(
        "nvidia",
        |config: NvidiaConfig, ctx: &BuildContext| -> Result<NvidiaBackend, SectionError> {
            NvidiaBackend::new(config, &ctx.backend).map_err(|e| SectionError::of(&e))
        },
    )
}
