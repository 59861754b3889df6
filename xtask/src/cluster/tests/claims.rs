//! Devices reaching containers: a DRA claim end to end, a claim that cannot fit explained, a
//! DeviceTaintRule honoured and explained, an extended resource served through DRA, and the
//! device-plugin resource of the same daemon.

use super::*;

/// DRA end to end: a ResourceClaimTemplate of the chart's DeviceClass; the scheduler
/// allocates from kubedev's slices, the kubelet has kubedev prepare, containerd applies the
/// CDI spec; the container sees its device node, environment and metadata file; the claim's
/// status lists the device; deleting the pod unprepares the claim and removes its spec.
pub(super) fn dra_end_to_end(node: &Node, _root: &Path) -> anyhow::Result<()> {
    let published = published_devices(node)?;
    eprintln!("  slices of {DRIVER}: {published:?}");
    ensure!(
        published == dra_devices(),
        "kubedev's ResourceSlices hold {published:?}, not {:?} (test-dp is the device \
         plugin's)",
        dra_devices()
    );
    one_device_template(node)?;
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
    let claim = pod_claim(node, "dra-one").context("the pod's generated claim")?;
    let claim_name = claim["metadata"]["name"]
        .as_str()
        .context("claim name")?
        .to_string();
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
    delete_pod_until_unprepared(
        node,
        "dra-one",
        &uid,
        "the claim's CDI spec removed after the pod is gone",
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
pub(super) fn unfit_claim_explained(node: &Node, root: &Path) -> anyhow::Result<()> {
    claim_for(node, "too-many", 5)?;
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
        message = failed_scheduling(node, "unfit")?.unwrap_or_default();
        Ok(!message.is_empty())
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
    let text = kubedev_explain(node, root, "unfit")?;
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

/// `kubedev explain --details --pod` for a pod of the test namespace, against the live
/// cluster: what it prints.
fn kubedev_explain(node: &Node, root: &Path, pod: &str) -> anyhow::Result<String> {
    let kubedev = crate::commands::target_dir(root).join("release/kubedev");
    let out = node
        .client(&kubedev)
        .args([
            "explain",
            "--details",
            "--pod",
            &format!("{TEST_NAMESPACE}/{pod}"),
        ])
        .output()
        .context("running kubedev explain")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "  kubedev explain --pod {TEST_NAMESPACE}/{pod}:\n{}",
        indent(&text)
    );
    ensure!(
        out.status.success(),
        "kubedev explain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text)
}

/// A DeviceTaintRule tainting every kubedev device: the scheduler leaves a new claim's pod
/// Pending, and `kubedev explain` against the live cluster says the node's devices are
/// tainted; once the rule is deleted the pod is scheduled and runs.
pub(super) fn taint_rule_explained(node: &Node, root: &Path) -> anyhow::Result<()> {
    let rule = format!(
        "apiVersion: resource.k8s.io/v1
kind: DeviceTaintRule
metadata:
  name: kubedev-test-maintenance
spec:
  deviceSelector:
    driver: {DRIVER}
  taint:
    key: kubedev.io/test-maintenance
    value: planned
    effect: NoSchedule
"
    );
    apply(node, &rule)?;
    claim_for(node, "under-rule", 1)?;
    let claims = "  resourceClaims:\n    - name: dev\n      resourceClaimName: under-rule\n";
    apply(
        node,
        &test_pod(
            "under-rule",
            claims,
            "      resources:\n        claims:\n          - name: dev\n",
        ),
    )?;
    let mut message = String::new();
    wait_for("a FailedScheduling event", Duration::from_secs(60), || {
        message = failed_scheduling(node, "under-rule")?.unwrap_or_default();
        Ok(!message.is_empty())
    })?;
    eprintln!("  scheduler's event: {message}");
    ensure!(
        message.contains("cannot allocate all claims"),
        "the scheduler's message does not say the claim cannot be allocated: {message}"
    );
    let text = kubedev_explain(node, root, "under-rule")?;
    let wanted = dra_devices().len();
    ensure!(
        text.contains("0 of 1 nodes can take")
            && text.contains(&format!("claim {TEST_NAMESPACE}/under-rule request dev"))
            && text.contains(&format!("{wanted} tainted")),
        "kubedev explain does not say that the node's {wanted} devices are tainted (the \
         scheduler: {message})"
    );
    node.kubectl_out(&["delete", "devicetaintrule", "kubedev-test-maintenance"])?;
    wait_running(node, "under-rule", Duration::from_secs(90))?;
    delete_pod(node, "under-rule")?;
    node.kubectl_out(&[
        "delete",
        "resourceclaim",
        "under-rule",
        "-n",
        TEST_NAMESPACE,
    ])?;
    Ok(())
}

/// An extended resource served through DRA (KEP-5004, GA in 1.37): the DeviceClass the daemon
/// applied names it; a pod that asks for it in its limits is scheduled onto kubedev's devices
/// and gets one prepared by kubedev.
pub(super) fn extended_resource(node: &Node, _root: &Path) -> anyhow::Result<()> {
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

/// The device-plugin resource from the same daemon: on the Node's capacity and allocatable; a
/// pod that requests it gets its device; the device is in no ResourceSlice.
pub(super) fn device_plugin(node: &Node, _root: &Path) -> anyhow::Result<()> {
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
