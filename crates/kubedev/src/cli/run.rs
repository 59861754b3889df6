//! `kubedev run` (the daemon, until SIGTERM or SIGINT) and `kubedev check-config`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::output::write_stdout;
use crate::config::Config;
use crate::registry::Registry;

/// `kubedev run`: serves the configuration at `path` until a signal asks to stop.
pub(super) fn run(path: &Path, registry: Registry) -> anyhow::Result<ExitCode> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    limit_malloc_arenas();
    let config = Config::load_with(path, registry)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
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

/// The malloc arenas the daemon runs with unless `MALLOC_ARENA_MAX` is set.
///
/// glibc gives threads up to eight arenas per CPU, and memory freed in one stays there. The
/// runtime starts threads for blocking work in bursts and retires them when idle, so on a busy
/// node every burst spread the daemon's allocations over more arenas: over a million claims
/// its resident memory settled 2.8 MiB above where it started, against 0.4 MiB with two.
const MALLOC_ARENAS: &str = "2";

/// Runs this command again, in this process, with `MALLOC_ARENA_MAX` set to [`MALLOC_ARENAS`]
/// (glibc reads it only when a program starts); does nothing when the variable is set already,
/// by the operator or by this re-run. When that fails, the daemon goes on with glibc's default.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    use std::os::unix::process::CommandExt as _;
    const VAR: &str = "MALLOC_ARENA_MAX";
    if std::env::var_os(VAR).is_some() {
        return;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            tracing::warn!(error = %e, "cannot find this program to limit its malloc arenas; running with glibc's default");
            return;
        }
    };
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new(&exe);
    if let Some(argv0) = args.next() {
        cmd.arg0(argv0);
    }
    // Returns only when the program could not be run again.
    let error = cmd.args(args).env(VAR, MALLOC_ARENAS).exec();
    tracing::warn!(%error, program = %exe.display(), "cannot run again to limit malloc arenas; running with glibc's default");
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
