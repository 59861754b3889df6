//! The kubedev daemon and CLI.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

/// kubedev serves a node's devices to the kubelet, as Device Plugins and DRA drivers.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon.
    ///
    /// Example: kubedev run --config /etc/kubedev/config.yaml
    Run {
        /// The configuration file (YAML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Check a configuration file and exit.
    ///
    /// Example: kubedev check-config --config /etc/kubedev/config.yaml
    CheckConfig {
        /// The configuration file (YAML).
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::CheckConfig { config } => {
            kubedev::config::Config::load(&config)?;
            println!("{}: ok", config.display());
            Ok(())
        }
        Command::Run { config: path } => {
            let config = kubedev::config::Config::load(&path)?;
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
                    tracing::info!("signal received; shutting down");
                    signals.cancel();
                });
                kubedev::runtime::run(config, &path, None, cancel).await
            })
        }
    }
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
