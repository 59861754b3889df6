//! Container images made here, since none can be pulled: a root file system in a directory,
//! written as a one-layer OCI image archive that `ctr images import` takes.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::json;
use sha2::{Digest as _, Sha256};

/// The sandbox (pause) image the runtime starts every pod with.
pub(crate) const PAUSE: &str = "kubedev.local/pause:1";
/// A busybox image for test pods.
pub(crate) const BUSYBOX: &str = "kubedev.local/busybox:1";
/// kubedev's own image repository; the tag is the crate's version.
pub(crate) const KUBEDEV_REPOSITORY: &str = "kubedev.local/kubedev";

/// The environment kubedev's image gives the daemon, as `deploy/Dockerfile` does (deploy-check
/// holds the two the same): one malloc arena.
pub(crate) const KUBEDEV_ENV: &[(&str, &str)] = &[("MALLOC_ARENA_MAX", "1")];

/// One image to write: its name, root file system, command and environment (beside `PATH`).
pub(crate) struct Image<'a> {
    pub(crate) name: &'a str,
    pub(crate) rootfs: &'a Path,
    pub(crate) entrypoint: &'a [&'a str],
    pub(crate) env: &'a [(&'a str, &'a str)],
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes `blob` under `layout/blobs/sha256/`, returning its descriptor fields.
fn put_blob(layout: &Path, blob: &[u8]) -> anyhow::Result<(String, usize)> {
    let hex = sha256_hex(blob);
    let path = layout.join("blobs/sha256").join(&hex);
    std::fs::write(&path, blob).with_context(|| format!("writing {}", path.display()))?;
    Ok((format!("sha256:{hex}"), blob.len()))
}

/// Writes `image` as an OCI image archive (`oci-layout`, `index.json`, one uncompressed layer)
/// at `out`, in `work` (a scratch directory).
pub(crate) fn write_archive(image: &Image<'_>, work: &Path, out: &Path) -> anyhow::Result<()> {
    let layout = work.join("layout");
    if layout.exists() {
        std::fs::remove_dir_all(&layout)?;
    }
    std::fs::create_dir_all(layout.join("blobs/sha256"))?;
    let layer_tar = work.join("layer.tar");
    tar(
        &[
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
            "-C",
        ],
        image.rootfs,
        &layer_tar,
    )?;
    let layer = std::fs::read(&layer_tar)?;
    let (layer_digest, layer_size) = put_blob(&layout, &layer)?;
    let env: Vec<String> =
        std::iter::once("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into())
            .chain(image.env.iter().map(|(k, v)| format!("{k}={v}")))
            .collect();
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": image.entrypoint,
            "Env": env,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }))?;
    let (config_digest, config_size) = put_blob(&layout, &config)?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer_size,
        }],
    }))?;
    let (manifest_digest, manifest_size) = put_blob(&layout, &manifest)?;
    let tag = image.name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest_size,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "io.containerd.image.name": image.name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }))?;
    std::fs::write(layout.join("index.json"), index)?;
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    tar(&["-C"], &layout, out)
}

/// `tar -cf out <opts> dir .`.
fn tar(opts: &[&str], dir: &Path, out: &Path) -> anyhow::Result<()> {
    let status = Command::new("tar")
        .arg("-cf")
        .arg(out)
        .args(opts)
        .arg(dir)
        .arg(".")
        .status()
        .context("running tar")?;
    if !status.success() {
        bail!("tar of {} failed ({status})", dir.display());
    }
    Ok(())
}

/// Copies `file` into `rootfs` at `dest` (a path inside the image), making its directories.
pub(crate) fn install(rootfs: &Path, file: &Path, dest: &str, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let target = rootfs.join(dest.trim_start_matches('/'));
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(file, &target)
        .with_context(|| format!("copying {} into the image", file.display()))?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// The shared libraries `binary` loads (as `ldd` resolves them on this machine), each with the
/// path it has here, which is where the image puts it too.
pub(crate) fn shared_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() && !text.contains("statically linked") {
        bail!("ldd {} failed", binary.display());
    }
    Ok(text
        .lines()
        .filter_map(|line| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux... (0x...)"
            let path = line
                .split("=>")
                .nth(1)
                .unwrap_or(line)
                .split_whitespace()
                .next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}
