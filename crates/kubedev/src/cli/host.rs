//! `kubedev discover` (what the configured backends find on this host) and `kubedev who-uses`
//! (which pod and container hold each device, from the kubelet).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use super::args::{DiscoverOutput, WhoUsesOutput};
use super::output::write_stdout;
use crate::config::Config;
use crate::registry::Registry;

/// `kubedev discover`.
pub(super) fn discover(
    path: &Path,
    output: DiscoverOutput,
    registry: Registry,
) -> anyhow::Result<ExitCode> {
    let config = Config::load_with(path, registry)?;
    let rt = super::current_thread_runtime()?;
    let found = rt.block_on(crate::discover::discover(&config, path))?;
    let text = match output {
        DiscoverOutput::Table => found.table(),
        DiscoverOutput::Json => {
            format!("{:#}\n", found.slices(&config)?)
        }
        DiscoverOutput::Yaml => {
            serde_saphyr::to_string(&found.slices(&config)?).context("encoding YAML")?
        }
    };
    write_stdout(&text).map(|()| ExitCode::SUCCESS)
}

/// `kubedev who-uses`: asks the kubelet at `socket`; only this daemon's resources and driver
/// with `config`, only `devices` when some are named.
pub(super) fn who_uses(
    socket: &Path,
    config: Option<PathBuf>,
    output: WhoUsesOutput,
    devices: &[String],
    registry: Registry,
) -> anyhow::Result<ExitCode> {
    let config = config
        .map(|p| Config::load_with(&p, registry))
        .transpose()?;
    let rt = super::current_thread_runtime()?;
    let pods = rt.block_on(async {
        let mut client = kubedev_kubelet_grpc::pod_resources::PodResourcesClient::connect(
            socket,
            std::time::Duration::from_secs(5),
        )
        .await?;
        client.list().await
    })?;
    let rows = crate::who_uses::filter(
        kubedev_kubelet_grpc::pod_resources::device_uses(&pods),
        config.as_ref(),
        devices,
    );
    let text = match output {
        WhoUsesOutput::Table => crate::who_uses::table(&rows),
        WhoUsesOutput::Json => format!("{:#}\n", serde_json::to_value(&rows)?),
    };
    write_stdout(&text).map(|()| ExitCode::SUCCESS)
}
