//! What the real cluster must show: kubedev installed by its chart, a pod given a DRA device by
//! the real scheduler, kubelet and containerd, a claim that cannot fit explained as the
//! scheduler explains it, the device-plugin resource from the same daemon, a rollout, the
//! daemon's confinement and every rendering's RBAC, and no connection off the machine (one
//! module each). Each test asserts what a user sees: `kubectl` output and
//! the container's own. This module holds what they share: the names, manifests and waits.

mod admission;
mod claims;
mod confinement;
mod disruptions;
mod install;
mod kubelet_calls;
mod loopback;
mod renderings;
mod scale;
mod startup;
mod stored;
mod versions;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use super::image::{self, Image};
use super::network;
use super::node::{Node, wait_for};
use super::pki;

use install::upgrade_kubedev;
pub(super) use install::{build_images, install_kubedev};
pub(super) use loopback::{Connections, Sampler, connections};

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
        ("dra-end-to-end", claims::dra_end_to_end),
        ("unfit-claim-explained", claims::unfit_claim_explained),
        ("taint-rule-explained", claims::taint_rule_explained),
        ("device-plugin", claims::device_plugin),
        ("extended-resource-through-dra", claims::extended_resource),
        ("admission-policy", admission::admission_policy),
        (
            "rbac-of-every-rendering",
            renderings::rbac_of_every_rendering,
        ),
        // Before anything restarts kubedev: it reads the counts of the calls so far.
        ("kubelet-calls-as-emulated", kubelet_calls::kubelet_calls),
        ("confinement", confinement::confinement),
        ("health", disruptions::health),
        ("restarts", disruptions::restarts),
        ("lost-checkpoint", disruptions::lost_checkpoint),
        ("pod-startup", startup::pod_startup),
        ("prepare-10000-claims", scale::prepare_ten_thousand),
        // Last: it restarts the API server as older releases.
        ("emulated-versions", versions::emulated_versions),
    ];
    node.kubectl_out(&["create", "namespace", TEST_NAMESPACE])?;
    let mut failed = Vec::new();
    for (name, body) in tests {
        if only.is_some_and(|o| !o.split(',').any(|part| name.contains(part))) {
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
    eprintln!("\n==> cluster test: nothing left the machine");
    if let Err(err) = loopback::only_loopback(before, &sampler.stop()) {
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
    kubectl_with_manifest(node, &["apply"], manifest)
}

/// `kubectl ARGS -f -` with `manifest` (YAML) on its standard input.
fn kubectl_with_manifest(node: &Node, args: &[&str], manifest: &str) -> anyhow::Result<()> {
    let mut child = node
        .kubectl()
        .args(args)
        .args(["-f", "-"])
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
        "kubectl {} failed: {}",
        args.join(" "),
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

/// The ResourceClaim of pod `pod`'s first claim entry, as the API server holds it.
fn pod_claim(node: &Node, pod: &str) -> anyhow::Result<Value> {
    let name =
        get_json(node, &["pod", pod, "-n", TEST_NAMESPACE])?["status"]["resourceClaimStatuses"][0]
            ["resourceClaimName"]
            .as_str()
            .with_context(|| format!("pod {pod}'s status names no claim"))?
            .to_string();
    get_json(node, &["resourceclaim", &name, "-n", TEST_NAMESPACE])
}

/// Deletes pod `pod` and waits until no CDI spec names its claim `uid` any more (kubedev
/// unprepared it); `what` says which unprepare is waited for.
fn delete_pod_until_unprepared(
    node: &Node,
    pod: &str,
    uid: &str,
    what: &str,
) -> anyhow::Result<()> {
    delete_pod(node, pod)?;
    wait_for(what, Duration::from_secs(60), || {
        Ok(cdi_files_naming(uid).is_empty())
    })
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

/// The devices in kubedev's ResourceSlices, as the server stores them.
fn driver_devices(node: &Node) -> anyhow::Result<Vec<Value>> {
    let slices = get_json(node, &["resourceslices"])?;
    Ok(slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["spec"]["driver"] == DRIVER)
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect())
}

/// The names of the devices in kubedev's ResourceSlices.
fn published_devices(node: &Node) -> anyhow::Result<BTreeSet<String>> {
    Ok(driver_devices(node)?
        .iter()
        .filter_map(|d| d["name"].as_str().map(str::to_string))
        .collect())
}

/// One of kubedev's daemon pods as the API server reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DaemonPod {
    name: String,
    uid: String,
    ip: String,
    ready: bool,
    /// Deleted, and stopping.
    terminating: bool,
}

/// kubedev's daemon pods now, oldest first.
fn daemon_pods(node: &Node) -> anyhow::Result<Vec<DaemonPod>> {
    let pods = get_json(
        node,
        &[
            "pods",
            "-n",
            KUBEDEV_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=kubedev",
            "--sort-by=.metadata.creationTimestamp",
        ],
    )?;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Ok(pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| DaemonPod {
            name: text(&p["metadata"]["name"]),
            uid: text(&p["metadata"]["uid"]),
            ip: text(&p["status"]["podIP"]),
            ready: p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True"),
            terminating: !p["metadata"]["deletionTimestamp"].is_null(),
        })
        .collect())
}

/// Where the running daemon serves its metrics: its pod's IP on the bridge, the chart's port.
fn daemon_metrics_address(node: &Node) -> anyhow::Result<String> {
    let mut pods = daemon_pods(node)?;
    pods.retain(|p| !p.terminating);
    match &pods[..] {
        [pod] if pod.ready && !pod.ip.is_empty() => Ok(format!("{}:9464", pod.ip)),
        _ => bail!("expected one ready kubedev pod with an IP, found {pods:?}"),
    }
}

/// Restarts kubedev's DaemonSet and waits until its new pod is ready.
fn roll_kubedev(node: &Node) -> anyhow::Result<()> {
    node.kubectl_out(&[
        "rollout",
        "restart",
        "daemonset/kubedev",
        "-n",
        KUBEDEV_NAMESPACE,
    ])?;
    daemon_ready(node)
}

/// The DRA devices kubedev must publish: all but the device plugin's.
fn dra_devices() -> BTreeSet<String> {
    DEVICES
        .iter()
        .filter(|d| **d != "test-dp")
        .map(|d| (*d).to_string())
        .collect()
}

/// Applies a ResourceClaim `name` for `count` devices of the static class.
fn claim_for(node: &Node, name: &str, count: u32) -> anyhow::Result<()> {
    apply(
        node,
        &format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}
  namespace: {TEST_NAMESPACE}
spec:
  devices:
    requests:
      - name: dev
        exactly:
          deviceClassName: {CLASS}
          allocationMode: ExactCount
          count: {count}
"#
        ),
    )
}

/// The message of the scheduler's newest FailedScheduling event for pod `pod`, if any.
fn failed_scheduling(node: &Node, pod: &str) -> anyhow::Result<Option<String>> {
    let events = get_json(
        node,
        &[
            "events",
            "-n",
            TEST_NAMESPACE,
            "--field-selector",
            &format!("involvedObject.name={pod},reason=FailedScheduling"),
        ],
    )?;
    Ok(events["items"]
        .as_array()
        .and_then(|items| items.last())
        .and_then(|e| e["message"].as_str())
        .map(str::to_string))
}

/// Indents `text` for the report.
fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
