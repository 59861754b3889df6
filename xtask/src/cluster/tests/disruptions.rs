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
/// daemon runs when its pod goes. The rollout starts the new daemon beside the old one, whose
/// registrations go only once the new one's are there (see [`roll_with_surge`]).
pub(super) fn restarts(node: &Node, root: &Path) -> anyhow::Result<()> {
    dra_pod(node, "holder")?;
    let holder = container_identity(node, "holder")?;
    let uid = pod_claim(node, "holder")?["metadata"]["uid"]
        .as_str()
        .context("claim uid")?
        .to_string();

    for (step, component) in [("kubelet", "kubelet"), ("containerd", "containerd")] {
        eprintln!("  restarting {step}");
        let pid = node.restart(component)?;
        node.wait_while_running(
            component,
            pid,
            "the node Ready again",
            Duration::from_secs(120),
            || node.ready(),
        )?;
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

    eprintln!("  rolling kubedev's DaemonSet (the chart's surge: the new daemon starts first)");
    roll_with_surge(node)?;
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
    stop_first_rollout_is_caught(node, root)?;
    ensure!(
        container_identity(node, "holder")? == holder,
        "the running pod's container changed over kubedev's rollouts"
    );
    delete_pod_until_unprepared(
        node,
        "holder",
        &uid,
        "the held claim unprepared by the new daemon",
    )?;
    Ok(())
}

/// The rollout check must catch an update that stops the old daemon first: with `maxSurge: 0`
/// and `maxUnavailable: 1` [`roll_with_surge`] has to fail. The chart's strategy is put back
/// afterwards (a change of strategy alone starts no rollout).
fn stop_first_rollout_is_caught(node: &Node, root: &Path) -> anyhow::Result<()> {
    const STOP_FIRST: [&str; 2] = [
        "updateStrategy.rollingUpdate.maxSurge=0",
        "updateStrategy.rollingUpdate.maxUnavailable=1",
    ];
    const CHART: [&str; 2] = [
        "updateStrategy.rollingUpdate.maxSurge=1",
        "updateStrategy.rollingUpdate.maxUnavailable=0",
    ];
    upgrade_kubedev(root, node, &STOP_FIRST)?;
    let outcome = roll_with_surge(node);
    let restored = upgrade_kubedev(root, node, &CHART).and_then(|()| daemon_ready(node));
    match outcome {
        Ok(()) => bail!(
            "a rollout that stops the old daemon before starting the new one passed the rollout \
             check"
        ),
        Err(e) => eprintln!("  mutation: a rollout with maxSurge 0 is caught: {e:#}"),
    }
    restored
}

/// kubedev's sockets at one moment of a rollout, and whether the new daemon was ready.
#[derive(Debug)]
struct RolloutSample {
    /// Since the rollout began.
    at: Duration,
    /// The new daemon answered `/readyz` with 200: the kubelet had accepted its registrations
    /// on both APIs.
    new_ready: bool,
    /// kubedev's DRA registration sockets in the kubelet's registration directory.
    registrations: BTreeSet<String>,
    /// kubedev's device-plugin sockets.
    device_plugins: BTreeSet<String>,
}

/// The names in `dir` that `keep` accepts.
fn socket_names(dir: &str, keep: impl Fn(&str) -> bool) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| keep(n))
        .collect()
}

/// kubedev's DRA registration socket of the daemon in pod `uid`.
fn registration_socket(uid: &str) -> String {
    format!("{DRIVER}-{uid}-reg.sock")
}

/// The sockets now, and whether the daemon at `new_ip` (when known) is ready.
fn rollout_sample(new_ip: Option<&str>, began: Instant) -> RolloutSample {
    // Readiness first: a daemon ready then is still ready when the sockets are read, so a
    // sample never shows an overlap that was not there.
    let new_ready = new_ip.is_some_and(|ip| {
        crate::commands::http_get(&format!("{ip}:9464"), "/readyz", Duration::from_secs(1)).is_ok()
    });
    RolloutSample {
        at: began.elapsed(),
        new_ready,
        registrations: socket_names("/var/lib/kubelet/plugins_registry", |n| {
            n.starts_with(&format!("{DRIVER}-")) && n.ends_with("-reg.sock")
        }),
        device_plugins: socket_names("/var/lib/kubelet/device-plugins", |n| {
            n.starts_with("kubedev-") && n.ends_with(".sock")
        }),
    }
}

/// Rolls kubedev's DaemonSet as the chart sets it up (`maxSurge: 1`, `maxUnavailable: 0`)
/// while its sockets and the new daemon's readiness are read every few milliseconds, and checks
/// what a seamless upgrade must show: the new daemon was ready (the kubelet had accepted its
/// registrations on both APIs) while the old one's DRA registration was still there; kubedev
/// never had no registration or device-plugin socket; and at the end only the new daemon's
/// remain, with the device-plugin resource allocatable.
fn roll_with_surge(node: &Node) -> anyhow::Result<()> {
    let old = match &daemon_pods(node)?[..] {
        [pod] if pod.ready => pod.clone(),
        pods => bail!("before the rollout: expected one ready kubedev pod, found {pods:?}"),
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let stopped = || stop.load(std::sync::atomic::Ordering::Relaxed);
    // The new daemon's pod IP, once the API server reports one: from a watch of the daemon's
    // pods, which hears of it within milliseconds (a kubectl per poll can take longer than the
    // whole rollout on a busy machine).
    let new_ip = std::sync::Mutex::new(None::<String>);
    let mut watch = node
        .kubectl()
        .args([
            "get",
            "pods",
            "-n",
            KUBEDEV_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=kubedev",
            "--watch",
            "-o",
            "jsonpath={.metadata.uid} {.status.podIP}{\"\\n\"}",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("watching kubedev's pods")?;
    let watched = watch.stdout.take();
    let began = Instant::now();
    let (rolled, samples) = std::thread::scope(|scope| {
        scope.spawn(|| {
            let Some(out) = watched else { return };
            for line in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok)
            {
                if let Some((uid, ip)) = line.trim().split_once(' ')
                    && uid != old.uid
                    && !ip.is_empty()
                    && let Ok(mut new) = new_ip.lock()
                {
                    *new = Some(ip.to_string());
                }
            }
        });
        let sampler = scope.spawn(|| {
            let mut samples = Vec::new();
            loop {
                let done = stopped();
                let ip = new_ip.lock().ok().and_then(|ip| ip.clone());
                samples.push(rollout_sample(ip.as_deref(), began));
                if done {
                    return samples;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let rolled = roll_kubedev(node).and_then(|()| {
            wait_for("the old daemon pod gone", Duration::from_secs(60), || {
                Ok(!daemon_pods(node)?.iter().any(|p| p.uid == old.uid))
            })
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = watch.kill();
        let _ = watch.wait();
        (rolled, sampler.join().unwrap_or_default())
    });
    rolled?;
    let new = match &daemon_pods(node)?[..] {
        [pod] if pod.ready && pod.uid != old.uid => pod.clone(),
        pods => bail!("after the rollout: expected one new ready kubedev pod, found {pods:?}"),
    };
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        bail!("no reading of kubedev's sockets during the rollout");
    };
    if let Some(bare) = samples
        .iter()
        .find(|s| s.registrations.is_empty() || s.device_plugins.is_empty())
    {
        bail!(
            "{:.0?} into the rollout kubedev had no DRA registration or no device-plugin socket \
             (registrations {:?}, device plugins {:?})",
            bare.at,
            bare.registrations,
            bare.device_plugins
        );
    }
    let old_socket = registration_socket(&old.uid);
    let overlap: Vec<Duration> = samples
        .iter()
        .filter(|s| s.new_ready && s.registrations.contains(&old_socket))
        .map(|s| s.at)
        .collect();
    let (Some(from), Some(to)) = (overlap.first(), overlap.last()) else {
        let changes: Vec<String> = samples
            .windows(2)
            .filter(|w| {
                w[0].new_ready != w[1].new_ready || w[0].registrations != w[1].registrations
            })
            .map(|w| {
                format!(
                    "{:.0?}: ready {} {:?}",
                    w[1].at, w[1].new_ready, w[1].registrations
                )
            })
            .collect();
        bail!(
            "the old daemon's registration went before the new daemon was ready ({} readings; \
             what changed: {})",
            samples.len(),
            changes.join("; ")
        );
    };
    ensure!(
        last.registrations == BTreeSet::from([registration_socket(&new.uid)]),
        "after the rollout the registrations are {:?}, not the new daemon's alone",
        last.registrations
    );
    ensure!(
        last.device_plugins.len() == 1 && last.device_plugins != first.device_plugins,
        "device-plugin sockets before the rollout {:?}, after it {:?}: not one new one",
        first.device_plugins,
        last.device_plugins
    );
    wait_for(
        "the device-plugin resource allocatable after the rollout",
        Duration::from_secs(60),
        || Ok(dp_allocatable(node)? == "1"),
    )?;
    eprintln!(
        "  rollout in {:.1?} ({} readings): the new daemon ready beside the old one's \
         registration from {from:.2?} to {to:.2?}; kubedev's registration and device-plugin \
         sockets never all gone",
        last.at,
        samples.len(),
    );
    Ok(())
}

/// A lost checkpoint, with the claim's pool unserved at first: a pod holds a claim the real
/// scheduler allocated; kubedev's checkpoint is damaged and the claim's CDI spec deleted, and
/// kubedev is rolled with every start-up discovery failing (fail point `startup-discovery`), so
/// when recovery lists the claims no backend serves the claim's pool and only the allocation's
/// node selector, as the real scheduler wrote it, says the claim is this node's. The claim is
/// reported naming its pool, prepared again once the discovery tried again finds the pool, its
/// spec written again; the pod runs on, and the claim is unprepared when the pod goes.
pub(super) fn lost_checkpoint(node: &Node, _root: &Path) -> anyhow::Result<()> {
    dra_pod(node, "lost-holder")?;
    let holder = container_identity(node, "lost-holder")?;
    let claim = pod_claim(node, "lost-holder")?;
    let uid = claim["metadata"]["uid"]
        .as_str()
        .context("claim uid")?
        .to_string();
    let selector = &claim["status"]["allocation"]["nodeSelector"];
    let named = serde_json::json!([{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [pki::NODE]}
    ]}]);
    ensure!(
        selector["nodeSelectorTerms"] == named,
        "the scheduler's allocation does not name the node by metadata.name: {selector}"
    );
    let checkpoint = PathBuf::from(format!(
        "/var/lib/kubelet/plugins/{DRIVER}/kubedev-checkpoint.json"
    ));
    ensure!(
        checkpoint.is_file(),
        "kubedev's checkpoint is not at {}",
        checkpoint.display()
    );
    let specs = cdi_files_naming(&uid);
    ensure!(!specs.is_empty(), "no CDI spec names the claim {uid}");
    std::fs::write(&checkpoint, "damaged by the lost-checkpoint test")?;
    for spec in &specs {
        std::fs::remove_file(spec).with_context(|| format!("removing {}", spec.display()))?;
    }

    eprintln!("  rolling kubedev with its start-up discovery failing");
    let failpoint = "KUBEDEV_FAILPOINTS=startup-discovery=fail";
    set_daemon_env(node, failpoint)?;
    let rebuilt = wait_for(
        "the claim prepared again, its CDI spec back",
        Duration::from_secs(120),
        || Ok(!cdi_files_naming(&uid).is_empty()),
    );
    let log = daemon_log();
    set_daemon_env(node, "KUBEDEV_FAILPOINTS-")?;
    rebuilt.with_context(|| format!("the daemon's log:\n{}", indent(&log)))?;
    let reported = format!("{uid}: no backend of this node serves its pool(s)");
    ensure!(
        log.contains(&reported) && log.contains("discovering again after a failed discovery"),
        "the daemon's log does not report the unserved pool and the discovery tried again:\n{}",
        indent(&log)
    );
    ensure!(
        container_identity(node, "lost-holder")? == holder,
        "the running pod's container changed over the lost checkpoint"
    );
    delete_pod_until_unprepared(
        node,
        "lost-holder",
        &uid,
        "the rebuilt claim unprepared when its pod went",
    )?;
    Ok(())
}

/// Sets (`NAME=value`) or removes (`NAME-`) an environment variable of kubedev's daemon
/// container, and waits until the rollout that starts is done, the old daemon gone.
fn set_daemon_env(node: &Node, change: &str) -> anyhow::Result<()> {
    node.kubectl_out(&[
        "set",
        "env",
        "daemonset/kubedev",
        "-n",
        KUBEDEV_NAMESPACE,
        change,
    ])?;
    daemon_ready(node)?;
    wait_for("one kubedev daemon pod", Duration::from_secs(60), || {
        Ok(daemon_pods(node)?.len() == 1)
    })
}
