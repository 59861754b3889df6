//! kubedev's images and its installation: the sandbox, busybox and kubedev images written as
//! archives for containerd, and the Helm chart installed with the values of a one-node cluster.

use super::*;

/// The kubedev image's tag: the crate's version.
pub(super) fn kubedev_tag(root: &Path) -> anyhow::Result<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let doc: toml::Table = toml::from_str(&manifest)?;
    doc.get("workspace")
        .and_then(|w| w.get("package"))
        .and_then(|p| p.get("version"))
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .context("workspace.package.version in Cargo.toml")
}

/// Builds kubedev's release binary and writes the sandbox, busybox and kubedev image archives
/// under `target/cluster-images/`.
pub(crate) fn build_images(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    crate::commands::ensure_debian_packages(
        "the real cluster's test image (busybox-static)",
        &["busybox-static"],
    )?;
    let dir = crate::commands::target_dir(root).join("cluster-images");
    std::fs::create_dir_all(&dir)?;
    let work = tempfile::tempdir()?;

    // The sandbox: our own pause, static.
    let pause_root = work.path().join("pause");
    std::fs::create_dir_all(&pause_root)?;
    let pause_bin = work.path().join("pause-bin");
    crate::commands::run(
        root,
        "cc",
        &[
            "-static",
            "-O2",
            "-Wall",
            "-Werror",
            "-o",
            &pause_bin.display().to_string(),
            "tools/cluster/pause/pause.c",
        ],
    )?;
    image::install(&pause_root, &pause_bin, "/pause", 0o755)?;
    let pause = dir.join("pause.tar");
    image::write_archive(
        &Image {
            name: image::PAUSE,
            rootfs: &pause_root,
            entrypoint: &["/pause"],
            env: &[],
        },
        work.path(),
        &pause,
    )?;

    // busybox, with its applets linked.
    let bb_root = work.path().join("busybox");
    image::install(&bb_root, Path::new("/bin/busybox"), "/bin/busybox", 0o755)?;
    let list = Command::new("/bin/busybox").arg("--list").output()?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", bb_root.join("bin").join(applet))?;
        }
    }
    std::fs::create_dir_all(bb_root.join("tmp"))?;
    let busybox = dir.join("busybox.tar");
    image::write_archive(
        &Image {
            name: image::BUSYBOX,
            rootfs: &bb_root,
            entrypoint: &["/bin/sh"],
            env: &[],
        },
        work.path(),
        &busybox,
    )?;

    // kubedev: the release binary and the libraries it loads, as the Dockerfile's image has.
    crate::commands::run(
        root,
        "cargo",
        &["build", "--release", "-p", "kubedev", "--bin", "kubedev"],
    )?;
    let binary = crate::commands::target_dir(root).join("release/kubedev");
    let kd_root = work.path().join("kubedev");
    image::install(&kd_root, &binary, "/usr/local/bin/kubedev", 0o755)?;
    for lib in image::shared_libraries(&binary)? {
        image::install(&kd_root, &lib, &lib.display().to_string(), 0o755)?;
    }
    std::fs::create_dir_all(kd_root.join("tmp"))?;
    let name = format!("{}:{}", image::KUBEDEV_REPOSITORY, kubedev_tag(root)?);
    let kubedev = dir.join("kubedev.tar");
    image::write_archive(
        &Image {
            name: &name,
            rootfs: &kd_root,
            entrypoint: &["/usr/local/bin/kubedev"],
            env: image::KUBEDEV_ENV,
        },
        work.path(),
        &kubedev,
    )?;
    Ok(vec![pause, busybox, kubedev])
}

/// The chart's values for this cluster: DRA and the device plugin from one daemon, the static
/// backend with four host device nodes (one served through the device-plugin API), the local
/// image, and the API server at the host's address on the pods' bridge (no Service proxy runs).
/// The rest is the chart's defaults: the pod's own network, the metrics port on it, and a
/// rolling update that starts the new daemon beside the old one.
pub(super) fn values(root: &Path) -> anyhow::Result<String> {
    let mut devices = String::new();
    for name in DEVICES {
        let model = if name == "test-dp" { "dp" } else { "x1" };
        devices.push_str(&format!(
            "      - name: {name}\n        attributes: {{model: {{string: {model}}}}}\n        deviceNodes: [\"{node}\"]\n        env: {{KUBEDEV_TEST_DEVICE: {name}}}\n        presencePath: {node}\n",
            node = device_node(name),
        ));
    }
    Ok(format!(
        r#"image:
  repository: {repo}
  tag: "{tag}"
  pullPolicy: Never
apiServer:
  host: {api}
  port: "6443"
logLevel: info
devicePlugin:
  enabled: true
  resources:
    - name: {DP_RESOURCE}
      selector:
        attributes:
          model: {{string: dp}}
dra:
  enabled: true
  driverName: {DRIVER}
  deviceMetadata: true
  deviceClasses:
    - name: {EXTENDED_CLASS}
      cel: 'device.attributes["{DRIVER}"].model == "x1"'
      extendedResourceName: {EXTENDED_RESOURCE}
backends:
  host:
    enabled: false
  static:
    enabled: true
    pool: static
    devices:
{devices}"#,
        repo = image::KUBEDEV_REPOSITORY,
        tag = kubedev_tag(root)?,
        api = network::HOST,
    ))
}

/// Makes the host's device nodes, then installs the chart with Helm and waits for the
/// daemon's pod to be ready.
pub(crate) fn install_kubedev(root: &Path, node: &Node, helm: &Path) -> anyhow::Result<()> {
    for name in DEVICES {
        make_device_node(&device_node(name))?;
    }
    let values_file = node.logs.join("kubedev-values.yaml");
    std::fs::write(&values_file, values(root)?)?;
    let out = node
        .client(helm)
        .args(["install", "kubedev"])
        .arg(root.join("deploy/helm/kubedev"))
        .args(["--namespace", KUBEDEV_NAMESPACE, "--create-namespace"])
        .arg("--values")
        .arg(&values_file)
        .output()
        .context("running helm install")?;
    ensure!(
        out.status.success(),
        "helm install failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    daemon_ready(node)
}

/// `helm upgrade` of the installed chart with its values and `sets` (`key=value`) on top.
pub(super) fn upgrade_kubedev(root: &Path, node: &Node, sets: &[&str]) -> anyhow::Result<()> {
    let helm = crate::deploy::helm::binary(root)?;
    let mut command = node.client(helm);
    command
        .args(["upgrade", "kubedev"])
        .arg(root.join("deploy/helm/kubedev"))
        .args(["--namespace", KUBEDEV_NAMESPACE, "--reuse-values"]);
    for set in sets {
        command.args(["--set", set]);
    }
    let out = command.output().context("running helm upgrade")?;
    ensure!(
        out.status.success(),
        "helm upgrade --set {} failed: {}",
        sets.join(","),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
