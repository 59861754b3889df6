//! What the real cluster must show: kubedev installed by its chart, a pod given a DRA device by
//! the real scheduler, kubelet and containerd, a claim that cannot fit explained as the
//! scheduler explains it, the device-plugin resource from the same daemon, and no connection
//! off loopback. Each test asserts what a user sees: `kubectl` output and the container's own.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use super::image::{self, Image};
use super::node::{Node, wait_for};
use super::pki;

/// The namespace kubedev is installed in, and the release's name.
const KUBEDEV_NAMESPACE: &str = "kubedev";
/// The DRA driver name the chart is installed with.
const DRIVER: &str = "devices.kubedev.io";
/// The DeviceClass the chart creates for the static backend.
const CLASS: &str = "static.devices.kubedev.io";
/// The extended resource served through the device-plugin API.
const DP_RESOURCE: &str = "devices.kubedev.io/example";
/// The DeviceClass the daemon applies itself, naming an extended resource (KEP-5004).
const EXTENDED_CLASS: &str = "x1.devices.kubedev.io";
/// The extended resource that class serves through DRA.
const EXTENDED_RESOURCE: &str = "devices.kubedev.io/x1";
/// The namespace of the test pods.
const TEST_NAMESPACE: &str = "kubedev-test";
/// Device nodes on the host the static backend offers (character devices like /dev/null).
const DEVICES: [&str; 4] = ["test-0", "test-1", "test-2", "test-dp"];

/// A device node on the host for device `name`.
fn device_node(name: &str) -> String {
    format!("/dev/kubedev-{name}")
}

/// The kubedev image's tag: the crate's version.
fn kubedev_tag(root: &Path) -> anyhow::Result<String> {
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
pub(super) fn build_images(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    crate::ci::ensure_debian_packages(
        "the real cluster's test image (busybox-static)",
        &["busybox-static"],
    )?;
    let dir = crate::ci::target_dir(root).join("cluster-images");
    std::fs::create_dir_all(&dir)?;
    let work = tempfile::tempdir()?;

    // The sandbox: our own pause, static.
    let pause_root = work.path().join("pause");
    std::fs::create_dir_all(&pause_root)?;
    let pause_bin = work.path().join("pause-bin");
    crate::ci::run(
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
        },
        work.path(),
        &busybox,
    )?;

    // kubedev: the release binary and the libraries it loads, as the Dockerfile's image has.
    crate::ci::run(
        root,
        "cargo",
        &["build", "--release", "-p", "kubedev", "--bin", "kubedev"],
    )?;
    let binary = crate::ci::target_dir(root).join("release/kubedev");
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
        },
        work.path(),
        &kubedev,
    )?;
    Ok(vec![pause, busybox, kubedev])
}

/// The chart's values for this cluster: DRA and the device plugin from one daemon, the static
/// backend with four host device nodes (one served through the device-plugin API), the local
/// image, the node's network and the API server on loopback.
fn values(root: &Path) -> anyhow::Result<String> {
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
hostNetwork: true
updateStrategy:
  type: RollingUpdate
  rollingUpdate:
    maxSurge: 0
    maxUnavailable: 1
apiServer:
  host: 127.0.0.1
  port: "6443"
metrics:
  bindAddress: 127.0.0.1
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
    ))
}

/// Makes the host's device nodes, then installs the chart with Helm and waits for the
/// daemon's pod to be ready.
pub(super) fn install_kubedev(root: &Path, node: &Node) -> anyhow::Result<()> {
    for name in DEVICES {
        make_device_node(&device_node(name))?;
    }
    let helm = crate::deploy::helm::binary(root)?;
    let values_file = node.logs.join("kubedev-values.yaml");
    // The daemon runs in the node's network namespace, where an old and a new daemon cannot
    // both listen on the metrics port: a rolling update replaces the old one first.
    std::fs::write(&values_file, values(root)?)?;
    let out = Command::new(&helm)
        .args(["install", "kubedev"])
        .arg(root.join("deploy/helm/kubedev"))
        .args(["--namespace", KUBEDEV_NAMESPACE, "--create-namespace"])
        .arg("--values")
        .arg(&values_file)
        .env("KUBECONFIG", node.kubeconfig())
        .output()
        .context("running helm install")?;
    ensure!(
        out.status.success(),
        "helm install failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    daemon_ready(node)
}

/// Waits until kubedev's DaemonSet has its pod on the node, of the newest revision, ready
/// (`rollout status` alone passes before the controller has made a pod); on failure the
/// error holds the pods' events and the daemon's log.
fn daemon_ready(node: &Node) -> anyhow::Result<()> {
    let waited = wait_for("kubedev's daemon ready", Duration::from_secs(180), || {
        let ds = get_json(node, &["daemonset", "kubedev", "-n", KUBEDEV_NAMESPACE])?;
        let status = &ds["status"];
        let generation_seen = status["observedGeneration"] == ds["metadata"]["generation"];
        let want = status["desiredNumberScheduled"].as_i64().unwrap_or(0);
        Ok(generation_seen
            && want >= 1
            && status["updatedNumberScheduled"].as_i64() == Some(want)
            && status["numberReady"].as_i64() == Some(want)
            && status["numberAvailable"].as_i64() == Some(want)
            && status["numberUnavailable"].as_i64().unwrap_or(0) == 0
            && status["currentNumberScheduled"].as_i64() == Some(want))
    });
    if let Err(err) = waited {
        let events = node
            .kubectl_out(&["get", "events", "-n", KUBEDEV_NAMESPACE])
            .unwrap_or_default();
        let log = node
            .kubectl_out(&[
                "logs",
                "-n",
                KUBEDEV_NAMESPACE,
                "daemonset/kubedev",
                "--tail=30",
            ])
            .unwrap_or_default();
        bail!("{err:#}\nevents in {KUBEDEV_NAMESPACE}:\n{events}\nthe daemon's log:\n{log}");
    }
    Ok(())
}

/// A character device like /dev/null at `path` (made again when missing).
fn make_device_node(path: &str) -> anyhow::Result<()> {
    if Path::new(path).exists() {
        return Ok(());
    }
    let status = Command::new("mknod")
        .args(["-m", "0666", path, "c", "1", "3"])
        .status()?;
    ensure!(status.success(), "mknod {path} failed");
    Ok(())
}

/// One test: its name and body.
type Test = (&'static str, fn(&Node, &Path) -> anyhow::Result<()>);

/// Every test, in order; the connection check last.
pub(super) fn run_all(
    root: &Path,
    node: &Node,
    only: Option<&str>,
    before: &Connections,
    sampler: Sampler,
) -> anyhow::Result<()> {
    let tests: &[Test] = &[
        ("version", version),
        ("dra-end-to-end", dra_end_to_end),
        ("unfit-claim-explained", unfit_claim_explained),
        ("device-plugin", device_plugin),
        ("extended-resource-through-dra", extended_resource),
        ("health", health),
        ("restarts", restarts),
        // Last: it restarts the API server as older releases.
        ("emulated-versions", emulated_versions),
    ];
    node.kubectl_out(&["create", "namespace", TEST_NAMESPACE])?;
    let mut failed = Vec::new();
    for (name, body) in tests {
        if only.is_some_and(|o| !name.contains(o)) {
            continue;
        }
        eprintln!("\n==> cluster test: {name}");
        let started = Instant::now();
        match body(node, root) {
            Ok(()) => eprintln!("ok {name} ({:.1?})", started.elapsed()),
            Err(err) => {
                eprintln!("FAILED {name}: {err:#}");
                failed.push(*name);
            }
        }
        if let Err(err) = clean_test_namespace(node) {
            eprintln!("cleaning up after {name} failed: {err:#}");
            failed.push(*name);
        }
    }
    eprintln!("\n==> cluster test: nothing left loopback");
    if let Err(err) = only_loopback(before, &sampler.stop()) {
        eprintln!("FAILED loopback: {err:#}");
        failed.push("loopback");
    }
    ensure!(
        failed.is_empty(),
        "cluster tests failed: {}",
        failed.join(", ")
    );
    Ok(())
}

/// The API server reports the release it was built as.
fn version(node: &Node, _root: &Path) -> anyhow::Result<()> {
    let v: Value = serde_json::from_str(&node.kubectl_out(&["get", "--raw=/version"])?)?;
    ensure!(
        v["gitVersion"] == node.bins.version.as_str(),
        "/version says {}, not {}",
        v["gitVersion"],
        node.bins.version
    );
    eprintln!("  /version: {} ({})", v["gitVersion"], v["goVersion"]);
    Ok(())
}

/// `kubectl apply` of `manifest` (YAML).
fn apply(node: &Node, manifest: &str) -> anyhow::Result<()> {
    let mut child = node
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    {
        use std::io::Write as _;
        child
            .stdin
            .take()
            .context("kubectl's stdin")?
            .write_all(manifest.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "kubectl apply failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// `kubectl get <what> -o json`, parsed.
fn get_json(node: &Node, args: &[&str]) -> anyhow::Result<Value> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    Ok(serde_json::from_str(&node.kubectl_out(&all)?)?)
}

/// A busybox pod on the node's network that prints what it sees of its devices, then sleeps.
fn test_pod(name: &str, claims: &str, container_extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {TEST_NAMESPACE}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  enableServiceLinks: false
  automountServiceAccountToken: false
{claims}  containers:
    - name: main
      image: {busybox}
      imagePullPolicy: Never
      command: ["/bin/sh", "-c"]
      args:
        - |
          echo "devices: $(ls /dev | grep kubedev- | tr '\n' ' ')"
          echo "env: KUBEDEV_TEST_DEVICE=$KUBEDEV_TEST_DEVICE"
          for f in $(find /var/run/kubernetes.io -type f 2>/dev/null); do echo "metadata-file: $f"; cat "$f"; echo; done
          echo ready
          exec sleep 3600
{container_extra}"#,
        busybox = image::BUSYBOX,
    )
}

/// Waits until pod `name` is Running and its log has the line `ready`; returns the log.
fn wait_running(node: &Node, name: &str, timeout: Duration) -> anyhow::Result<String> {
    wait_for(&format!("pod {name} running"), timeout, || {
        let phase = node.kubectl_out(&[
            "get",
            "pod",
            name,
            "-n",
            TEST_NAMESPACE,
            "-o",
            "jsonpath={.status.phase}",
        ])?;
        if phase.trim() != "Running" {
            bail!("phase {}", phase.trim());
        }
        Ok(pod_log(node, name)?.lines().any(|l| l == "ready"))
    })?;
    pod_log(node, name)
}

/// What pod `name`'s container printed, as the kubelet recorded it in the container's log
/// file under /var/log/pods (what `kubectl logs` would serve: the node has no address the
/// API server could reach other than loopback, which the kubelet refuses to report).
fn pod_log(node: &Node, name: &str) -> anyhow::Result<String> {
    let uid = node.kubectl_out(&[
        "get",
        "pod",
        name,
        "-n",
        TEST_NAMESPACE,
        "-o",
        "jsonpath={.metadata.uid}",
    ])?;
    let dir = Path::new("/var/log/pods")
        .join(format!("{TEST_NAMESPACE}_{name}_{}", uid.trim()))
        .join("main");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("no container log in {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let file = files.last().context("no container log file yet")?;
    // CRI log lines: `<time> <stream> <P|F> <text>`.
    Ok(std::fs::read_to_string(file)?
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// Deletes every pod and claim the tests made, so one failed test leaves nothing that holds
/// a device for the next.
fn clean_test_namespace(node: &Node) -> anyhow::Result<()> {
    node.kubectl_out(&[
        "delete",
        "pods",
        "--all",
        "-n",
        TEST_NAMESPACE,
        "--grace-period=0",
        "--force",
        "--wait=true",
        "--timeout=60s",
    ])?;
    node.kubectl_out(&[
        "delete",
        "resourceclaims",
        "--all",
        "-n",
        TEST_NAMESPACE,
        "--wait=true",
        "--timeout=60s",
    ])?;
    Ok(())
}

/// Deletes pod `name` and waits until it is gone.
fn delete_pod(node: &Node, name: &str) -> anyhow::Result<()> {
    node.kubectl_out(&[
        "delete",
        "pod",
        name,
        "-n",
        TEST_NAMESPACE,
        "--wait=true",
        "--timeout=60s",
    ])?;
    Ok(())
}

/// The CDI spec files on the host that name `needle`.
fn cdi_files_naming(needle: &str) -> Vec<PathBuf> {
    ["/var/run/cdi", "/etc/cdi"]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains(needle)))
        .collect()
}

/// DRA end to end: a ResourceClaimTemplate of the chart's DeviceClass; the scheduler
/// allocates from kubedev's slices, the kubelet has kubedev prepare, containerd applies the
/// CDI spec; the container sees its device node, environment and metadata file; the claim's
/// status lists the device; deleting the pod unprepares the claim and removes its spec.
fn dra_end_to_end(node: &Node, _root: &Path) -> anyhow::Result<()> {
    let slices = get_json(node, &["resourceslices"])?;
    let published: BTreeSet<String> = slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["spec"]["driver"] == DRIVER)
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d["name"].as_str().map(str::to_string))
        .collect();
    eprintln!("  slices of {DRIVER}: {published:?}");
    ensure!(
        published == BTreeSet::from(["test-0".into(), "test-1".into(), "test-2".into()]),
        "kubedev's ResourceSlices hold {published:?}, not test-0..2 (test-dp is the device \
         plugin's)"
    );
    apply(
        node,
        &format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-device
  namespace: {TEST_NAMESPACE}
spec:
  spec:
    devices:
      requests:
        - name: dev
          exactly:
            deviceClassName: {CLASS}
"#
        ),
    )?;
    let claims =
        "  resourceClaims:\n    - name: dev\n      resourceClaimTemplateName: one-device\n";
    apply(
        node,
        &test_pod(
            "dra-one",
            claims,
            "      resources:\n        claims:\n          - name: dev\n",
        ),
    )?;
    let log = wait_running(node, "dra-one", Duration::from_secs(90))?;
    eprintln!("  container's output:\n{}", indent(&log));
    let pod = get_json(node, &["pod", "dra-one", "-n", TEST_NAMESPACE])?;
    let claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .context("the pod's status names no generated claim")?
        .to_string();
    let claim = get_json(node, &["resourceclaim", &claim_name, "-n", TEST_NAMESPACE])?;
    let result = &claim["status"]["allocation"]["devices"]["results"][0];
    let device = result["device"]
        .as_str()
        .context("the claim is not allocated")?;
    ensure!(
        result["driver"] == DRIVER,
        "allocated by {}",
        result["driver"]
    );
    ensure!(
        log.lines()
            .any(|l| l.starts_with("devices:") && l.contains(&format!("kubedev-{device}"))),
        "the container does not see /dev/kubedev-{device}:\n{log}"
    );
    ensure!(
        log.contains(&format!("KUBEDEV_TEST_DEVICE={device}")),
        "the container's environment lacks KUBEDEV_TEST_DEVICE={device}:\n{log}"
    );
    ensure!(
        log.lines()
            .any(|l| l.starts_with("metadata-file:") && l.contains(DRIVER)),
        "no device metadata file in the container:\n{log}"
    );
    ensure!(
        log.contains("\"DeviceMetadata\"") && log.contains(device),
        "the metadata file does not name the device:\n{log}"
    );
    let status_devices = claim["status"]["devices"]
        .as_array()
        .context("the claim's status.devices is empty")?;
    ensure!(
        status_devices
            .iter()
            .any(|d| d["device"] == device && d["driver"] == DRIVER),
        "status.devices does not list {device}: {status_devices:?}"
    );
    let wide = node.kubectl_out(&["get", "resourceclaims", "-n", TEST_NAMESPACE])?;
    eprintln!("  kubectl get resourceclaims:\n{}", indent(&wide));
    let uid = claim["metadata"]["uid"]
        .as_str()
        .context("claim uid")?
        .to_string();
    ensure!(
        !cdi_files_naming(&uid).is_empty(),
        "no CDI spec on the host names the claim {uid}"
    );
    delete_pod(node, "dra-one")?;
    wait_for(
        "the claim's CDI spec removed after the pod is gone",
        Duration::from_secs(60),
        || Ok(cdi_files_naming(&uid).is_empty()),
    )?;
    wait_for(
        "the generated claim deleted with its pod",
        Duration::from_secs(60),
        || {
            let out = node
                .kubectl()
                .args(["get", "resourceclaim", &claim_name, "-n", TEST_NAMESPACE])
                .output()?;
            Ok(!out.status.success())
        },
    )?;
    Ok(())
}

/// A claim that cannot fit (more devices than the node has) leaves its pod Pending; the
/// scheduler's event and `kubedev explain` against the live cluster give the same reason.
fn unfit_claim_explained(node: &Node, root: &Path) -> anyhow::Result<()> {
    apply(
        node,
        &format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: too-many
  namespace: {TEST_NAMESPACE}
spec:
  devices:
    requests:
      - name: dev
        exactly:
          deviceClassName: {CLASS}
          allocationMode: ExactCount
          count: 5
"#
        ),
    )?;
    let claims = "  resourceClaims:\n    - name: dev\n      resourceClaimName: too-many\n";
    apply(
        node,
        &test_pod(
            "unfit",
            claims,
            "      resources:\n        claims:\n          - name: dev\n",
        ),
    )?;
    let mut message = String::new();
    wait_for("a FailedScheduling event", Duration::from_secs(60), || {
        let events = get_json(
            node,
            &[
                "events",
                "-n",
                TEST_NAMESPACE,
                "--field-selector",
                "involvedObject.name=unfit,reason=FailedScheduling",
            ],
        )?;
        if let Some(m) = events["items"][0]["message"].as_str() {
            message = m.to_string();
            return Ok(true);
        }
        Ok(false)
    })?;
    eprintln!("  scheduler's event: {message}");
    let phase = node.kubectl_out(&[
        "get",
        "pod",
        "unfit",
        "-n",
        TEST_NAMESPACE,
        "-o",
        "jsonpath={.status.phase}",
    ])?;
    ensure!(phase.trim() == "Pending", "the pod is {phase}, not Pending");
    ensure!(
        message.contains("cannot allocate all claims"),
        "the scheduler's message does not say the claim cannot be allocated: {message}"
    );
    let kubedev = crate::ci::target_dir(root).join("release/kubedev");
    let out = Command::new(&kubedev)
        .args([
            "explain",
            "--details",
            "--pod",
            &format!("{TEST_NAMESPACE}/unfit"),
        ])
        .env("KUBECONFIG", node.kubeconfig())
        .output()
        .context("running kubedev explain")?;
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "  kubedev explain --pod {TEST_NAMESPACE}/unfit:\n{}",
        indent(&text)
    );
    ensure!(
        out.status.success(),
        "kubedev explain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        text.contains(pki::NODE),
        "kubedev explain does not name the node {}",
        pki::NODE
    );
    // The scheduler says the node cannot allocate all claims; kubedev must say the same of
    // the same node, and why: the request wants 5 devices where 3 can be used.
    ensure!(
        text.contains("0 of 1 nodes can take")
            && text.contains(&format!("claim {TEST_NAMESPACE}/too-many request dev"))
            && text.contains("5 wanted"),
        "kubedev explain does not say that the node cannot take the claim's 5 devices \
         (the scheduler: {message})"
    );
    node.kubectl_out(&[
        "delete",
        "pod",
        "unfit",
        "-n",
        TEST_NAMESPACE,
        "--wait=false",
    ])?;
    node.kubectl_out(&["delete", "resourceclaim", "too-many", "-n", TEST_NAMESPACE])?;
    Ok(())
}

/// The device-plugin resource from the same daemon: on the Node's capacity and allocatable; a
/// pod that requests it gets its device; the device is in no ResourceSlice.
fn device_plugin(node: &Node, _root: &Path) -> anyhow::Result<()> {
    let jsonpath = format!(
        "jsonpath={{.status.allocatable['{}']}}",
        DP_RESOURCE.replace('.', "\\.")
    );
    wait_for(
        "the device-plugin resource on the Node",
        Duration::from_secs(60),
        || {
            Ok(node
                .kubectl_out(&["get", "node", pki::NODE, "-o", &jsonpath])?
                .trim()
                == "1")
        },
    )?;
    let res = format!("      resources:\n        limits:\n          {DP_RESOURCE}: 1\n");
    apply(node, &test_pod("dp-one", "", &res))?;
    let log = wait_running(node, "dp-one", Duration::from_secs(60))?;
    eprintln!("  container's output:\n{}", indent(&log));
    ensure!(
        log.lines()
            .any(|l| l.starts_with("devices:") && l.contains("kubedev-test-dp")),
        "the container does not see /dev/kubedev-test-dp:\n{log}"
    );
    ensure!(
        log.contains("KUBEDEV_TEST_DEVICE=test-dp"),
        "the container's environment lacks KUBEDEV_TEST_DEVICE=test-dp:\n{log}"
    );
    let slices = node.kubectl_out(&["get", "resourceslices", "-o", "json"])?;
    ensure!(
        !slices.contains("\"test-dp\""),
        "the device-plugin device is also in a ResourceSlice"
    );
    delete_pod(node, "dp-one")
}

/// Applies the ResourceClaimTemplate `one-device` (idempotent).
fn one_device_template(node: &Node) -> anyhow::Result<()> {
    apply(
        node,
        &format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-device
  namespace: {TEST_NAMESPACE}
spec:
  spec:
    devices:
      requests:
        - name: dev
          exactly:
            deviceClassName: {CLASS}
"#
        ),
    )
}

/// Starts a pod `name` with a claim from the template `one-device`; waits until it runs and
/// returns its log.
fn dra_pod(node: &Node, name: &str) -> anyhow::Result<String> {
    one_device_template(node)?;
    let claims =
        "  resourceClaims:\n    - name: dev\n      resourceClaimTemplateName: one-device\n";
    apply(
        node,
        &test_pod(
            name,
            claims,
            "      resources:\n        claims:\n          - name: dev\n",
        ),
    )?;
    wait_running(node, name, Duration::from_secs(90))
}

/// The taints kubedev's slices put on device `device`: (key, effect) pairs.
fn device_taints(node: &Node, device: &str) -> anyhow::Result<Vec<(String, String)>> {
    let slices = get_json(node, &["resourceslices"])?;
    Ok(slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["spec"]["driver"] == DRIVER)
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter(|d| d["name"] == device)
        .flat_map(|d| d["taints"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            (
                t["key"].as_str().unwrap_or_default().to_string(),
                t["effect"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// The Node's allocatable count of the device-plugin resource.
fn dp_allocatable(node: &Node) -> anyhow::Result<String> {
    let jsonpath = format!(
        "jsonpath={{.status.allocatable['{}']}}",
        DP_RESOURCE.replace('.', "\\.")
    );
    Ok(node
        .kubectl_out(&["get", "node", pki::NODE, "-o", &jsonpath])?
        .trim()
        .to_string())
}

/// A device made unhealthy on the host (its presence file removed) becomes a device taint
/// the scheduler honours: a claim for every DRA device stays Pending until the device
/// recovers, then its pod runs; the device-plugin device leaves allocatable and comes back.
fn health(node: &Node, _root: &Path) -> anyhow::Result<()> {
    let sick = device_node("test-1");
    std::fs::remove_file(&sick).with_context(|| format!("removing {sick}"))?;
    let dp = device_node("test-dp");
    std::fs::remove_file(&dp).with_context(|| format!("removing {dp}"))?;
    let outcome = (|| -> anyhow::Result<()> {
        wait_for("a taint on test-1", Duration::from_secs(60), || {
            Ok(!device_taints(node, "test-1")?.is_empty())
        })?;
        let taints = device_taints(node, "test-1")?;
        eprintln!("  test-1's taints in kubedev's slice: {taints:?}");
        ensure!(
            taints
                .iter()
                .any(|(k, _)| k == &format!("{DRIVER}/unhealthy")),
            "the taint is not {DRIVER}/unhealthy: {taints:?}"
        );
        wait_for(
            "the device-plugin device out of allocatable",
            Duration::from_secs(60),
            || Ok(dp_allocatable(node)? == "0"),
        )?;
        eprintln!("  allocatable {DP_RESOURCE}: 0 while its device is missing");
        apply(
            node,
            &format!(
                r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: all-three
  namespace: {TEST_NAMESPACE}
spec:
  devices:
    requests:
      - name: dev
        exactly:
          deviceClassName: {CLASS}
          allocationMode: ExactCount
          count: 3
"#
            ),
        )?;
        let claims = "  resourceClaims:\n    - name: dev\n      resourceClaimName: all-three\n";
        apply(
            node,
            &test_pod(
                "needs-three",
                claims,
                "      resources:\n        claims:\n          - name: dev\n",
            ),
        )?;
        // The scheduler must have tried and refused: an event, and still Pending.
        wait_for(
            "the scheduler refusing the tainted device",
            Duration::from_secs(60),
            || {
                let events = get_json(
                    node,
                    &[
                        "events",
                        "-n",
                        TEST_NAMESPACE,
                        "--field-selector",
                        "involvedObject.name=needs-three,reason=FailedScheduling",
                    ],
                )?;
                Ok(events["items"].as_array().is_some_and(|a| !a.is_empty()))
            },
        )?;
        let phase = node.kubectl_out(&[
            "get",
            "pod",
            "needs-three",
            "-n",
            TEST_NAMESPACE,
            "-o",
            "jsonpath={.status.phase}",
        ])?;
        ensure!(
            phase.trim() == "Pending",
            "needs-three is {phase} while test-1 is tainted"
        );
        Ok(())
    })();
    make_device_node(&sick)?;
    make_device_node(&dp)?;
    outcome?;
    wait_for("test-1's taint removed", Duration::from_secs(60), || {
        Ok(device_taints(node, "test-1")?.is_empty())
    })?;
    let log = wait_running(node, "needs-three", Duration::from_secs(120))?;
    ensure!(
        log.contains("kubedev-test-1"),
        "the recovered device is not in the pod:\n{log}"
    );
    wait_for(
        "the device-plugin device back in allocatable",
        Duration::from_secs(60),
        || Ok(dp_allocatable(node)? == "1"),
    )?;
    eprintln!("  recovered: taint gone, needs-three runs with test-1, allocatable back to 1");
    delete_pod(node, "needs-three")?;
    node.kubectl_out(&["delete", "resourceclaim", "all-three", "-n", TEST_NAMESPACE])?;
    Ok(())
}

/// The container ID and restart count of pod `name`'s container.
fn container_identity(node: &Node, name: &str) -> anyhow::Result<String> {
    node.kubectl_out(&[
        "get",
        "pod",
        name,
        "-n",
        TEST_NAMESPACE,
        "-o",
        "jsonpath={.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}",
    ])
}

/// Restarts: the kubelet, containerd and a kubedev rollout, each with a pod holding a claim
/// running through it: the pod is unharmed, a new pod with a claim and one with the
/// device-plugin resource start afterwards, and the held claim is unprepared by whichever
/// daemon runs when its pod goes.
fn restarts(node: &Node, _root: &Path) -> anyhow::Result<()> {
    dra_pod(node, "holder")?;
    let holder = container_identity(node, "holder")?;
    let claim = get_json(node, &["pod", "holder", "-n", TEST_NAMESPACE])?["status"]
        ["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .context("holder's claim")?
        .to_string();
    let uid = get_json(node, &["resourceclaim", &claim, "-n", TEST_NAMESPACE])?["metadata"]["uid"]
        .as_str()
        .context("claim uid")?
        .to_string();

    for (step, component) in [("kubelet", "kubelet"), ("containerd", "containerd")] {
        eprintln!("  restarting {step}");
        node.restart(component)?;
        wait_for("the node Ready again", Duration::from_secs(120), || {
            let ready = node.kubectl_out(&[
                "get",
                "node",
                pki::NODE,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])?;
            Ok(ready.trim() == "True")
        })?;
        wait_for(
            &format!("the device-plugin resource registered again after the {step} restart"),
            Duration::from_secs(60),
            || Ok(dp_allocatable(node)? == "1"),
        )?;
        let after = format!("after-{step}");
        dra_pod(node, &after)
            .with_context(|| format!("a pod with a claim after the {step} restart"))?;
        delete_pod(node, &after)?;
        ensure!(
            container_identity(node, "holder")? == holder,
            "the running pod's container changed over the {step} restart"
        );
    }

    eprintln!("  rolling kubedev's DaemonSet");
    node.kubectl_out(&[
        "rollout",
        "restart",
        "daemonset/kubedev",
        "-n",
        KUBEDEV_NAMESPACE,
    ])?;
    daemon_ready(node)?;
    ensure!(
        container_identity(node, "holder")? == holder,
        "the running pod's container changed over kubedev's rollout"
    );
    ensure!(
        !cdi_files_naming(&uid).is_empty(),
        "the held claim's CDI spec is gone after the rollout"
    );
    dra_pod(node, "after-rollout").context("a pod with a claim after kubedev's rollout")?;
    delete_pod(node, "after-rollout")?;
    delete_pod(node, "holder")?;
    wait_for(
        "the held claim unprepared by the new daemon",
        Duration::from_secs(60),
        || Ok(cdi_files_naming(&uid).is_empty()),
    )?;
    Ok(())
}

/// An extended resource served through DRA (KEP-5004, GA in 1.37): the DeviceClass the daemon
/// applied names it; a pod that asks for it in its limits is scheduled onto kubedev's devices
/// and gets one prepared by kubedev.
fn extended_resource(node: &Node, _root: &Path) -> anyhow::Result<()> {
    wait_for(
        "the daemon's DeviceClass naming the extended resource",
        Duration::from_secs(60),
        || {
            let class = node.kubectl_out(&[
                "get",
                "deviceclass",
                EXTENDED_CLASS,
                "-o",
                "jsonpath={.spec.extendedResourceName}",
            ])?;
            Ok(class.trim() == EXTENDED_RESOURCE)
        },
    )?;
    let res = format!("      resources:\n        limits:\n          {EXTENDED_RESOURCE}: 1\n");
    apply(node, &test_pod("extended", "", &res))?;
    let log = wait_running(node, "extended", Duration::from_secs(90))?;
    eprintln!("  container's output:\n{}", indent(&log));
    let pod = get_json(node, &["pod", "extended", "-n", TEST_NAMESPACE])?;
    let claim = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        .as_str()
        .context("the pod's status names no claim for its extended resource")?
        .to_string();
    let claim = get_json(node, &["resourceclaim", &claim, "-n", TEST_NAMESPACE])?;
    let device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        .as_str()
        .context("the extended resource's claim is not allocated")?
        .to_string();
    eprintln!("  the scheduler's claim for {EXTENDED_RESOURCE} holds {device}");
    ensure!(
        log.lines()
            .any(|l| l.starts_with("devices:") && l.contains(&format!("kubedev-{device} "))),
        "the container does not see /dev/kubedev-{device}:\n{log}"
    );
    ensure!(
        log.contains(&format!("KUBEDEV_TEST_DEVICE={device}")),
        "the container's environment lacks KUBEDEV_TEST_DEVICE={device}:\n{log}"
    );
    delete_pod(node, "extended")
}

/// The daemon's log: what its newest container printed.
fn daemon_log() -> String {
    let mut dirs: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir("/var/log/pods")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("kubedev_"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    dirs.sort();
    let Some((_, dir)) = dirs.last() else {
        return String::new();
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("kubedev"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    files
        .last()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_default()
}

/// The API server started as each older release it can emulate (`--emulated-version`,
/// KEP-4330) down to 1.34: it says so at /version, kubedev learns that release, publishes its
/// devices in the layout that release stores, and the server keeps them. Then back to its own.
fn emulated_versions(node: &Node, _root: &Path) -> anyhow::Result<()> {
    let own: u32 = node
        .bins
        .version
        .trim_start_matches("v1.")
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .context("the cluster's minor version")?;
    let mut accepted = Vec::new();
    for minor in (34..own).rev() {
        let release = format!("1.{minor}");
        eprintln!("  the API server as {release}");
        node.restart_with("kube-apiserver", |args| {
            args.retain(|a| !a.starts_with("--emulated-version"));
            args.push(format!("--emulated-version={release}"));
        })?;
        let ready = wait_for("the API server ready", Duration::from_secs(90), || {
            Ok(node.kubectl_out(&["get", "--raw=/readyz"])?.trim() == "ok")
        });
        if let Err(err) = ready {
            eprintln!("  it does not start as {release}: {err:#}");
            break;
        }
        let v: Value = serde_json::from_str(&node.kubectl_out(&["get", "--raw=/version"])?)?;
        eprintln!(
            "  /version: gitVersion {} minor {} emulationMinor {}",
            v["gitVersion"], v["minor"], v["emulationMinor"]
        );
        ensure!(
            v["emulationMinor"] == minor.to_string().as_str(),
            "/version does not say it emulates {release}: {v}"
        );
        node.kubectl_out(&[
            "rollout",
            "restart",
            "daemonset/kubedev",
            "-n",
            KUBEDEV_NAMESPACE,
        ])?;
        daemon_ready(node)?;
        let mut learned = String::new();
        wait_for(
            &format!("kubedev learning the release {release}"),
            Duration::from_secs(60),
            || {
                learned = daemon_log()
                    .lines()
                    .rfind(|l| l.contains("learned what the API server keeps"))
                    .unwrap_or_default()
                    .to_string();
                Ok(learned.contains(&format!("version={release}")))
            },
        )?;
        let summary = learned
            .split_once("learned what the API server keeps of ResourceSlices")
            .map_or(learned.as_str(), |(_, rest)| rest)
            .trim();
        eprintln!("  kubedev learned: {summary}");
        wait_for(
            &format!("kubedev's devices published to the server as {release}"),
            Duration::from_secs(60),
            || {
                let slices = get_json(node, &["resourceslices"])?;
                let names: BTreeSet<String> = slices["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|s| s["spec"]["driver"] == DRIVER)
                    .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
                    .filter_map(|d| d["name"].as_str().map(str::to_string))
                    .collect();
                Ok(names == BTreeSet::from(["test-0".into(), "test-1".into(), "test-2".into()]))
            },
        )?;
        accepted.push(release);
    }
    eprintln!(
        "  releases the API server emulates: {}",
        accepted.join(", ")
    );
    node.restart_with("kube-apiserver", |args| {
        args.retain(|a| !a.starts_with("--emulated-version"));
    })?;
    wait_for(
        "the API server ready as itself",
        Duration::from_secs(90),
        || Ok(node.kubectl_out(&["get", "--raw=/readyz"])?.trim() == "ok"),
    )?;
    node.kubectl_out(&[
        "rollout",
        "restart",
        "daemonset/kubedev",
        "-n",
        KUBEDEV_NAMESPACE,
    ])?;
    daemon_ready(node)?;
    ensure!(
        accepted.len() == (34..own).count(),
        "the API server emulated only {accepted:?}"
    );
    Ok(())
}

/// Indents `text` for the report.
fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// TCP connections and listeners: (local, remote, state) from /proc/net/tcp and tcp6.
pub(super) type Connections = BTreeSet<(String, String, String)>;

/// Every TCP socket of the machine now.
pub(super) fn connections() -> Connections {
    let mut all = Connections::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 3 {
                all.insert((f[1].to_string(), f[2].to_string(), f[3].to_string()));
            }
        }
    }
    all
}

/// Whether a /proc/net/tcp address (`0100007F:1F90`, or 32 hex digits for IPv6) is loopback.
fn is_loopback(addr: &str) -> bool {
    let ip = addr.split(':').next().unwrap_or("");
    match ip.len() {
        // Little-endian IPv4: 127.x.x.x has 7F as its last byte.
        8 => ip.ends_with("7F"),
        // ::1, and IPv4-mapped 127.x.x.x.
        32 => {
            ip == "00000000000000000000000001000000"
                || (ip.starts_with("0000000000000000FFFF0000") && ip.ends_with("7F"))
        }
        _ => false,
    }
}

/// A thread that reads the machine's TCP sockets every 100 ms while the tests run, so a
/// connection that comes and goes between two tests is seen too.
pub(super) struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Connections>,
}

impl Sampler {
    pub(super) fn start() -> Sampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Connections::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                seen.extend(connections());
                std::thread::sleep(Duration::from_millis(100));
            }
            seen.extend(connections());
            seen
        });
        Sampler { stop, thread }
    }

    /// Every socket seen while it ran.
    fn stop(self) -> Connections {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// No socket seen since `before` reaches beyond loopback: every new connection's both ends
/// and every new listener's address are loopback.
fn only_loopback(before: &Connections, seen: &Connections) -> anyhow::Result<()> {
    const LISTEN: &str = "0A";
    let now = seen;
    let offending: Vec<String> = now
        .difference(before)
        .filter(|(local, remote, state)| {
            if state == LISTEN {
                !is_loopback(local)
            } else {
                !is_loopback(local) || !is_loopback(remote)
            }
        })
        .map(|(l, r, s)| format!("{l} -> {r} (state {s})"))
        .collect();
    let total = now.difference(before).count();
    eprintln!(
        "  {total} sockets made since the cluster started, all on loopback: {}",
        offending.is_empty()
    );
    ensure!(
        offending.is_empty(),
        "sockets beyond loopback: {}",
        offending.join("; ")
    );
    Ok(())
}
