//! The daemon as a library: a vendor's driver registers its backends and gets what the built-in
//! ones get — both kubelet APIs with device ownership, ResourceSlices and DeviceClasses,
//! checkpoint and CDI, live configuration, metrics and probes, and the command line.
//!
//! ```no_run
//! use kubedev::Daemon;
//!
//! fn main() -> std::process::ExitCode {
//!     // The built-in backends and one of the vendor's own (here: the static one again).
//!     Daemon::builder()
//!         .builtin_backends()
//!         .backend(kubedev::static_backend::factory())
//!         .main()
//! }
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kubedev_core::factory::BackendFactory;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};
use crate::registry::Registry;

/// A kubedev daemon with its backend kinds; made by [`Daemon::builder`].
#[derive(Debug, Clone, Default)]
pub struct Daemon {
    registry: Registry,
    program: Option<crate::cli::Program>,
}

impl Daemon {
    /// A daemon that knows no backend yet.
    pub fn builder() -> Daemon {
        Daemon::default()
    }

    /// Adds the backends of this build of kubedev ([`Registry::builtin`]).
    pub fn builtin_backends(mut self) -> Self {
        for f in Registry::builtin().factories() {
            self.registry = self.registry.shared(f.clone());
        }
        self
    }

    /// Adds a backend kind (replacing one registered under the same key).
    pub fn backend(mut self, factory: impl BackendFactory) -> Self {
        self.registry = self.registry.backend(factory);
        self
    }

    /// Presents the command line as `name` at `version` (in `--help`, `--version` and its
    /// messages) instead of kubedev.
    pub fn program(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.program = Some(crate::cli::Program::new(name, version));
        self
    }

    /// Says what the program serves in `--help`.
    pub fn about(mut self, about: impl Into<String>) -> Self {
        let program = self
            .program
            .take()
            .unwrap_or_else(|| crate::cli::Program::new("kubedev", env!("CARGO_PKG_VERSION")));
        self.program = Some(program.about(about));
        self
    }

    /// The backend kinds registered so far.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Runs the command line (`run`, `check-config`, `discover`, `cdi generate`, `who-uses`,
    /// `simulate`, `policy check`) with these backends: the whole of a driver's `main`.
    pub fn main(self) -> ExitCode {
        crate::cli::main_as(self.program, self.registry)
    }

    /// Serves the configuration file at `config_path` until `shutdown` is cancelled: what
    /// `run --config` does, inside a Tokio runtime the caller owns. DRA mode connects to the API
    /// server the file names.
    pub async fn run(
        self,
        config_path: &Path,
        shutdown: CancellationToken,
    ) -> Result<(), DaemonError> {
        let config = Config::load_with(config_path, self.registry)?;
        crate::runtime::serve(config, config_path, shutdown)
            .await
            .map_err(|e| DaemonError::Serve {
                path: config_path.to_path_buf(),
                source: e.into(),
            })
    }
}

/// Why [`Daemon::run`] stopped before it was told to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// The configuration file could not be read, or says something the daemon refuses.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Serving the configuration failed: a socket, the API server, the state directory or a
    /// backend refused, as the cause says.
    #[error("serving {}", .path.display())]
    Serve {
        /// The configuration file being served.
        path: PathBuf,
        /// What failed, with its causes.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}
