//! Building backends from the configuration's registry.

use super::*;

pub use kubedev_core::factory::BuildMode;

/// Builds the backends the configuration names, in the order of its registry.
pub fn build_backends(config: &Config, mode: BuildMode) -> anyhow::Result<Vec<Backend>> {
    let mut out = Vec::new();
    for kind in config.registry.kinds() {
        out.extend(build_backend(config, kind, mode)?);
    }
    Ok(out)
}

/// Builds the backend `kind` (a kind of the configuration's registry) when the configuration
/// names it. Each backend gets the host root, its own state directory `<stateDir>/<kind>`
/// (created here) and the node's name.
pub fn build_backend(
    config: &Config,
    kind: &str,
    mode: BuildMode,
) -> anyhow::Result<Option<Backend>> {
    let (Some(section), Some(factory)) = (config.backends.get(kind), config.registry.get(kind))
    else {
        return Ok(None);
    };
    let state_dir = config.state_dir.join(kind);
    kubedev_core::safefs::create_private_dir_all(&state_dir)
        .with_context(|| format!("creating state directory {}", state_dir.display()))?;
    let context = kubedev_core::factory::BuildContext::new(
        kubedev_core::BackendContext::new(
            kubedev_core::HostFs::new(&config.host_root),
            state_dir,
            config.node_name_or_host(),
        ),
        mode,
    )
    .for_kind(kind);
    let built = factory
        .build(section, &context)
        .map_err(|e| anyhow::anyhow!("backends.{kind}: {e}"))?;
    Ok(Some(built.with_kind(kind)))
}

/// Whether the backend `kind` must be rebuilt to go from `old` to `new`: its section changed,
/// or (for a backend with a pool of its own) the host root, state directory or node.
pub(super) fn backend_changed(old: &Config, new: &Config, kind: &str) -> bool {
    let section = old.backends.get(kind) != new.backends.get(kind);
    let host_side = new.registry.get(kind).is_some_and(|f| f.own_pool())
        && (old.host_root != new.host_root
            || old.state_dir != new.state_dir
            || old.node_name_or_host() != new.node_name_or_host());
    section || host_side
}
