//! The backend's factory: its section under `backends.usb` and how it is built.

use kubedev_core::factory::{BackendFactory, BuildContext, Section, SectionError, typed};

use crate::UsbBackend;
use crate::config::UsbConfig;

impl Section for UsbConfig {
    fn validate(&self) -> Result<(), SectionError> {
        UsbConfig::validate(self).map_err(|e| SectionError::of(&e))
    }
}

/// The factory of the `usb` backend, to register with the daemon.
pub fn factory() -> impl BackendFactory {
    typed(
        "usb",
        |config: UsbConfig, ctx: &BuildContext| -> Result<UsbBackend, SectionError> {
            UsbBackend::new(config, &ctx.backend).map_err(|e| SectionError::of(&e))
        },
    )
}
