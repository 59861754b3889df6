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

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use kubedev_testkit::apiserver::{ApiServer, Resource};
use kubedev_testkit::kubelet::{ClaimId, DraKubelet, KubeletEmulator, ResourceState};
use serde_json::json;

const GPU: &str = "example.com/gpu";
const WAIT: Duration = Duration::from_secs(15);
const DRIVER: &str = "nic.example.com";
const NODE: &str = "demo-node";

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
    let bin = crate::ci::build_daemon(root)?;
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

/// Starts `kubedev run` with the static backend and waits until it registers its resource.
async fn start_daemon(
    step: &mut u32,
    bin: &Path,
    config_path: &Path,
    kubelet: &KubeletEmulator,
) -> anyhow::Result<Daemon> {
    say(
        step,
        "kubedev starts with the static backend: 4 GPUs for the device plugin, 2 NICs for DRA.",
    );
    let t0 = Instant::now();
    let child = Command::new(bin)
        .args(["run", "--config"])
        .arg(config_path)
        .env(
            "RUST_LOG",
            std::env::var("KUBEDEV_DEMO_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .spawn()
        .context("starting kubedev")?;
    let daemon = Daemon(child);
    ensure!(
        kubelet.wait_registrations(1, WAIT).await,
        "kubedev did not register its resource: {:?}",
        kubelet.registrations()
    );
    println!("    registered in {:.0?}:", t0.elapsed());
    for r in kubelet.registrations() {
        println!(
            "    Register(version={}, resource={}, endpoint={})",
            r.version, r.resource, r.endpoint
        );
    }
    Ok(daemon)
}

/// Waits until the kubelet knows the capacity and allocatable of each resource.
async fn show_capacity(step: &mut u32, kubelet: &KubeletEmulator) -> anyhow::Result<()> {
    say(
        step,
        "The kubelet opened ListAndWatch and now knows capacity and allocatable.",
    );
    for res in [GPU] {
        let st = kubelet
            .wait_for(res, WAIT, |r| r.connected && r.capacity > 0)
            .await
            .with_context(|| format!("no devices for {res}"))?;
        println!("    {res}: {}", show(&st));
    }
    Ok(())
}

/// GetPreferredAllocation packs 2 GPUs on one NUMA node, Allocate returns their container
/// edits, and an unknown device is refused.
async fn allocate_gpus(step: &mut u32, kubelet: &KubeletEmulator) -> anyhow::Result<()> {
    say(
        step,
        "A pod asks for 2 GPUs: GetPreferredAllocation packs them on one NUMA node.",
    );
    let all: Vec<String> = (0..4).map(|i| format!("gpu-{i}")).collect();
    let preferred = kubelet
        .preferred_allocation(GPU, &all, &["gpu-2".to_string()], 2)
        .await
        .context("GetPreferredAllocation")?;
    println!("    available {all:?}, must include [\"gpu-2\"] -> preferred {preferred:?}");
    ensure!(
        preferred == ["gpu-2", "gpu-3"],
        "unexpected preference {preferred:?}"
    );

    say(
        step,
        "Allocate returns the container edits for those devices.",
    );
    let ids: Vec<&str> = preferred.iter().map(String::as_str).collect();
    let resp = kubelet.allocate(GPU, &ids).await.context("Allocate")?;
    for (k, v) in &resp.envs {
        println!("    env    {k}={v}");
    }
    for d in &resp.devices {
        println!(
            "    device {} -> {} ({})",
            d.host_path, d.container_path, d.permissions
        );
    }
    ensure!(resp.envs.get("STATIC_VISIBLE_DEVICES").map(String::as_str) == Some("gpu-2,gpu-3"));
    let err = kubelet.allocate(GPU, &["gpu-7"]).await.err();
    println!(
        "    Allocate([gpu-7]) -> {}",
        err.as_ref()
            .map(|e| format!("{:?}: {}", e.code(), e.message()))
            .unwrap_or_else(|| "accepted?!".into())
    );
    ensure!(err.is_some(), "unknown device was accepted");
    Ok(())
}

/// gpu-1's presence file disappears and comes back: the kubelet sees it Unhealthy, then
/// healthy again.
async fn fail_and_recover(
    step: &mut u32,
    kubelet: &KubeletEmulator,
    health_dir: &Path,
) -> anyhow::Result<()> {
    say(
        step,
        "gpu-1 fails (its presence file disappears): the kubelet sees it Unhealthy.",
    );
    std::fs::remove_file(health_dir.join("gpu-1"))?;
    let st = kubelet
        .wait_for(GPU, WAIT, |r| r.allocatable == 3)
        .await
        .context("the kubelet never saw gpu-1 fail")?;
    println!("    {GPU}: {}", show(&st));

    say(step, "gpu-1 comes back: health recovers without a restart.");
    std::fs::write(health_dir.join("gpu-1"), "")?;
    let st = kubelet
        .wait_for(GPU, WAIT, |r| r.allocatable == 4)
        .await
        .context("gpu-1 never recovered")?;
    println!("    {GPU}: {}", show(&st));
    Ok(())
}

/// The kubelet restarts and wipes its sockets; kubedev registers again and serves all 4 GPUs.
async fn restart_kubelet(step: &mut u32, kubelet: &mut KubeletEmulator) -> anyhow::Result<()> {
    say(
        step,
        "The kubelet restarts and wipes every socket; kubedev serves and registers again.",
    );
    let since = kubelet.uptime();
    let t = Instant::now();
    kubelet.restart().await?;
    ensure!(
        kubelet.wait_registered_since(GPU, since, WAIT).await,
        "kubedev did not re-register after the restart: {:?}",
        kubelet.registrations()
    );
    println!("    re-registered {:.0?} after the restart", t.elapsed());
    let st = kubelet
        .wait_for(GPU, WAIT, |r| r.connected && r.capacity == 4)
        .await
        .context("no devices after the restart")?;
    println!("    {GPU}: {}", show(&st));
    Ok(())
}

/// SIGTERM: the daemon exits cleanly and leaves no device-plugin or registration socket.
async fn stop_daemon(step: &mut u32, daemon: &mut Daemon, setup: &Setup) -> anyhow::Result<()> {
    say(
        step,
        "SIGTERM: kubedev stops serving and removes its sockets.",
    );
    let pid = rustix::process::Pid::from_raw(i32::try_from(daemon.0.id())?)
        .context("daemon has no pid")?;
    rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = daemon.0.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            bail!("kubedev did not stop within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    ensure!(status.success(), "kubedev exited with {status}");
    let left: Vec<String> = std::fs::read_dir(&setup.dp_dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "kubelet.sock")
        .collect();
    let reg_left: Vec<_> = std::fs::read_dir(setup.dra_root.join("plugins_registry"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    ensure!(
        reg_left.is_empty(),
        "registration socket left behind: {reg_left:?}"
    );
    println!("    kubedev exited ({status}); sockets left behind: {left:?}");
    ensure!(left.is_empty(), "sockets left behind: {left:?}");
    Ok(())
}

/// The hardware backends: NVIDIA GPUs of a DGX A100 (through the NVML stand-in library) and
/// `/dev/kvm` slots of a host root, in one device-plugin daemon; an Xid error and its recovery;
/// and a resource added to the configuration file while the daemon runs.
async fn hardware_story(step: &mut u32, bin: &Path, tmp: &Path) -> anyhow::Result<()> {
    let dir = tmp.join("hardware");
    let dp = dir.join("device-plugins");
    let host = dir.join("host");
    std::fs::create_dir_all(&dp)?;
    std::fs::create_dir_all(host.join("dev"))?;
    std::fs::write(host.join("dev/kvm"), "")?;
    let control = dir.join("nvml-control.jsonl");
    std::fs::write(&control, "")?;
    let lib =
        nvml_mock::isolated_library(&dir, &nvml_mock::machine_path("dgx-a100"), Some(&control))
            .context("the NVML stand-in library (cargo build -p kubedev-nvml-mock)")?;
    let config = |kvm: bool| {
        let kvm_resource = if kvm {
            "    - name: devices.kubevirt.io/kvm\n      selector:\n        cel: '\"name\" in device.attributes[\"host.kubedev.io\"] && device.attributes[\"host.kubedev.io\"].name == \"kvm\"'\n"
        } else {
            ""
        };
        format!(
            "nodeName: {NODE}\nhostRoot: {host}\nstateDir: {d}/state\ndevicePlugin:\n  directory: {dp}\n  resources:\n    - name: nvidia.com/gpu\n      selector:\n        cel: '\"type\" in device.attributes[\"gpu.nvidia.com\"] && device.attributes[\"gpu.nvidia.com\"].type == \"gpu\"'\n{kvm_resource}backends:\n  nvidia:\n    libraryPath: {lib}\n    healthRecheckSeconds: 2\n    healthPollMillis: 200\n  host:\n    characterDevices:\n      - {{name: kvm, path: /dev/kvm, slots: 4}}\n",
            host = host.display(),
            d = dir.display(),
            dp = dp.display(),
            lib = lib.display(),
        )
    };
    let config_path = dir.join("kubedev.yaml");
    std::fs::write(&config_path, config(false))?;

    say(
        step,
        "Hardware backends: a DGX A100 (through the NVML stand-in library) and /dev/kvm slots. \
         `kubedev discover` shows what they find:",
    );
    let out = Command::new(bin)
        .args(["discover", "--config"])
        .arg(&config_path)
        .env("RUST_LOG", "error")
        .output()?;
    ensure!(
        out.status.success(),
        "discover failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // The attribute column is long; the first columns tell the story.
        let short: String = line.chars().take(96).collect();
        println!("    {short}");
    }

    say(
        step,
        "kubedev serves the GPUs as nvidia.com/gpu (a CEL selector picks them).",
    );
    let kubelet = KubeletEmulator::start(&dp).await?;
    let child = Command::new(bin)
        .args(["run", "--config"])
        .arg(&config_path)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .context("starting kubedev")?;
    let _daemon = Daemon(child);
    let st = kubelet
        .wait_for("nvidia.com/gpu", WAIT, |r| r.connected && r.capacity == 8)
        .await
        .context("the GPUs were not registered")?;
    println!("    nvidia.com/gpu: {}", show(&st));
    let a = kubelet.allocate("nvidia.com/gpu", &["gpu-5"]).await?;
    println!(
        "    Allocate gpu-5 → NVIDIA_VISIBLE_DEVICES={}, devices {:?}",
        a.envs
            .get("NVIDIA_VISIBLE_DEVICES")
            .cloned()
            .unwrap_or_default(),
        a.devices
            .iter()
            .map(|d| d.host_path.as_str())
            .collect::<Vec<_>>()
    );

    say(
        step,
        "GPU 5 reports Xid 79 (fallen off the bus): Unhealthy, then it recovers.",
    );
    {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new().append(true).open(&control)?;
        writeln!(f, "{{\"xid\": 79, \"gpu\": 5}}")?;
    }
    let health = |s: &'static str| {
        move |r: &ResourceState| r.devices.get("gpu-5").is_some_and(|d| d.health == s)
    };
    kubelet
        .wait_for("nvidia.com/gpu", WAIT, health("Unhealthy"))
        .await
        .context("gpu-5 never became Unhealthy")?;
    println!("    gpu-5 Unhealthy (allocatable 7)");
    kubelet
        .wait_for("nvidia.com/gpu", WAIT, health("Healthy"))
        .await
        .context("gpu-5 never recovered")?;
    println!("    gpu-5 Healthy again once NVML answers and no new Xid arrives");

    say(
        step,
        "Live configuration: a resource for the kvm slots is added to the file; the GPU server \
         keeps running.",
    );
    let gpu_endpoint = kubelet.resource("nvidia.com/gpu").map(|r| r.endpoint);
    std::fs::write(&config_path, config(true))?;
    let st = kubelet
        .wait_for("devices.kubevirt.io/kvm", WAIT, |r| {
            r.connected && r.capacity == 4
        })
        .await
        .context("the kvm resource did not start")?;
    println!("    devices.kubevirt.io/kvm: {}", show(&st));
    ensure!(
        kubelet.resource("nvidia.com/gpu").map(|r| r.endpoint) == gpu_endpoint,
        "the GPU server was restarted"
    );
    println!("    nvidia.com/gpu still on its first socket");
    kubelet.stop().await;
    Ok(())
}

async fn dra_story(
    step: &mut u32,
    api: &ApiServer,
    kubelet: &DraKubelet,
    root: &Path,
) -> anyhow::Result<()> {
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

    say(
        step,
        "DRA: a ResourceClaim asks for one 100G NIC; the allocator picks it as the scheduler would.",
    );
    let class = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "nic"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}});
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "fast-nic", "namespace": "default", "uid": "7f0c9a52-demo-4e1b-9d2a-000000000001"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic",
            "selectors": [{"cel": {"expression": format!("device.attributes['{DRIVER}'].speed >= 100")}}]}}]}}});
    let scenario = json!({"node": {"name": NODE}, "deviceClasses": [class],
        "resourceSlices": slices, "claims": [claim]});
    let scenario = kubedev_allocator::Scenario::from_text(&scenario.to_string())?;
    let out =
        kubedev_allocator::simulate(&scenario, &kubedev_allocator::SimulateOptions::default());
    ensure!(out.allocatable, "the claim does not fit: {}", out.to_text());
    let allocation = serde_json::to_value(&out.claims[0].allocation)?;
    println!("    allocation: {}", allocation["devices"]["results"]);
    let mut stored = claim;
    stored["status"] = json!({"allocation": allocation});
    api.put_raw(Resource::ResourceClaims, stored)?;

    say(
        step,
        "DRA: the kubelet prepares the claim; kubedev writes its CDI spec.",
    );
    let id = ClaimId::new(
        "default",
        "fast-nic",
        "7f0c9a52-demo-4e1b-9d2a-000000000001",
    );
    let answer = kubelet.prepare(DRIVER, std::slice::from_ref(&id)).await?;
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
    ensure!(!cdi[0].exists(), "CDI file still there");
    println!("    {} removed", cdi[0].display());
    let status = claim_status(api, |d| d.as_array().is_none_or(|a| a.is_empty())).await?;
    println!("    status.devices: {status}");
    Ok(())
}

/// The demo claim's `status.devices` once `done` holds for it.
async fn claim_status(
    api: &ApiServer,
    done: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<serde_json::Value> {
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
    done: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<serde_json::Value> {
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
async fn dra_health(step: &mut u32, api: &ApiServer, health_dir: &Path) -> anyhow::Result<()> {
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
    slice_taints(api, "nic-1", serde_json::Value::is_null).await?;
    println!("    no taints ({:.0?} later)", t.elapsed());
    Ok(())
}
