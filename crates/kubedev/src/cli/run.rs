//! `kubedev run` (the daemon, until SIGTERM or SIGINT) and `kubedev check-config`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::output::write_stdout;
use crate::config::Config;
use crate::registry::Registry;

/// Most threads for blocking work at once.
const BLOCKING_THREADS: usize = 4;

/// `kubedev run`: serves the configuration at `path` until a signal asks to stop.
pub(super) fn run(path: &Path, registry: Registry) -> anyhow::Result<ExitCode> {
    let config = Config::load_with(path, registry)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Few threads for blocking work (file writes, sysfs, a vendor library's calls): each
        // thread that ever ran keeps a glibc malloc arena, and a busy node's bursts otherwise
        // start up to 20, whose arenas stay: over 200,000 claims +2.4 MiB with the default,
        // +0.7 MiB with 4 (`cargo xtask soak`). Loops that run as long as the daemon use
        // threads of their own (`kubedev_core::dedicated`).
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let cancel = CancellationToken::new();
        let signals = cancel.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            // Stop first: logging may fail if stderr is gone.
            signals.cancel();
            tracing::info!("signal received; shutting down");
        });
        crate::runtime::serve(config, path, cancel).await
    })
    .map(|()| ExitCode::SUCCESS)
}

/// `kubedev check-config`.
pub(super) fn check_config(path: &Path, registry: Registry) -> anyhow::Result<ExitCode> {
    Config::check_with(path, registry)?;
    write_stdout(&format!("{}: ok\n", path.display())).map(|()| ExitCode::SUCCESS)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            tracing::error!("cannot install signal handlers; stopping only on Ctrl-C");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
