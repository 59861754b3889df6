//! `cargo xtask e2e`: whole scenarios through the real `kubedev` binary, per backend and mode,
//! against the emulated kubelet (both APIs) and API server, fake host roots and the NVML
//! stand-in — with a kubelet restart, API-server faults and `kill -9` of the daemon — and a
//! summary table at the end.
//!
//! DRA: discovery → ResourceSlices in the API server (while its slice writes fail) → the
//! allocator picks a device as the scheduler would → the claim is written with its allocation →
//! prepare → the CDI spec holds the backend's edits → `kill -9` → restart → prepare again gives
//! the same answer → unprepare removes the CDI spec. Device plugin: registration → capacity →
//! Allocate edits → kubelet restart → re-registered with the same devices.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use kubedev_testkit::apiserver::{ApiServer, Fault, Resource, Verb};
use kubedev_testkit::kubelet::{ClaimId, DraKubelet, KubeletEmulator};
use kubedev_testkit::machines;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);
const NODE: &str = "e2e-node";
const DRIVER: &str = "devices.e2e.kubedev.io";

/// One backend set up on a fresh host root.
struct Backend {
    name: &'static str,
    /// The `backends:` section.
    config: String,
    /// The extended resource the device-plugin run serves.
    resource: &'static str,
    /// A device-node path every prepared device of this backend gives the container.
    node: &'static str,
    /// Keeps the fake host root (and the NVML copy) alive.
    _root: Option<kubedev_testkit::hostroot::HostRoot>,
    host: PathBuf,
}

fn backends(dir: &Path) -> anyhow::Result<Vec<Backend>> {
    let mut out = Vec::new();
    // static: devices listed in the configuration.
    out.push(Backend {
        name: "static",
        config: format!(
            "  static:\n    pool: {NODE}\n    devices:\n      - {{name: dev-0, deviceNodes: [/dev/null]}}\n      - {{name: dev-1, deviceNodes: [/dev/null]}}\n"
        ),
        resource: "example.com/dev",
        node: "/dev/null",
        _root: None,
        host: PathBuf::from("/"),
    });
    // host: /dev/kvm slots on a fake root.
    let root = kubedev_testkit::hostroot::HostRoot::new()?;
    root.device_node("/dev/kvm")?;
    out.push(Backend {
        name: "host",
        config: "  host:\n    characterDevices:\n      - {name: kvm, path: /dev/kvm, slots: 3}\n"
            .into(),
        resource: "devices.kubevirt.io/kvm",
        node: "/dev/kvm",
        host: root.path().to_path_buf(),
        _root: Some(root),
    });
    // usb: two identical keys and a serial adapter.
    let root = machines::usb::three_devices()?;
    out.push(Backend {
        name: "usb",
        config: "  usb:\n    resources:\n      - {name: example.com/yubikey, selectors: [\"1050:0407\"]}\n"
            .into(),
        resource: "example.com/yubikey",
        node: "/dev/bus/usb/001/",
        host: root.path().to_path_buf(),
        _root: Some(root),
    });
    // vfio: four GPUs on vfio-pci.
    let root = machines::pci::dual_socket_gpu_server()?;
    out.push(Backend {
        name: "vfio",
        config: "  vfio:\n    pciDevices:\n      - {selector: \"10de:2236\", resourceName: nvidia.com/GA102GL_A10}\n"
            .into(),
        resource: "nvidia.com/GA102GL_A10",
        node: "/dev/vfio/",
        host: root.path().to_path_buf(),
        _root: Some(root),
    });
    // nvidia: a DGX A100 through the NVML stand-in.
    let lib = nvml_mock::isolated_library(dir, &nvml_mock::machine_path("dgx-a100"), None)
        .context("the NVML stand-in (cargo build -p kubedev-nvml-mock)")?;
    out.push(Backend {
        name: "nvidia",
        config: format!("  nvidia:\n    libraryPath: {}\n", lib.display()),
        resource: "nvidia.com/gpu",
        node: "/dev/nvidia",
        _root: None,
        host: dir.join("nvidia-host"),
    });
    Ok(out)
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(bin: &Path, config: &Path) -> anyhow::Result<Daemon> {
    Ok(Daemon(
        Command::new(bin)
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .context("starting kubedev")?,
    ))
}

/// The steps one scenario passed, for the summary.
#[derive(Default)]
struct Record {
    steps: Vec<&'static str>,
}

impl Record {
    fn ok(&mut self, step: &'static str) {
        self.steps.push(step);
    }
}

async fn dra_scenario(bin: &Path, b: &Backend, dir: &Path, rec: &mut Record) -> anyhow::Result<()> {
    let root = dir.join(format!("dra-{}", b.name));
    std::fs::create_dir_all(&root)?;
    std::fs::create_dir_all(b.host.join("dev"))?;
    std::fs::write(
        root.join("boot_id"),
        "e2e00000-0000-4000-8000-000000000001\n",
    )?;
    let api = ApiServer::start().await?;
    api.write_kubeconfig(&root.join("kubeconfig"))?;
    api.put_raw(
        Resource::Nodes,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
    )?;
    // The first slice writes fail: the publisher must retry until they land.
    api.fail_next(
        Verb::Create,
        Resource::ResourceSlices,
        3,
        Fault::ServiceUnavailable,
    );
    let kubelet = DraKubelet::start(root.join("registry"))?;
    let config = root.join("kubedev.yaml");
    std::fs::write(
        &config,
        format!(
            "nodeName: {NODE}\nhostRoot: {host}\nstateDir: {r}/state\ndevicePlugin:\n  enabled: false\ndra:\n  enabled: true\n  driverName: {DRIVER}\n  kubeconfig: {r}/kubeconfig\n  pluginDir: {r}/plugins\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  bootIdPath: {r}/boot_id\nbackends:\n{}",
            b.config,
            host = b.host.display(),
            r = root.display()
        ),
    )?;
    let daemon = start(bin, &config)?;
    ensure!(
        kubelet
            .wait_until(WAIT, |k| k.drivers().contains_key(DRIVER))
            .await,
        "the DRA driver did not register: {:?}",
        kubelet.rejected()
    );
    rec.ok("registered");

    let deadline = Instant::now() + WAIT;
    let slices = loop {
        let s: Vec<_> = api
            .objects(Resource::ResourceSlices)
            .into_iter()
            .filter(|s| s["spec"]["driver"] == DRIVER && s["spec"]["devices"].is_array())
            .collect();
        if !s.is_empty() {
            break s;
        }
        ensure!(Instant::now() < deadline, "no ResourceSlice was published");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    rec.ok("published through API faults");

    let class = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "e2e"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}});
    let uid = "e2e00000-cla1-4000-8000-000000000001";
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "one", "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": "e2e"}}]}}});
    let scenario = json!({"node": {"name": NODE}, "deviceClasses": [class],
        "resourceSlices": slices, "claims": [claim]});
    let scenario = kubedev_allocator::Scenario::from_text(&scenario.to_string())?;
    let out =
        kubedev_allocator::simulate(&scenario, &kubedev_allocator::SimulateOptions::default());
    ensure!(out.allocatable, "the claim does not fit: {}", out.to_text());
    let allocation = serde_json::to_value(&out.claims[0].allocation)?;
    let mut stored = claim;
    stored["status"] = json!({"allocation": allocation});
    api.put_raw(Resource::ResourceClaims, stored)?;
    rec.ok("allocated");

    let id = ClaimId::new("default", "one", uid);
    let first = kubelet
        .prepare(DRIVER, std::slice::from_ref(&id))
        .await?
        .remove(uid)
        .context("no answer for the claim")?
        .map_err(anyhow::Error::msg)?;
    let cdi: Vec<PathBuf> = std::fs::read_dir(root.join("cdi"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    ensure!(cdi.len() == 1, "expected one CDI file, found {cdi:?}");
    let spec = std::fs::read_to_string(&cdi[0])?;
    ensure!(
        spec.contains(b.node),
        "the CDI spec lacks {}: {spec}",
        b.node
    );
    rec.ok("prepared, CDI checked");

    // kill -9 and a restart: the prepared claim survives, prepare answers the same.
    drop(daemon);
    let _daemon = start(bin, &config)?;
    let deadline = Instant::now() + WAIT;
    let again = loop {
        if let Ok(mut a) = kubelet.prepare(DRIVER, std::slice::from_ref(&id)).await
            && let Some(Ok(devs)) = a.remove(uid)
        {
            break devs;
        }
        ensure!(
            Instant::now() < deadline,
            "prepare after the restart did not answer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(
        again.len() == first.len()
            && again
                .iter()
                .zip(&first)
                .all(|(a, b)| a.device == b.device && a.cdi_device_ids == b.cdi_device_ids),
        "prepare after kill -9 answered differently: {first:?} vs {again:?}"
    );
    rec.ok("kill -9, same answer");

    let un = kubelet.unprepare(DRIVER, std::slice::from_ref(&id)).await?;
    ensure!(
        un.get(uid).is_some_and(|r| r.is_ok()),
        "unprepare failed: {un:?}"
    );
    ensure!(!cdi[0].exists(), "the CDI spec is still there");
    rec.ok("unprepared");
    kubelet.stop().await;
    api.shutdown().await;
    Ok(())
}

async fn dp_scenario(bin: &Path, b: &Backend, dir: &Path, rec: &mut Record) -> anyhow::Result<()> {
    let root = dir.join(format!("dp-{}", b.name));
    let dp = root.join("device-plugins");
    std::fs::create_dir_all(&dp)?;
    std::fs::create_dir_all(b.host.join("dev"))?;
    let config = root.join("kubedev.yaml");
    std::fs::write(
        &config,
        format!(
            "nodeName: {NODE}\nhostRoot: {host}\nstateDir: {r}/state\ndevicePlugin:\n  directory: {dp}\n  resources:\n    - name: {res}\nbackends:\n{}",
            b.config,
            host = b.host.display(),
            r = root.display(),
            dp = dp.display(),
            res = b.resource
        ),
    )?;
    let mut kubelet = KubeletEmulator::start(&dp).await?;
    let _daemon = start(bin, &config)?;
    let st = kubelet
        .wait_for(b.resource, WAIT, |r| r.connected && r.capacity > 0)
        .await
        .context("not registered")?;
    rec.ok("registered");
    let id = st.devices.keys().next().context("no device")?.clone();
    let a = kubelet.allocate(b.resource, &[&id]).await?;
    ensure!(
        a.devices.iter().any(|d| d.host_path.starts_with(b.node)),
        "Allocate lacks {}: {a:?}",
        b.node
    );
    rec.ok("allocated, edits checked");
    kubelet.restart().await?;
    let again = kubelet
        .wait_for(b.resource, WAIT, |r| {
            r.connected && r.capacity == st.capacity
        })
        .await
        .context("not re-registered after the kubelet restart")?;
    ensure!(
        again.devices.keys().eq(st.devices.keys()),
        "other devices after the restart"
    );
    rec.ok("kubelet restart, re-registered");
    kubelet.stop().await;
    Ok(())
}

/// Runs every scenario and prints the table; fails when one failed.
pub(crate) fn e2e(root: &Path) -> anyhow::Result<()> {
    crate::ci::run(
        root,
        "cargo",
        &["build", "--quiet", "-p", "kubedev", "--bin", "kubedev"],
    )?;
    crate::ci::run(
        root,
        "cargo",
        &["build", "--quiet", "-p", "kubedev-nvml-mock"],
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("debug").join("kubedev");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::Builder::new().prefix("kubedev-e2e").tempdir()?;
    let list = backends(dir.path())?;
    let mut rows = Vec::new();
    for b in &list {
        for mode in ["device-plugin", "dra"] {
            let started = Instant::now();
            let mut rec = Record::default();
            let result = rt.block_on(async {
                match mode {
                    "dra" => dra_scenario(&bin, b, dir.path(), &mut rec).await,
                    _ => dp_scenario(&bin, b, dir.path(), &mut rec).await,
                }
            });
            let took = started.elapsed();
            let outcome = match &result {
                Ok(()) => "pass".to_string(),
                Err(e) => format!("FAIL: {e:#}"),
            };
            eprintln!("e2e {} / {mode}: {outcome}", b.name);
            rows.push((
                b.name,
                mode,
                rec.steps.join(" → "),
                took,
                result.is_ok(),
                outcome,
            ));
        }
    }
    println!("\n| backend | mode | steps passed | time | result |\n|---|---|---|---|---|");
    for (name, mode, steps, took, _, outcome) in &rows {
        println!("| {name} | {mode} | {steps} | {took:.1?} | {outcome} |");
    }
    let failed = rows.iter().filter(|r| !r.4).count();
    if failed > 0 {
        bail!("{failed} of {} scenarios failed", rows.len());
    }
    println!("\nall {} scenarios passed", rows.len());
    Ok(())
}
