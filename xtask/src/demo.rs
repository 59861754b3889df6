//! `cargo xtask demo`: the kubedev story against the emulated kubelet and API server, in under a
//! minute.
//!
//! It builds the daemon, starts the kubelet emulator (both APIs) and the API-server emulator in a
//! temporary directory, runs `kubedev run` with the static example backend in both modes, and
//! walks through registration, capacity, preferred allocation, Allocate, a device failing and
//! recovering, a kubelet restart, ResourceSlices, an allocation by the allocator, DRA prepare with
//! its CDI spec, unprepare, and a clean stop; then the hardware backends (NVIDIA GPUs through
//! the NVML stand-in, /dev/kvm slots), an Xid error and its recovery, and a live configuration
//! change.
//!
//! The steps live in `device_plugin`, `dra` and `hardware`; this file holds the setup and the
//! order they run in.

mod device_plugin;
mod dra;
mod hardware;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use kubedev_testkit::apiserver::{ApiServer, Resource};
use kubedev_testkit::kubelet::{DraKubelet, KubeletEmulator, ResourceState};
use serde_json::json;

use device_plugin::{
    allocate_gpus, fail_and_recover, restart_kubelet, show_capacity, start_daemon, stop_daemon,
};
use dra::{dra_health, dra_story};
use hardware::hardware_story;

const GPU: &str = "example.com/gpu";
const WAIT: Duration = Duration::from_secs(15);
const DRIVER: &str = "nic.example.com";
const NODE: &str = "demo-node";

/// The demo's configuration: four GPUs on two NUMA nodes for the device plugin, two NICs for
/// DRA, each with a presence file in `health_dir`.
fn config(dp_dir: &Path, health_dir: &Path, dra_root: &Path) -> String {
    let gpu = |i: u32, numa: u32| {
        format!(
            r#"      - name: gpu-{i}
        attributes:
          type: {{string: gpu}}
          model: {{string: "Example X1"}}
          index: {{int: {i}}}
        capacity:
          memory: 16Gi
        numaNode: {numa}
        deviceNodes: ["/dev/null"]
        env: {{EXAMPLE_DRIVER_CAPS: "compute,video"}}
        presencePath: {health}/gpu-{i}
"#,
            health = health_dir.display()
        )
    };
    let nic = |i: u32| {
        format!(
            r#"      - name: nic-{i}
        attributes:
          type: {{string: nic}}
          speed: {{int: 100}}
        numaNode: 0
        deviceNodes: ["/dev/null"]
        env: {{NIC_MODE: rdma}}
        presencePath: {health}/nic-{i}
"#,
            health = health_dir.display()
        )
    };
    format!(
        r#"# kubedev demo configuration: four GPUs on two NUMA nodes and two NICs.
# The GPUs are served as a device-plugin resource, the NICs through DRA.
nodeName: {NODE}
dra:
  enabled: true
  driverName: {DRIVER}
  kubeconfig: {dra}/kubeconfig
  pluginDir: {dra}/plugins/{DRIVER}
  registryDir: {dra}/plugins_registry
  cdiDir: {dra}/cdi
  bootIdPath: {dra}/boot_id
devicePlugin:
  directory: {dp}
  resources:
    - name: {GPU}
      selector:
        attributes:
          type: {{string: gpu}}
backends:
  static:
    pool: demo-node
    pollIntervalMs: 50
    devices:
{g0}{g1}{g2}{g3}{n0}{n1}"#,
        dp = dp_dir.display(),
        dra = dra_root.display(),
        g0 = gpu(0, 0),
        g1 = gpu(1, 0),
        g2 = gpu(2, 1),
        g3 = gpu(3, 1),
        n0 = nic(0),
        n1 = nic(1),
    )
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn say(step: &mut u32, text: &str) {
    *step += 1;
    println!("\n[{step}] {text}");
}

fn show(r: &ResourceState) -> String {
    let devs: Vec<String> = r
        .devices
        .iter()
        .map(|(id, d)| format!("{id}({}, numa {:?})", d.health, d.numa_nodes))
        .collect();
    format!(
        "capacity {}, allocatable {} — {}",
        r.capacity,
        r.allocatable,
        devs.join(", ")
    )
}

/// Runs the demo.
pub(crate) fn demo(root: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let bin = crate::commands::build_daemon(root)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(story(&bin))?;
    println!("\ndemo finished in {:.1?}", started.elapsed());
    Ok(())
}

/// The demo's working directory and emulators: device-plugin and health directories, the
/// DRA root with its kubeconfig, the API-server emulator with the node, the DRA kubelet
/// emulator, and the daemon's configuration file. Fields drop in the reverse order of
/// creation, the directory last.
struct Setup {
    dra_kubelet: DraKubelet,
    api: ApiServer,
    config_path: PathBuf,
    dra_root: PathBuf,
    health_dir: PathBuf,
    dp_dir: PathBuf,
    tmp: tempfile::TempDir,
}

impl Setup {
    /// Creates the directories (a presence file per GPU, a boot id), starts the API-server
    /// and DRA kubelet emulators and writes the configuration.
    async fn new() -> anyhow::Result<Setup> {
        let tmp = tempfile::Builder::new().prefix("kubedev-demo").tempdir()?;
        let dp_dir = tmp.path().join("device-plugins");
        let health_dir = tmp.path().join("health");
        std::fs::create_dir_all(&dp_dir)?;
        std::fs::create_dir_all(&health_dir)?;
        for i in 0..4 {
            std::fs::write(health_dir.join(format!("gpu-{i}")), "")?;
        }
        for i in 0..2 {
            std::fs::write(health_dir.join(format!("nic-{i}")), "")?;
        }
        let dra_root = tmp.path().join("dra");
        std::fs::create_dir_all(&dra_root)?;
        std::fs::write(
            dra_root.join("boot_id"),
            "d3m0b007-0000-4000-8000-000000000001\n",
        )?;
        let api = ApiServer::start().await?;
        api.write_kubeconfig(&dra_root.join("kubeconfig"))?;
        api.put_raw(
            Resource::Nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
        )?;
        let dra_kubelet = DraKubelet::start(dra_root.join("plugins_registry"))?;
        let config_path = tmp.path().join("kubedev.yaml");
        std::fs::write(&config_path, config(&dp_dir, &health_dir, &dra_root))?;
        Ok(Setup {
            dra_kubelet,
            api,
            config_path,
            dra_root,
            health_dir,
            dp_dir,
            tmp,
        })
    }
}

/// Runs the story: the device-plugin steps, the DRA steps, a clean stop, then the hardware
/// backends.
async fn story(bin: &Path) -> anyhow::Result<()> {
    let setup = Setup::new().await?;
    let mut step = 0;

    println!(
        "kubedev demo — one daemon, both kubelet APIs, against an emulated kubelet and API server"
    );
    println!("working directory: {}", setup.tmp.path().display());

    say(
        &mut step,
        "The kubelet emulator listens on kubelet.sock in the device-plugin directory.",
    );
    let mut kubelet = KubeletEmulator::start(&setup.dp_dir).await?;
    println!("    {}", kubelet.socket_path().display());

    let mut daemon = start_daemon(&mut step, bin, &setup.config_path, &kubelet).await?;
    show_capacity(&mut step, &kubelet).await?;
    allocate_gpus(&mut step, &kubelet).await?;
    fail_and_recover(&mut step, &kubelet, &setup.health_dir).await?;
    restart_kubelet(&mut step, &mut kubelet).await?;

    dra_story(&mut step, &setup.api, &setup.dra_kubelet, &setup.dra_root).await?;
    dra_health(&mut step, &setup.api, &setup.health_dir).await?;

    stop_daemon(&mut step, &mut daemon, &setup).await?;
    kubelet.stop().await;
    let Setup {
        dra_kubelet,
        api,
        tmp,
        ..
    } = setup;
    dra_kubelet.stop().await;
    api.shutdown().await;
    hardware_story(&mut step, bin, tmp.path()).await
}
