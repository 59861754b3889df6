//! Connecting to the API server: from a kubeconfig file, or in-cluster.

use std::path::{Path, PathBuf};

/// The API server could not be reached or configured.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The kubeconfig file could not be read or parsed.
    #[error("reading kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// No kubeconfig was given and the in-cluster configuration is missing or broken.
    #[error("no kubeconfig given and no in-cluster configuration: {0}")]
    Infer(String),
    /// Building the HTTP client failed.
    #[error("building the API-server client: {0}")]
    Client(String),
}

/// A client for the API server: from `kubeconfig` (its current context) when given, otherwise
/// the in-cluster service account (or `KUBECONFIG`, as `kubectl` does).
pub async fn connect(kubeconfig: Option<&Path>) -> Result<kube::Client, ConnectError> {
    let config = match kubeconfig {
        Some(path) => from_kubeconfig(path).await?,
        None => kube::Config::infer()
            .await
            .map_err(|e| ConnectError::Infer(kubedev_core::echo::chain(&e)))?,
    };
    kube::Client::try_from(config).map_err(|e| ConnectError::Client(kubedev_core::echo::chain(&e)))
}

/// Whether [`connect`] can use the kubeconfig file `path`: it must be readable and parse, and
/// its current context must name a cluster with a server URL and readable certificates.
/// Nothing is sent to the API server.
pub async fn check_kubeconfig(path: &Path) -> Result<(), ConnectError> {
    from_kubeconfig(path).await.map(drop)
}

async fn from_kubeconfig(path: &Path) -> Result<kube::Config, ConnectError> {
    let file = kube::config::Kubeconfig::read_from(path).map_err(|e| ConnectError::Kubeconfig {
        path: path.to_path_buf(),
        message: kubedev_core::echo::chain(&e),
    })?;
    kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .map_err(|e| ConnectError::Kubeconfig {
            path: path.to_path_buf(),
            message: kubedev_core::echo::chain(&e),
        })
}
