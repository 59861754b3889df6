//! A device that turns unhealthy and recovers, and restarts of the kubelet, containerd and
//! kubedev itself with a pod holding a claim.

use super::*;

/// The taints kubedev's slices put on device `device`: (key, effect) pairs.
pub(super) fn device_taints(node: &Node, device: &str) -> anyhow::Result<Vec<(String, String)>> {
    Ok(driver_devices(node)?
        .into_iter()
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

/// A device made unhealthy on the host (its presence file removed) becomes a device taint
/// the scheduler honours: a claim for every DRA device stays Pending until the device
/// recovers, then its pod runs; the device-plugin device leaves allocatable and comes back.
pub(super) fn health(node: &Node, _root: &Path) -> anyhow::Result<()> {
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
        claim_for(node, "all-three", 3)?;
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
            || Ok(failed_scheduling(node, "needs-three")?.is_some()),
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
pub(super) fn container_identity(node: &Node, name: &str) -> anyhow::Result<String> {
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
pub(super) fn restarts(node: &Node, _root: &Path) -> anyhow::Result<()> {
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
            node.ready()
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
    roll_kubedev(node)?;
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
