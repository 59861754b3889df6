//! The upstream components, built from the Go modules under `tools/cluster/` into a cache
//! outside the clone, keyed by each module's directory name (which holds its version) and a
//! hash of what the build reads of ours (go.mod, go.sum, the linker flags).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, bail, ensure};
use sha2::{Digest as _, Sha256};

/// The Kubernetes release CI runs: the newest GA release the module proxy serves.
pub(crate) const DEFAULT_KUBERNETES: &str = "1.37.2";

/// etcd, at the release line Kubernetes 1.37 runs on.
const ETCD_MODULE: &str = "etcd-v3.7.3";

/// containerd 2 (CDI on by default), its runc shim and ctr.
const CONTAINERD_MODULE: &str = "containerd-v2.4.2";

/// The CNI plugins the node's pods get their network from: loopback, bridge and host-local.
const CNI_MODULE: &str = "cni-plugins-v1.10.0";

/// The binaries of one cluster, all in one directory each module's build writes into.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    /// Where the Kubernetes binaries are (kube-apiserver, kubectl, ...).
    pub(crate) kubernetes: PathBuf,
    /// Where etcd is.
    pub(crate) etcd: PathBuf,
    /// Where containerd, its shim and ctr are.
    pub(crate) containerd: PathBuf,
    /// Where the CNI plugins are.
    pub(crate) cni: PathBuf,
    /// The Kubernetes version they were built as (`v1.37.2`).
    pub(crate) version: String,
}

impl Binaries {
    /// The Kubernetes binary `name`.
    pub(crate) fn kube(&self, name: &str) -> PathBuf {
        self.kubernetes.join(name)
    }
}

/// The cache root: `$KUBEDEV_CLUSTER_CACHE`, else `$XDG_CACHE_HOME/kubedev/cluster`, else
/// `~/.cache/kubedev/cluster`.
pub(crate) fn cache_root() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("KUBEDEV_CLUSTER_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cache"),
    };
    Ok(base.join("kubedev").join("cluster"))
}

/// Builds (or finds in the cache) every component of a cluster at Kubernetes `version`
/// (`1.37.2`, `1.38.0-beta.0`: a directory `tools/cluster/kubernetes-v<version>` must hold its
/// module).
pub(crate) fn build_all(root: &Path, version: &str) -> anyhow::Result<Binaries> {
    let go = Command::new("go")
        .arg("version")
        .output()
        .context("`go` is not on PATH: the real-cluster tests build Kubernetes, etcd and containerd from Go modules and need the Go toolchain (1.26 or newer)")?;
    ensure!(go.status.success(), "`go version` failed");
    eprintln!("{}", String::from_utf8_lossy(&go.stdout).trim());
    let version = version.trim_start_matches('v');
    let kube_dir = format!("kubernetes-v{version}");
    ensure!(
        root.join("tools/cluster")
            .join(&kube_dir)
            .join("go.mod")
            .exists(),
        "no Go module for Kubernetes {version}: tools/cluster/{kube_dir}/go.mod does not exist (the versions there: {})",
        known_versions(root).join(", ")
    );
    check_kubernetes_module(root, version)?;
    let kubernetes = build_module(root, &kube_dir, &kube_ldflags(version)?, "")?;
    let etcd = build_module(root, ETCD_MODULE, "-s -w", "")?;
    let containerd = build_module(
        root,
        CONTAINERD_MODULE,
        "-s -w",
        "no_btrfs,no_zfs,no_devmapper",
    )?;
    let cni = build_module(root, CNI_MODULE, "-s -w", "")?;
    Ok(Binaries {
        kubernetes,
        etcd,
        containerd,
        cni,
        version: format!("v{version}"),
    })
}

/// Runs the Go tests of kubedev's own modules under `tools/cluster/` (those with a test file),
/// which release modules build in with replace directives.
pub(crate) fn test_own_modules(root: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(root.join("tools/cluster")).context("reading tools/cluster")? {
        let module = entry?.path();
        let has_tests = module.join("go.mod").exists()
            && files_under(&module)?
                .iter()
                .any(|f| f.to_string_lossy().ends_with("_test.go"));
        if !has_tests {
            continue;
        }
        let output = Command::new("go")
            .args(["test", "-count=1", "./..."])
            .current_dir(&module)
            .env("GOTOOLCHAIN", go_toolchain(&module)?)
            .env("GOFLAGS", "-mod=readonly -buildvcs=false")
            .output()
            .context("starting go test")?;
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        ensure!(
            output.status.success(),
            "the Go tests of {} failed ({}):\n{printed}",
            module.display(),
            output.status
        );
        eprint!("{printed}");
    }
    Ok(())
}

/// The `GOTOOLCHAIN` for the Go module in `module`: a module that names a newer Go than the
/// machine's (`toolchain go1.27.3`) gets it from the module proxy, since the machine's
/// GOTOOLCHAIN may say `local`; `auto` otherwise.
pub(super) fn go_toolchain(module: &Path) -> anyhow::Result<String> {
    Ok(crate::gomod::toolchain(&read_go_mod(module)?)
        .unwrap_or("auto")
        .to_string())
}

/// Fails unless `tools/cluster/kubernetes-v<version>` requires `k8s.io/kubernetes` at that
/// version and pins every staging module to the matching one: the binaries take their
/// version from the directory's name, so a module left at another release would report the
/// wrong one.
fn check_kubernetes_module(root: &Path, version: &str) -> anyhow::Result<()> {
    let module = root.join(format!("tools/cluster/kubernetes-v{version}"));
    let go_mod = read_go_mod(&module)?;
    let what = format!("tools/cluster/kubernetes-v{version}/go.mod");
    ensure!(
        crate::gomod::required(&go_mod, "k8s.io/kubernetes").is_some(),
        "{what} does not require k8s.io/kubernetes"
    );
    crate::gomod::check_release(&go_mod, &what, version, &[])
}

/// The go.mod of the Go module in `module`.
fn read_go_mod(module: &Path) -> anyhow::Result<String> {
    let path = module.join("go.mod");
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// The Kubernetes versions with a module under tools/cluster.
pub(crate) fn known_versions(root: &Path) -> Vec<String> {
    let mut versions: Vec<String> = std::fs::read_dir(root.join("tools/cluster"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("kubernetes-v"))
                .map(str::to_string)
        })
        .collect();
    versions.sort();
    versions
}

/// The linker flags upstream's build sets (`hack/lib/version.sh`), so `/version` and every
/// component report the release.
fn kube_ldflags(version: &str) -> anyhow::Result<String> {
    let mut parts = version.split(['.', '-']);
    let major = parts.next().context("a version like 1.37.2")?;
    let minor = parts.next().context("a version like 1.37.2")?;
    let mut flags = String::from("-s -w");
    for package in [
        "k8s.io/client-go/pkg/version",
        "k8s.io/component-base/version",
    ] {
        for (key, value) in [
            ("gitVersion", format!("v{version}")),
            ("gitMajor", major.to_string()),
            ("gitMinor", minor.to_string()),
            ("gitTreeState", "clean".to_string()),
            ("buildDate", "1970-01-01T00:00:00Z".to_string()),
        ] {
            flags.push_str(&format!(" -X {package}.{key}={value}"));
        }
    }
    Ok(flags)
}

/// Builds every `tool` of the module in `tools/cluster/<dir>` in one `go build` (shared
/// packages compile once, without cgo, with the build `tags`) into the cache, unless a build of
/// the same inputs is there; returns the directory of the binaries.
fn build_module(root: &Path, dir: &str, ldflags: &str, tags: &str) -> anyhow::Result<PathBuf> {
    let module = root.join("tools/cluster").join(dir);
    let mut hash = Sha256::new();
    for file in ["go.mod", "go.sum"] {
        let path = module.join(file);
        hash.update(std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?);
    }
    // A module of ours that a replace directive puts in place of an upstream one is built in
    // too: its files are inputs like go.mod.
    for local in local_replacements(&module)? {
        for path in files_under(&local)? {
            hash.update(
                path.strip_prefix(&local)
                    .unwrap_or(&path)
                    .to_string_lossy()
                    .as_bytes(),
            );
            hash.update(
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
            );
        }
    }
    hash.update(ldflags.as_bytes());
    hash.update(tags.as_bytes());
    let key: String = hash
        .finalize()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    let out = cache_root()?.join(format!("{dir}-{key}"));
    let done = out.join(".built");
    if done.exists() {
        eprintln!("{dir}: cached in {}", out.display());
        return Ok(out);
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    eprintln!(
        "{dir}: building into {} (minutes on a cold machine)",
        out.display()
    );
    let started = Instant::now();
    let toolchain = go_toolchain(&module)?;
    let mut out_arg = out.clone().into_os_string();
    out_arg.push("/");
    let output = Command::new("go")
        .args([
            "build",
            "-trimpath",
            "-tags",
            tags,
            "-ldflags",
            ldflags,
            "-o",
        ])
        .arg(&out_arg)
        .arg("tool")
        .current_dir(&module)
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", &toolchain)
        // The module's go.sum is the truth: never let a build rewrite it.
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .output()
        .context("starting go build")?;
    // What go printed but the hundreds of `go: downloading` lines of a cold module cache.
    let printed: Vec<String> = String::from_utf8_lossy(&output.stderr)
        .lines()
        .chain(String::from_utf8_lossy(&output.stdout).lines())
        .filter(|l| !l.starts_with("go: downloading "))
        .map(str::to_string)
        .collect();
    if !output.status.success() {
        bail!(
            "building {dir} failed ({}); its module is tools/cluster/{dir}:\n{}",
            output.status,
            printed.join("\n")
        );
    }
    for line in printed {
        eprintln!("{line}");
    }
    std::fs::write(&done, b"").context("marking the build done")?;
    eprintln!("{dir}: built in {:.0?}", started.elapsed());
    Ok(out)
}

/// The directories the module's replace directives point at (`=> ../dir`), which are modules
/// of ours built into its binaries.
fn local_replacements(module: &Path) -> anyhow::Result<Vec<PathBuf>> {
    Ok(read_go_mod(module)?
        .lines()
        .filter_map(|l| l.split_once("=>"))
        .map(|(_, target)| target.trim())
        .filter(|t| t.starts_with("./") || t.starts_with("../"))
        .map(|t| module.join(t))
        .collect())
}

/// Every file under `dir`, in a fixed order.
fn files_under(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every Kubernetes module under tools/cluster builds the release its directory names, and
    /// the default release has one (a release day that copies a candidate's module without
    /// moving its versions fails here, before a build of many minutes).
    #[test]
    fn each_kubernetes_module_is_its_release() -> anyhow::Result<()> {
        let root = crate::commands::workspace_root()?;
        let versions = known_versions(&root);
        assert!(
            versions.iter().any(|v| v == DEFAULT_KUBERNETES),
            "no module for the default release {DEFAULT_KUBERNETES} among {versions:?}"
        );
        for version in versions {
            check_kubernetes_module(&root, &version)?;
        }
        Ok(())
    }
}
