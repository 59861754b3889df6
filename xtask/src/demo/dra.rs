//! The demo's DRA steps: the plugin registers with the kubelet's plugin watcher, kubedev
//! publishes a ResourceSlice, the allocator allocates a claim as the scheduler would, the
//! kubelet prepares it (its CDI spec and the claim's device status), then unprepares it; and a
//! DRA device fails (a taint on its ResourceSlice entry) and recovers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use kubedev_testkit::apiserver::{ApiServer, Resource};
use kubedev_testkit::kubelet::{ClaimId, DraKubelet};
use serde_json::{Value, json};

use super::{DRIVER, NODE, WAIT, say};

/// The UID of the demo's ResourceClaim `default/fast-nic`.
const CLAIM_UID: &str = "7f0c9a52-demo-4e1b-9d2a-000000000001";

/// The DRA steps, from the plugin's registration to the claim unprepared.
pub(super) async fn dra_story(
    step: &mut u32,
    api: &ApiServer,
    kubelet: &DraKubelet,
    root: &Path,
) -> anyhow::Result<()> {
    plugin_registered(step, kubelet).await?;
    let slices = published_slices(step, api).await?;
    allocate_claim(step, api, slices)?;
    let id = ClaimId::new("default", "fast-nic", CLAIM_UID);
    let cdi = prepare_claim(step, kubelet, &id, root).await?;

    say(
        step,
        "DRA: kubedev reports the prepared device in the claim's status (status.devices).",
    );
    let status = claim_status(api, |d| d.as_array().is_some_and(|a| !a.is_empty())).await?;
    println!("    {status}");

    say(
        step,
        "DRA: the pod is gone; unprepare removes the CDI spec and the claim's device status.",
    );
    let un = kubelet.unprepare(DRIVER, std::slice::from_ref(&id)).await?;
    ensure!(
        un.get(&id.uid).is_some_and(|r| r.is_ok()),
        "unprepare failed: {un:?}"
    );
    ensure!(!cdi.exists(), "CDI file still there");
    println!("    {} removed", cdi.display());
    let status = claim_status(api, |d| d.as_array().is_none_or(|a| a.is_empty())).await?;
    println!("    status.devices: {status}");
    Ok(())
}

/// The plugin registered with the kubelet's plugin watcher; prints what GetInfo said.
async fn plugin_registered(step: &mut u32, kubelet: &DraKubelet) -> anyhow::Result<()> {
    say(
        step,
        "DRA: the plugin registered with the kubelet's plugin watcher.",
    );
    ensure!(
        kubelet
            .wait_until(WAIT, |k| k.drivers().contains_key(DRIVER))
            .await,
        "the DRA plugin did not register: {:?}",
        kubelet.rejected()
    );
    let d = &kubelet.drivers()[DRIVER];
    println!(
        "    GetInfo: endpoint {}, versions {:?}; the kubelet chose {}",
        d.endpoint, d.supported_versions, d.chosen
    );
    Ok(())
}

/// Waits for the driver's ResourceSlices in the API server, prints and returns them.
async fn published_slices(step: &mut u32, api: &ApiServer) -> anyhow::Result<Vec<Value>> {
    say(
        step,
        "DRA: kubedev published a ResourceSlice with the devices no device-plugin resource takes.",
    );
    let deadline = Instant::now() + WAIT;
    let slices = loop {
        let s: Vec<_> = api
            .objects(Resource::ResourceSlices)
            .into_iter()
            .filter(|s| s["spec"]["driver"] == DRIVER)
            .collect();
        if !s.is_empty() {
            break s;
        }
        ensure!(Instant::now() < deadline, "no ResourceSlice was published");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for s in &slices {
        let devices: Vec<&str> = s["spec"]["devices"]
            .as_array()
            .map(|a| a.iter().filter_map(|d| d["name"].as_str()).collect())
            .unwrap_or_default();
        println!(
            "    {} (pool {} generation {}): {devices:?}",
            s["metadata"]["name"].as_str().unwrap_or("?"),
            s["spec"]["pool"]["name"].as_str().unwrap_or("?"),
            s["spec"]["pool"]["generation"]
        );
    }
    Ok(slices)
}

/// A ResourceClaim for one 100G NIC, allocated from `slices` by the allocator as the scheduler
/// would, and stored with its allocation in the API server.
fn allocate_claim(step: &mut u32, api: &ApiServer, slices: Vec<Value>) -> anyhow::Result<()> {
    say(
        step,
        "DRA: a ResourceClaim asks for one 100G NIC; the allocator picks it as the scheduler would.",
    );
    let class = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "nic"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}});
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "fast-nic", "namespace": "default", "uid": CLAIM_UID},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic",
            "selectors": [{"cel": {"expression": format!("device.attributes['{DRIVER}'].speed >= 100")}}]}}]}}});
    let scenario = json!({"node": {"name": NODE}, "deviceClasses": [class],
        "resourceSlices": slices, "claims": [claim]});
    let scenario = kubedev_inputs::scenario_from_text(&scenario.to_string())?;
    let out =
        kubedev_allocator::simulate(&scenario, &kubedev_allocator::SimulateOptions::default());
    ensure!(out.allocatable, "the claim does not fit: {}", out.to_text());
    let allocation = serde_json::to_value(&out.claims[0].allocation)?;
    println!("    allocation: {}", allocation["devices"]["results"]);
    let mut stored = claim;
    stored["status"] = json!({"allocation": allocation});
    api.put_raw(Resource::ResourceClaims, stored)?;
    Ok(())
}

/// The kubelet prepares claim `id`; prints the prepared devices and the CDI spec kubedev
/// wrote under `root`, and returns that spec's path.
async fn prepare_claim(
    step: &mut u32,
    kubelet: &DraKubelet,
    id: &ClaimId,
    root: &Path,
) -> anyhow::Result<PathBuf> {
    say(
        step,
        "DRA: the kubelet prepares the claim; kubedev writes its CDI spec.",
    );
    let answer = kubelet.prepare(DRIVER, std::slice::from_ref(id)).await?;
    let devices = answer
        .get(&id.uid)
        .context("no answer for the claim")?
        .clone()
        .map_err(anyhow::Error::msg)?;
    for d in &devices {
        println!(
            "    {}/{} for request {:?} -> CDI {:?}",
            d.pool, d.device, d.request_names, d.cdi_device_ids
        );
    }
    let cdi: Vec<PathBuf> = std::fs::read_dir(root.join("cdi"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    ensure!(cdi.len() == 1, "expected one CDI file, found {cdi:?}");
    println!("    {}:", cdi[0].display());
    for line in std::fs::read_to_string(&cdi[0])?.lines() {
        println!("      {line}");
    }
    Ok(cdi[0].clone())
}

/// The demo claim's `status.devices` once `done` holds for it.
async fn claim_status(api: &ApiServer, done: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let claim = api
            .get(Resource::ResourceClaims, Some("default"), "fast-nic")
            .context("the demo claim is gone")?;
        let devices = &claim["status"]["devices"];
        if done(devices) {
            return Ok(devices.clone());
        }
        ensure!(
            Instant::now() < deadline,
            "the claim's device status never settled: {devices}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The published taints of DRA device `device` once `done` holds for them.
async fn slice_taints(
    api: &ApiServer,
    device: &str,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let taints = api
            .objects(Resource::ResourceSlices)
            .into_iter()
            .filter(|s| s["spec"]["driver"] == DRIVER)
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["name"] == device)
            .map(|d| d["taints"].clone());
        if let Some(t) = taints.filter(|t| done(t)) {
            return Ok(t);
        }
        ensure!(
            Instant::now() < deadline,
            "the taints of {device} never settled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A DRA device fails: its ResourceSlice entry carries a taint saying why; it recovers and the
/// taint goes.
pub(super) async fn dra_health(
    step: &mut u32,
    api: &ApiServer,
    health_dir: &Path,
) -> anyhow::Result<()> {
    say(
        step,
        "DRA: nic-1 fails (its presence file disappears): its ResourceSlice entry gets a taint saying why.",
    );
    let t = Instant::now();
    std::fs::remove_file(health_dir.join("nic-1"))?;
    let taints = slice_taints(api, "nic-1", |t| t.is_array()).await?;
    println!("    taints {taints} ({:.0?} later)", t.elapsed());

    say(
        step,
        "DRA: nic-1 comes back: kubedev removes the taint, and the scheduler may use it again.",
    );
    let t = Instant::now();
    std::fs::write(health_dir.join("nic-1"), "")?;
    slice_taints(api, "nic-1", Value::is_null).await?;
    println!("    no taints ({:.0?} later)", t.elapsed());
    Ok(())
}
