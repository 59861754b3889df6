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

/// A client for the API server as `kubectl --kubeconfig K --context C` reaches it: `context`
/// (default: the current context) of `kubeconfig`, or of `KUBECONFIG` or `~/.kube/config`
/// when no file is given; without either, the same as [`connect`]. The client's default
/// namespace is the context's namespace (`default` when it names none).
pub async fn connect_context(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Client, ConnectError> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config =
        match (kubeconfig, context) {
            (Some(path), _) => from_kubeconfig_with(path, &options).await?,
            (None, Some(_)) => kube::Config::from_kubeconfig(&options).await.map_err(|e| {
                ConnectError::Kubeconfig {
                    path: PathBuf::from("(KUBECONFIG or ~/.kube/config)"),
                    message: kubedev_core::echo::chain(&e),
                }
            })?,
            (None, None) => return connect(None).await,
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
    from_kubeconfig_with(path, &Default::default()).await
}

async fn from_kubeconfig_with(
    path: &Path,
    options: &kube::config::KubeConfigOptions,
) -> Result<kube::Config, ConnectError> {
    let file = kube::config::Kubeconfig::read_from(path).map_err(|e| ConnectError::Kubeconfig {
        path: path.to_path_buf(),
        message: kubedev_core::echo::chain(&e),
    })?;
    kube::Config::from_custom_kubeconfig(file, options)
        .await
        .map_err(|e| ConnectError::Kubeconfig {
            path: path.to_path_buf(),
            message: kubedev_core::echo::chain(&e),
        })
}
