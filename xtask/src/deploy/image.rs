//! The container image: `deploy/Dockerfile` and `.dockerignore` against the chart, the workspace
//! and the daemon binary. Nothing here needs a Docker engine: the Dockerfile is read as text, the
//! binary's dynamic libraries from its ELF headers.
//!
//! The Dockerfile is parsed in the `dockerfile` module; the runtime stage is checked in
//! `runtime` (with the libraries the binary needs), the builder stage and the features it
//! builds in `builder`, the build context in `context`.

mod builder;
mod context;
mod dockerfile;
mod runtime;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context as _;
use serde_json::Value;

use builder::{check_features, needed_features};
use context::{cargo_loads, check_context, copy_context, parse_ignore};
use dockerfile::parse;
use runtime::{Base, check_dockerfile, check_libraries, linkage};

/// The Dockerfile, relative to the workspace root.
pub(super) const DOCKERFILE: &str = "deploy/Dockerfile";
/// The ignore file of the build context (the workspace root).
const DOCKERIGNORE: &str = ".dockerignore";

/// What the workspace says the image must match.
#[derive(Debug, Default)]
pub(super) struct Workspace {
    /// `rust-version` of the kubedev crate.
    pub(super) rust_version: String,
    /// Its version: the chart's appVersion, the image tag.
    pub(super) version: String,
    pub(super) license: String,
    pub(super) description: String,
    /// `[workspace.package] repository`.
    pub(super) repository: String,
    /// The kubedev crate's `[features]`.
    pub(super) features: BTreeMap<String, Vec<String>>,
    /// Workspace members' manifests, relative to the root.
    pub(super) members: Vec<String>,
    /// The build profiles that optimize as `release` does: `release` and the workspace's
    /// profiles that inherit from it.
    pub(super) release_profiles: BTreeSet<String>,
}

/// What the chart says the image must match (its default rendering).
#[derive(Debug, Default)]
pub(super) struct Chart {
    /// The daemon container's `command` and `args`.
    pub(super) command: Vec<String>,
    pub(super) args: Vec<String>,
    /// Its port named `metrics`.
    pub(super) metrics_port: Option<u64>,
    /// Chart.yaml's appVersion: the image tag.
    pub(super) app_version: String,
}

/// The builder stage's facts the other checks use.
#[derive(Debug)]
pub(super) struct Built {
    /// The features `docker build` without `--build-arg FEATURES` compiles.
    pub(super) features: BTreeSet<String>,
    /// The runtime base, when deploy-check knows it.
    pub(super) base: Option<&'static Base>,
}

/// The kubedev crate's facts and the workspace members, from `cargo metadata`, and the
/// workspace repository from the root Cargo.toml.
pub(super) fn workspace(root: &Path, metadata: &Value) -> anyhow::Result<Workspace> {
    let packages = metadata
        .get("packages")
        .and_then(Value::as_array)
        .context("`cargo metadata` lists no packages")?;
    let kubedev = packages
        .iter()
        .find(|p| p.get("name").and_then(Value::as_str) == Some("kubedev"))
        .context("`cargo metadata` has no kubedev package")?;
    let text = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let features = kubedev
        .get("features")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let implied = v
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            (k.clone(), implied)
        })
        .collect();
    let members: BTreeSet<&str> = metadata
        .get("workspace_members")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut member_manifests = Vec::new();
    for p in packages {
        let id = p.get("id").and_then(Value::as_str).unwrap_or_default();
        if !members.contains(id) {
            continue;
        }
        let manifest = Path::new(
            p.get("manifest_path")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
        let relative = manifest
            .strip_prefix(root)
            .with_context(|| format!("{} lies outside {}", manifest.display(), root.display()))?;
        member_manifests.push(relative.display().to_string());
    }
    member_manifests.sort();
    let cargo_toml = root.join("Cargo.toml");
    let manifest = std::fs::read_to_string(&cargo_toml)
        .with_context(|| format!("reading {}", cargo_toml.display()))?;
    Ok(Workspace {
        rust_version: text(kubedev, "rust_version"),
        version: text(kubedev, "version"),
        license: text(kubedev, "license"),
        description: text(kubedev, "description"),
        repository: workspace_package_key(&manifest, "repository").unwrap_or_default(),
        features,
        members: member_manifests,
        release_profiles: release_profiles(&manifest),
    })
}

/// `release` and every profile of the workspace manifest that inherits from it, directly or
/// through another such profile.
pub(super) fn release_profiles(manifest: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::from(["release".to_string()]);
    let Ok(manifest) = manifest.parse::<toml::Table>() else {
        return out;
    };
    let Some(profiles) = manifest.get("profile").and_then(|p| p.as_table()) else {
        return out;
    };
    loop {
        let before = out.len();
        for (name, table) in profiles {
            if table
                .get("inherits")
                .and_then(|i| i.as_str())
                .is_some_and(|parent| out.contains(parent))
            {
                out.insert(name.clone());
            }
        }
        if out.len() == before {
            return out;
        }
    }
}

/// A string `key` of the `[workspace.package]` table (which `cargo metadata` does not report
/// when a crate does not inherit it); `None` when the manifest is not TOML or has no such
/// string.
pub(super) fn workspace_package_key(manifest: &str, key: &str) -> Option<String> {
    let manifest: toml::Table = manifest.parse().ok()?;
    manifest
        .get("workspace")?
        .get("package")?
        .get(key)?
        .as_str()
        .map(str::to_string)
}

/// Every image check: reads the Dockerfile, `.dockerignore`, Chart.yaml and the daemon
/// binary; `default` is the chart's default rendering's daemon container and configuration,
/// `configs` each rendering's label and configuration. Returns the problems.
pub(super) fn check(
    root: &Path,
    metadata: &Value,
    binary: &Path,
    default_container: &Value,
    configs: &[(String, Value)],
) -> anyhow::Result<Vec<String>> {
    let ws = workspace(root, metadata)?;
    let path = root.join(DOCKERFILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let df = match parse(&text) {
        Ok(df) => df,
        Err(e) => return Ok(vec![e]),
    };
    let chart = read_chart(root, default_container)?;

    let (mut problems, built) = check_dockerfile(&df, &ws, &chart);

    let ignore = root.join(DOCKERIGNORE);
    let rules = match std::fs::read_to_string(&ignore) {
        Ok(t) => parse_ignore(&t),
        Err(e) => {
            problems.push(format!("reading {}: {e}", ignore.display()));
            Vec::new()
        }
    };
    problems.extend(check_context(&df, &rules, &ws));
    let context = tempfile::tempdir().context("creating a scratch build directory")?;
    let copied = copy_context(root, &df, &rules, context.path())?;
    if copied.is_empty() {
        problems.extend(cargo_loads(context.path()));
    }
    problems.extend(copied);

    let mut needs = Vec::new();
    for (label, config) in configs {
        match needed_features(config) {
            Ok(n) => needs.extend(n.into_iter().map(|(s, f)| (label.clone(), s, f))),
            Err(e) => problems.push(format!("{label}: {e}")),
        }
    }
    if let Some(built) = &built {
        problems.extend(check_features(&built.features, &needs));
        if let Some(base) = built.base {
            problems.extend(check_binary_libraries(base, binary)?);
        }
    }
    Ok(problems)
}

/// What the chart says the image must match: the default rendering's daemon container
/// (`default_container`) and Chart.yaml's appVersion.
fn read_chart(root: &Path, default_container: &Value) -> anyhow::Result<Chart> {
    let chart_yaml = root.join(super::CHART).join("Chart.yaml");
    let chart_meta: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(&chart_yaml)
            .with_context(|| format!("reading {}", chart_yaml.display()))?,
    )
    .with_context(|| format!("{} is not YAML", chart_yaml.display()))?;
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    };
    Ok(Chart {
        command: strings(default_container.get("command")),
        args: strings(default_container.get("args")),
        metrics_port: default_container
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str) == Some("metrics"))
            .and_then(|p| p.get("containerPort"))
            .and_then(Value::as_u64),
        app_version: match chart_meta.get("appVersion") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        },
    })
}

/// The libraries and the loader the daemon `binary`'s ELF headers name, against the runtime
/// `base`.
fn check_binary_libraries(base: &Base, binary: &Path) -> anyhow::Result<Vec<String>> {
    let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let linkage = linkage(&bytes)
        .with_context(|| format!("reading the ELF headers of {}", binary.display()))?;
    Ok(check_libraries(
        base,
        &binary.display().to_string(),
        &linkage,
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
